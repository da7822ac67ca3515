/**
 * Restore on intent from the panel's side: a notebook (or console) brought to the front tells the
 * server, which hints the daemon to start bringing its kernel's memory back from disk (issue 42).
 * A user flipping tabs sends at most one hint a `FRONT_HINT_MS` per kernel; the server holds to
 * the same (kiwi_jupyter/server/intents.py) for any other client.
 */

/** Least milliseconds between two front hints for one kernel. */
export const FRONT_HINT_MS = 1000;

/** Kernels whose last hint is remembered at most; the oldest are forgotten first. */
const REMEMBERED = 256;

export class FrontHints {
  constructor(
    private readonly _send: (kernelId: string) => Promise<unknown>,
    private readonly _now: () => number = Date.now,
    private readonly _intervalMs: number = FRONT_HINT_MS
  ) {}

  /** The kernel of the widget now at the front; null (no kernel) sends nothing. */
  front(kernelId: string | null): boolean {
    if (kernelId === null) {
      return false;
    }
    const now = this._now();
    const last = this._last.get(kernelId);
    if (last !== undefined && now - last < this._intervalMs) {
      return false;
    }
    this._last.delete(kernelId);
    this._last.set(kernelId, now);
    if (this._last.size > REMEMBERED) {
      this._last.delete(this._last.keys().next().value as string);
    }
    // A hint is worth nothing once late: a failed one (the daemon away, a kernel gone) is not
    // retried, and says nothing to the user.
    this._send(kernelId).catch(() => undefined);
    return true;
  }

  private readonly _last = new Map<string, number>();
}
