/**
 * The status bar item: where this notebook's kernel stands ("GPU: holding", "GPU: waiting #2"),
 * and otherwise (a Launcher, a terminal, an idle notebook in focus) who holds the GPU and how many
 * wait: the same story as the panel.
 */

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
    const glance = this._model.glance();
    this.node.textContent = describeStanding(standing, this._trans, glance);
    this.node.dataset.standing = standing.kind;
    this.node.dataset.held = String(glance.holders.length > 0);
    this.node.title =
      glance.holders.length > 0
        ? this._trans.__('Kiwi GPU: held by %1; click to open the panel', glance.holders.join(', '))
        : this._trans.__('Kiwi GPU: open the panel');
  }
}
