/**
 * Keeps the model fresh by polling `kiwi/api/status`.
 *
 * Polling rather than a websocket (docs/lab.md says more): the daemon pushes nothing to an
 * observer, so the server would poll it anyway; plain requests reuse the server's authentication
 * with nothing to get wrong and pass every proxy (JupyterHub, Binder). Lumino's Poll gives the
 * backoff: when requests fail the interval grows up to `max`, and it snaps back on success.
 */

import { Poll } from '@lumino/polling';

import { fetchStatus } from './api';
import { KiwiModel } from './model';

/** Longest wait between two requests while the server keeps failing. */
const MAX_BACKOFF_MS = 10_000;

export class StatusPoller {
  constructor(
    readonly model: KiwiModel,
    refreshRate: number
  ) {
    this._poll = new Poll({
      auto: true,
      factory: () => this._tick(),
      frequency: { interval: refreshRate, backoff: true, max: MAX_BACKOFF_MS },
      name: 'kiwi-jupyter:status',
      standby: 'when-hidden'
    });
  }

  /** Change the refresh rate (milliseconds) from the settings. */
  set refreshRate(interval: number) {
    this._poll.frequency = { ...this._poll.frequency, interval };
  }

  /** Ask now, e.g. right after a change of mode, instead of waiting for the next tick. */
  refresh(): Promise<void> {
    return this._poll.refresh();
  }

  dispose(): void {
    this._poll.dispose();
  }

  private async _tick(): Promise<void> {
    try {
      const document = await fetchStatus();
      this.model.update(document, Date.now() / 1000);
    } catch (error) {
      this.model.fail(String((error as Error).message ?? error), Date.now() / 1000);
      // Rejecting makes the Poll back off; it resets to the interval after the next success.
      throw error;
    }
  }

  private _poll: Poll;
}
