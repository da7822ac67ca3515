/** Status documents for the specs, built the way the daemon builds them (CONTRACT section 5). */

import { IClientStatus, IStatusDocument } from '../src/tokens';

export const KERNEL_A = '3f2a9c1e-0b7d-4e55-9a61-5d2f7c8e9a01';
export const KERNEL_B = '8c0d4b2a-6e1f-4a3b-8c9d-0e1f2a3b4c5d';

export function client(id: string, name: string, overrides: Partial<IClientStatus> = {}): IClientStatus {
  return {
    id,
    name,
    pid: 100,
    gpu: 0,
    pool: 'default',
    priority: 'NORMAL',
    state: 'idle',
    queue_position: null,
    working_set: 0,
    gpu_seconds: 0,
    ...overrides
  };
}

/** One GPU; `holders` and `queue` are client ids, and the clients' states follow from them. */
export function statusWith(holders: string[], queue: string[], extra: IClientStatus[] = []): IStatusDocument {
  const names: Record<string, string> = { c1: KERNEL_A, c2: KERNEL_B, c3: 'worker-7' };
  const ids = [...new Set([...holders, ...queue, ...extra.map(c => c.id)])];
  const clients = ids.map(
    id =>
      extra.find(c => c.id === id) ??
      client(id, names[id] ?? id, {
        state: holders.includes(id) ? 'holding' : queue.includes(id) ? 'waiting' : 'idle',
        queue_position: queue.includes(id) ? queue.indexOf(id) + 1 : null
      })
  );
  return {
    reachable: true,
    version: 1,
    mode: 'on',
    tq: 30,
    gpus: [
      {
        index: 0,
        name: 'logical GPU 0',
        uuid: null,
        memory_total: 16 * 1024 ** 3,
        memory_used: 4 * 1024 ** 3,
        holders,
        queue,
        quantum_remaining: holders.length > 0 ? 20 : null
      }
    ],
    clients,
    pools: [{ name: 'default', guarantee: 0, weight: 1, maximum: -1, share: 1, clients: clients.length }]
  };
}
