/**
 * Keeps the model fresh with a long-poll of `kiwi/api/status?after=TAG`.
 *
 * The server answers as soon as the daemon says the status document changed (docs/lab.md), so a
 * grant shows without waiting for an interval; the next request goes out at once and waits for
 * the next change. Where the server cannot push (the daemon is unreachable or older), it answers
 * at once with `pushed: false` and the poller asks again after `refreshRate` ms, as a plain poll.
 * Failed requests back off, doubling up to 10 s, and snap back on the next success. A hidden tab
 * stops asking until it is shown again. Plain requests keep the server's authentication and pass
 * every proxy (JupyterHub, Binder), which a websocket would have to earn.
 *
 * No JupyterLab import here: the request and the clock are passed in, so Jest drives it.
 */

import type { KiwiModel } from './model';
import type { IStatusDocument } from './tokens';

/** Longest wait between two requests while the server keeps failing. */
export const MAX_BACKOFF_MS = 10_000;

export interface IStatusPollerOptions {
  /** The long-poll request (api.waitForStatus). */
  waitForStatus: (after: string, signal: AbortSignal) => Promise<IStatusDocument>;
  /** A plain status request (api.fetchStatus), for `refresh`. */
  fetchStatus: () => Promise<IStatusDocument>;
  /** Resolves after `ms` milliseconds, or early when `signal` aborts. */
  sleep?: (ms: number, signal: AbortSignal) => Promise<void>;
  /** Resolves when the page is visible (at once where there is no page). */
  whenVisible?: (signal: AbortSignal) => Promise<void>;
  /** Seconds, for the model's countdowns. */
  now?: () => number;
}

export class StatusPoller {
  constructor(
    readonly model: KiwiModel,
    refreshRate: number,
    options: IStatusPollerOptions
  ) {
    this._refreshRate = refreshRate;
    this._options = options;
    this._sleep = options.sleep ?? sleep;
    this._whenVisible = options.whenVisible ?? whenVisible;
    this._now = options.now ?? (() => Date.now() / 1000);
    this._done = this._run();
  }

  /** The fallback interval (milliseconds, from the settings) where the server cannot push. */
  set refreshRate(interval: number) {
    this._refreshRate = interval;
  }

  /** Ask now with a plain request, e.g. from the command palette; the long-poll goes on. */
  async refresh(): Promise<void> {
    try {
      this.model.update(await this._options.fetchStatus(), this._now());
    } catch (error) {
      this.model.fail(describe(error), this._now());
    }
  }

  /** Resolves when the loop has stopped, after `dispose`. */
  get stopped(): Promise<void> {
    return this._done;
  }

  dispose(): void {
    this._abort.abort();
  }

  private async _run(): Promise<void> {
    const signal = this._abort.signal;
    let tag = '';
    let backoff = 0;
    while (!signal.aborted) {
      await this._whenVisible(signal);
      if (signal.aborted) {
        return;
      }
      let document: IStatusDocument;
      try {
        document = await this._options.waitForStatus(tag, signal);
      } catch (error) {
        if (signal.aborted) {
          return;
        }
        this.model.fail(describe(error), this._now());
        backoff = Math.min(MAX_BACKOFF_MS, Math.max(this._refreshRate, backoff * 2));
        await this._sleep(backoff, signal);
        continue;
      }
      backoff = 0;
      this.model.update(document, this._now());
      if (document.pushed) {
        tag = document.etag ?? '';
      } else {
        tag = '';
        await this._sleep(this._refreshRate, signal);
      }
    }
  }

  private _refreshRate: number;
  private _options: IStatusPollerOptions;
  private _sleep: (ms: number, signal: AbortSignal) => Promise<void>;
  private _whenVisible: (signal: AbortSignal) => Promise<void>;
  private _now: () => number;
  private _abort = new AbortController();
  private _done: Promise<void>;
}

function describe(error: unknown): string {
  return String((error as Error)?.message ?? error);
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise(resolve => {
    const timer = setTimeout(done, ms);
    signal.addEventListener('abort', done, { once: true });
    function done(): void {
      clearTimeout(timer);
      signal.removeEventListener('abort', done);
      resolve();
    }
  });
}

function whenVisible(signal: AbortSignal): Promise<void> {
  if (typeof document === 'undefined' || document.visibilityState !== 'hidden') {
    return Promise.resolve();
  }
  return new Promise(resolve => {
    const done = (): void => {
      if (document.visibilityState === 'hidden' && !signal.aborted) {
        return;
      }
      document.removeEventListener('visibilitychange', done);
      signal.removeEventListener('abort', done);
      resolve();
    };
    document.addEventListener('visibilitychange', done);
    signal.addEventListener('abort', done, { once: true });
  });
}
