/** The status bar item: where this notebook's kernel stands ("GPU: holding", "GPU: waiting #2"). */

import { TranslationBundle } from '@jupyterlab/translation';
import { Widget } from '@lumino/widgets';

import { describeStanding } from './format';
import { KiwiModel } from './model';

export class KiwiStatusItem extends Widget {
  constructor(
    private readonly _model: KiwiModel,
    private readonly _trans: TranslationBundle,
    onClick: () => void
  ) {
    super();
    this.addClass('jp-Kiwi-statusItem');
    this.node.title = this._trans.__('Kiwi GPU: open the panel');
    this.node.addEventListener('click', onClick);
    this._model.changed.connect(this._render, this);
    this._render();
  }

  dispose(): void {
    this._model.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _render(): void {
    const standing = this._model.standing();
    this.node.textContent = describeStanding(standing, this._trans);
    this.node.dataset.standing = standing.kind;
  }
}
