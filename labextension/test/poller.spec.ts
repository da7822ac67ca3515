import { KiwiModel } from '../src/model';
import { MAX_BACKOFF_MS, StatusPoller } from '../src/poller';
import { IStatusDocument } from '../src/tokens';
import { KERNEL_A, statusWith } from './documents';

/** A server the test answers by hand: each long-poll waits until the test resolves it. */
class HandServer {
  asked: string[] = [];
  pending: Array<{ resolve: (d: IStatusDocument) => void; reject: (e: Error) => void }> = [];
  waitForStatus = (after: string): Promise<IStatusDocument> => {
    this.asked.push(after);
    return new Promise((resolve, reject) => this.pending.push({ resolve, reject }));
  };
  answer(document: IStatusDocument): void {
    this.pending.shift()!.resolve(document);
  }
  fail(message: string): void {
    this.pending.shift()!.reject(new Error(message));
  }
}

/** Lets every promise that can settle, settle. */
const settle = () => new Promise(resolve => setTimeout(resolve, 0));

function start(server: HandServer, refreshRate: number) {
  const model = new KiwiModel();
  const slept: number[] = [];
  const wakers: Array<() => void> = [];
  const poller = new StatusPoller(model, refreshRate, {
    waitForStatus: server.waitForStatus,
    fetchStatus: () => Promise.reject(new Error('not used')),
    sleep: ms => {
      slept.push(ms);
      return new Promise(resolve => wakers.push(resolve));
    },
    now: () => 0
  });
  const wake = () => wakers.shift()!();
  return { model, poller, slept, wake };
}

describe('StatusPoller: the long-poll', () => {
  it('shows a grant as soon as the server answers, without waiting for an interval', async () => {
    const server = new HandServer();
    const { model, poller, slept } = start(server, 60_000);
    model.kernelId = KERNEL_A;
    await settle();
    expect(server.asked).toEqual(['']);
    server.answer({ ...statusWith([], ['c1']), etag: 't1', pushed: true });
    await settle();
    expect(model.standing()).toEqual({ kind: 'waiting', position: 1 });
    expect(server.asked).toEqual(['', 't1']); // asked again at once, naming the tag
    server.answer({ ...statusWith(['c1'], []), etag: 't2', pushed: true });
    await settle();
    expect(model.standing()).toEqual({ kind: 'holding' });
    expect(server.asked).toEqual(['', 't1', 't2']);
    expect(slept).toEqual([]); // never once the refresh rate
    poller.dispose();
  });

  it('polls at the refresh rate where the server cannot push', async () => {
    const server = new HandServer();
    const { poller, slept, wake } = start(server, 700);
    await settle();
    server.answer({ reachable: false, reason: 'no daemon', pushed: false });
    await settle();
    expect(slept).toEqual([700]);
    expect(server.asked).toEqual(['']);
    wake();
    await settle();
    expect(server.asked).toEqual(['', '']); // no tag to name: a plain answer comes at once
    poller.dispose();
  });

  it('backs off on failures, doubling up to 10 s, and snaps back on success', async () => {
    const server = new HandServer();
    const { model, poller, slept, wake } = start(server, 2000);
    await settle();
    for (let i = 0; i < 5; i++) {
      server.fail('server gone');
      await settle();
      wake();
      await settle();
    }
    expect(slept).toEqual([2000, 4000, 8000, MAX_BACKOFF_MS, MAX_BACKOFF_MS]);
    expect(model.reachable).toBe(false);
    expect(model.unreachableReason).toBe('server gone');
    server.answer({ ...statusWith([], []), etag: 't1', pushed: true });
    await settle();
    server.fail('again');
    await settle();
    expect(slept[slept.length - 1]).toBe(2000);
    poller.dispose();
  });

  it('stops asking once disposed', async () => {
    const server = new HandServer();
    const { poller } = start(server, 500);
    await settle();
    poller.dispose();
    server.answer({ ...statusWith([], []), etag: 't1', pushed: true });
    await settle();
    await poller.stopped;
    expect(server.asked).toEqual(['']);
  });
});
