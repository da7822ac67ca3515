/**
 * Status documents for the specs. Each is made from SAMPLE_STATUS, which the daemon's own
 * build_status made from a real scheduler (status.generated.ts, written by
 * tests/status_fixtures.py; a Python test fails while it is stale, and tsc checks it against the
 * types generated from the daemon's table of the document). A spec moves holders and waiters
 * around; every other key is the daemon's.
 */

import { IClientStatus, IStatusDocument } from '../src/tokens';
import { SAMPLE_STATUS } from './status.generated';

const SAMPLE_CLIENTS = SAMPLE_STATUS.clients!;

/** The sample's two kernels: a Kiwi kernel registers under its Jupyter kernel id. */
export const KERNEL_A = SAMPLE_CLIENTS[0].name;
export const KERNEL_B = SAMPLE_CLIENTS[1].name;

/** A client as the daemon reports an idle one (the sample's first kernel, renamed). */
export function client(id: string, name: string, overrides: Partial<IClientStatus> = {}): IClientStatus {
  return {
    ...SAMPLE_CLIENTS[0],
    id,
    name,
    display_name: name,
    state: 'idle',
    paused: false,
    queue_position: null,
    waiting_since: null,
    working_set: 0,
    gpu_seconds: 0,
    labels: {},
    ...overrides
  };
}

/** The sample's GPU with these `holders` and `queue` (client ids), the clients' states following
 * from them; c1, c2 and c3 are the sample's clients, `extra` any others. */
export function statusWith(holders: string[], queue: string[], extra: IClientStatus[] = []): IStatusDocument {
  const names: Record<string, string> = {
    c1: SAMPLE_CLIENTS[0].name,
    c2: SAMPLE_CLIENTS[1].name,
    c3: SAMPLE_CLIENTS[2].name
  };
  const ids = [...new Set([...holders, ...queue, ...extra.map(c => c.id)])];
  const clients = ids.map(
    id =>
      extra.find(c => c.id === id) ??
      client(id, names[id] ?? id, {
        state: holders.includes(id) ? 'holding' : queue.includes(id) ? 'waiting' : 'idle',
        queue_position: queue.includes(id) ? queue.indexOf(id) + 1 : null
      })
  );
  // The sample's holder history belongs to the sample's own holds, not to the ones a spec moves
  // around: left out, as an older daemon leaves it out (history.spec.ts sets its own).
  const { recent_holders: _history, ...gpu } = SAMPLE_STATUS.gpus![0];
  return {
    ...SAMPLE_STATUS,
    gpus: [
      {
        ...gpu,
        holders,
        queue,
        quantum_remaining: holders.length > 0 ? 20 : null,
        next_reason: queue.length > 0 ? gpu.next_reason : null
      }
    ],
    clients,
    pools: SAMPLE_STATUS.pools!.map(pool => ({ ...pool, gpus: pool.gpus?.map(g => ({ ...g })) }))
  };
}
