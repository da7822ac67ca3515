/**
 * The sidebar's scheduler controls (mode and TQ), built once and kept by the panel, so that a
 * redraw never steals focus from a half-typed TQ; shown only to users the server lets write.
 */

import { Dialog, showDialog } from '@jupyterlab/apputils';
import { TranslationBundle } from '@jupyterlab/translation';

import { KiwiRequestError } from './api';
import { el } from './dom';
import { describeMode } from './format';
import type { KiwiModel } from './model';
import { ISchedulerChange, SchedulerMode } from './tokens';

const MODES: SchedulerMode[] = ['on', 'off', 'auto'];

export class SchedulerControls {
  constructor(
    model: KiwiModel,
    trans: TranslationBundle,
    changeScheduler: (change: ISchedulerChange) => Promise<void>
  ) {
    this._model = model;
    this._trans = trans;
    this._changeScheduler = changeScheduler;
    this.node = this._build();
  }

  /** The controls' section, for the panel to place and hide. */
  readonly node: HTMLElement;

  private _build(): HTMLElement {
    const mode = el('select', 'jp-Kiwi-modeSelect jp-mod-styled');
    for (const value of MODES) {
      const option = el('option', '', value.toUpperCase());
      option.value = value;
      mode.append(option);
    }
    // The mode is the node's, every notebook's on it: nothing is sent until Set, and Set asks
    // first (a mistaken OFF would let every kernel on the node at the GPU at once).
    const setMode = el('button', 'jp-Kiwi-modeButton jp-mod-styled jp-mod-accept', this._trans.__('Set'));
    setMode.addEventListener('click', () => void this._confirmMode(mode.value as SchedulerMode));

    const tq = el('input', 'jp-Kiwi-tqInput jp-mod-styled');
    tq.type = 'number';
    tq.min = '0.01';
    tq.step = 'any';
    const setTq = el('button', 'jp-Kiwi-tqButton jp-mod-styled jp-mod-accept', this._trans.__('Set'));
    const submitTq = () => {
      const seconds = Number(tq.value);
      if (!(seconds > 0)) {
        this._message.textContent = this._trans.__('The time quantum must be a positive number of seconds.');
        return;
      }
      void this._apply({ tq: seconds });
    };
    setTq.addEventListener('click', submitTq);
    tq.addEventListener('keydown', event => {
      if (event.key === 'Enter') {
        submitTq();
      }
    });

    this._modeSelect = mode;
    this._tqInput = tq;
    this._message = el('p', 'jp-Kiwi-controlMessage');
    return el(
      'section',
      'jp-Kiwi-controls',
      el('div', 'jp-Kiwi-field', el('span', 'jp-Kiwi-label', this._trans.__('Set mode')), mode, setMode),
      el('div', 'jp-Kiwi-field', el('span', 'jp-Kiwi-label', this._trans.__('Set TQ (s)')), tq, setTq),
      this._message
    );
  }

  /** Show the daemon's values in the controls, unless the user is editing them. */
  sync(): void {
    const active = document.activeElement;
    const mode = this._model.mode;
    if (mode !== null && active !== this._modeSelect && !this._pending) {
      this._modeSelect.value = mode;
    }
    const tq = this._model.tq;
    if (tq !== null && active !== this._tqInput) {
      this._tqInput.value = String(tq);
    }
  }

  /** Ask before changing the mode of every notebook on the node; apply it if confirmed. */
  private async _confirmMode(mode: SchedulerMode): Promise<void> {
    if (mode === this._model.mode) {
      return;
    }
    const clients = this._model.clientCount;
    const result = await showDialog({
      title: this._trans.__('Turn the Kiwi scheduler %1?', mode.toUpperCase()),
      body: this._trans.__(
        'This changes the scheduler for every notebook on this node (%1 registered now), not only yours. %2',
        clients,
        describeMode(mode, this._trans)
      ),
      buttons: [Dialog.cancelButton(), Dialog.okButton({ label: this._trans.__('Turn %1', mode.toUpperCase()) })]
    });
    if (result.button.accept) {
      await this._apply({ mode });
    } else {
      this.sync();
    }
  }

  private async _apply(change: ISchedulerChange): Promise<void> {
    this._pending = true;
    this._message.textContent = '';
    try {
      await this._changeScheduler(change);
    } catch (error) {
      const status = error instanceof KiwiRequestError ? error.status : 0;
      this._message.textContent =
        status === 403
          ? this._trans.__('Not allowed: %1', (error as Error).message)
          : this._trans.__('The change failed: %1', (error as Error).message);
    } finally {
      this._pending = false;
      this.sync();
    }
  }

  private _model: KiwiModel;
  private _trans: TranslationBundle;
  private _changeScheduler: (change: ISchedulerChange) => Promise<void>;
  private _modeSelect!: HTMLSelectElement;
  private _tqInput!: HTMLInputElement;
  private _message!: HTMLElement;
  private _pending = false;
}
