import { KiwiModel } from '../src/model';
import { KERNEL_A, KERNEL_B, client, statusWith } from './documents';

describe('KiwiModel: where this notebook stands', () => {
  it('is holding when its kernel holds the GPU', () => {
    const model = new KiwiModel();
    model.kernelId = KERNEL_A;
    model.update(statusWith(['c1'], ['c2']), 0);
    expect(model.standing()).toEqual({ kind: 'holding' });
  });

  it('is waiting with its 1-based queue position', () => {
    const model = new KiwiModel();
    model.kernelId = KERNEL_B;
    model.update(statusWith(['c3'], ['c1', 'c2']), 0);
    expect(model.standing()).toEqual({ kind: 'waiting', position: 2 });
  });

  it('is idle when its kernel has not registered or does not ask for the GPU', () => {
    const model = new KiwiModel();
    model.kernelId = 'not-a-client';
    model.update(statusWith(['c1'], []), 0);
    expect(model.standing()).toEqual({ kind: 'idle' });
  });

  it('has no kernel when no notebook is in focus', () => {
    const model = new KiwiModel();
    model.update(statusWith(['c1'], []), 0);
    expect(model.standing()).toEqual({ kind: 'no-kernel' });
  });

  it('is unreachable, not idle, when the daemon does not answer', () => {
    const model = new KiwiModel();
    model.kernelId = KERNEL_A;
    model.update({ reachable: false, reason: 'connection refused', socket: '/tmp/k.sock' }, 0);
    expect(model.standing()).toEqual({ kind: 'unreachable' });
    expect(model.gpus(0)).toEqual([]);
    expect(model.unreachableReason).toBe('connection refused');
  });

  it('is paused when its kernel holds but another holder has its turn', () => {
    const model = new KiwiModel();
    model.kernelId = KERNEL_A;
    const doc = statusWith(['c1', 'c2'], []);
    doc.clients![0] = { ...doc.clients![0], paused: true };
    model.update(doc, 0);
    expect(model.standing()).toEqual({ kind: 'paused' });
    const [gpu] = model.gpus(0);
    expect(gpu.holders.map(h => h.paused)).toEqual([true, false]);
    model.kernelId = KERNEL_B;
    expect(model.standing()).toEqual({ kind: 'holding' });
  });

  it('holds over waits when the kernel has two clients (the kernel hook and the shim)', () => {
    const model = new KiwiModel();
    model.kernelId = KERNEL_A;
    const shim = client('c9', KERNEL_A, { state: 'holding' });
    model.update(statusWith(['c9'], ['c1'], [shim]), 0);
    expect(model.standing()).toEqual({ kind: 'holding' });
  });
});

describe('KiwiModel: the GPU view', () => {
  it('marks this notebook in the queue and labels kernels by their notebooks', () => {
    const model = new KiwiModel();
    model.kernelId = KERNEL_B;
    model.setKernelLabels(new Map([[KERNEL_B, 'train.ipynb']]));
    model.update(statusWith(['c1'], ['c3', 'c2']), 0);
    const [gpu] = model.gpus(0);
    expect(gpu.queue.map(e => [e.position, e.label, e.mine])).toEqual([
      [1, 'worker-7', false],
      [2, 'train.ipynb', true]
    ]);
    expect(gpu.holders).toEqual([
      { clientId: 'c1', label: 'kernel 3f2a9c1e', mine: false, evict: 'managed', paused: false }
    ]);
  });

  it('says how each client is paged out and why a GPU grants nobody', () => {
    const model = new KiwiModel();
    const document = statusWith(['c1'], ['c2']);
    document.clients![0].evict = 'checkpoint';
    document.clients![1].evict = 'checkpoint';
    document.clients![1].checkpoint_state = 'checkpointed';
    document.gpus![0].evict_blocked = 'the checkpoint of c3 failed';
    model.update(document, 0);
    const [gpu] = model.gpus(0);
    expect(gpu.holders.map(h => h.evict)).toEqual(['checkpoint']);
    expect(gpu.queue.map(e => e.evict)).toEqual(['checkpoint (checkpointed)']);
    expect(gpu.evictBlocked).toBe('the checkpoint of c3 failed');
  });

  it('names other kernels by the display name they registered, with their user', () => {
    const model = new KiwiModel();
    const other = client('c4', KERNEL_B, {
      state: 'holding',
      display_name: '~/team/forecast.ipynb',
      user: 'ada'
    });
    model.update(statusWith(['c4'], ['c1'], [other]), 0);
    const [gpu] = model.gpus(0);
    expect(gpu.holders[0].label).toBe('~/team/forecast.ipynb (ada)');
    expect(gpu.queue[0].label).toBe('kernel 3f2a9c1e');
  });

  it('keys a colour to the client, not to the id a restarted scheduler gives it again', () => {
    const model = new KiwiModel();
    model.update(statusWith(['c1'], []), 0);
    const before = model.colourKey('c1');
    const renumbered = client('c7', before, { state: 'holding' });
    model.update(statusWith(['c7'], [], [renumbered]), 1);
    expect(model.colourKey('c7')).toBe(before);
  });

  it("leaves out the user the server runs as, as kiwictl leaves out its own", () => {
    const model = new KiwiModel();
    const other = client('c4', KERNEL_B, { state: 'holding', display_name: 'forecast.ipynb', user: 'ada' });
    model.update({ ...statusWith(['c4'], [], [other]), viewer: 'ada' }, 0);
    expect(model.gpus(0)[0].holders[0].label).toBe('forecast.ipynb');
    model.update({ ...statusWith(['c4'], [], [other]), viewer: 'bob' }, 1);
    expect(model.gpus(1)[0].holders[0].label).toBe('forecast.ipynb (ada)');
  });

  it("prefers this server's session name, which follows a rename, to the registered one", () => {
    const model = new KiwiModel();
    model.setKernelLabels(new Map([[KERNEL_B, 'renamed.ipynb']]));
    const mine = client('c4', KERNEL_B, { state: 'holding', display_name: '~/old.ipynb' });
    model.update(statusWith(['c4'], [], [mine]), 0);
    expect(model.gpus(0)[0].holders[0].label).toBe('renamed.ipynb');
  });

  it('keeps a departed holder named by its notebook on the timeline', () => {
    const model = new KiwiModel();
    const other = client('c4', KERNEL_B, { state: 'holding', display_name: 'gone.ipynb' });
    model.update(statusWith(['c4'], [], [other]), 0);
    model.update(statusWith([], []), 5);
    expect(model.timeline(5).map(e => e.label)).toEqual(['gone.ipynb']);
  });

  it('counts the quantum down from when the document arrived, never below zero', () => {
    const model = new KiwiModel();
    model.update(statusWith(['c1'], []), 100);
    expect(model.gpus(100)[0].quantumLeft).toBe(20);
    expect(model.gpus(107.5)[0].quantumLeft).toBe(12.5);
    expect(model.gpus(200)[0].quantumLeft).toBe(0);
  });

  it('gives the memory fraction only when both figures are known', () => {
    const model = new KiwiModel();
    const known = statusWith([], []);
    known.gpus![0] = { ...known.gpus![0], memory_total: 16 * 1024 ** 3, memory_used: 4 * 1024 ** 3 };
    model.update(known, 0);
    expect(model.gpus(0)[0].memoryFraction).toBe(0.25);
    const unknown = statusWith([], []);
    unknown.gpus![0].memory_total = null;
    model.update(unknown, 0);
    expect(model.gpus(0)[0].memoryFraction).toBeNull();
  });

  it('hides mode and TQ while unreachable, so stale values are not shown as current', () => {
    const model = new KiwiModel();
    model.update(statusWith([], []), 0);
    expect([model.mode, model.tq]).toEqual(['on', 30]);
    model.fail('Network error', 1);
    expect([model.mode, model.tq, model.reachable]).toEqual([null, null, false]);
  });
});

describe('KiwiModel: the policy and why the next holder is next', () => {
  it('shows the policy and the reason while someone waits', () => {
    const model = new KiwiModel();
    const doc = statusWith(['c1'], ['c2']);
    doc.gpus![0] = { ...doc.gpus![0], policy: 'interactive', next_reason: 'least GPU time recently: 0 s' };
    model.update(doc, 0);
    const [gpu] = model.gpus(0);
    expect(gpu.policy).toBe('interactive');
    expect(gpu.nextReason).toBe('least GPU time recently: 0 s');
  });

  it('shows the turn only where holders take turns', () => {
    const model = new KiwiModel();
    const doc = statusWith(['c1'], []);
    doc.gpus![0] = { ...doc.gpus![0], turns: 1 };
    model.update(doc, 0);
    expect(model.gpus(0)[0].turns).toBe(1);
    doc.gpus![0] = { ...doc.gpus![0], turns: 0 };
    model.update(doc, 1);
    expect(model.gpus(1)[0].turns).toBeNull();
  });

  it('shows no reason when nobody waits, and no policy from a daemon that does not say', () => {
    const model = new KiwiModel();
    const doc = statusWith(['c1'], []);
    doc.gpus![0] = { ...doc.gpus![0], next_reason: 'stale' };
    delete doc.gpus![0].policy; // as an older daemon sends it
    model.update(doc, 0);
    const [gpu] = model.gpus(0);
    expect(gpu.policy).toBeNull();
    expect(gpu.nextReason).toBeNull();
  });
});

describe('KiwiModel: pools', () => {
  it('turns maximum -1 into no maximum', () => {
    const model = new KiwiModel();
    model.update(statusWith([], []), 0);
    expect(model.pools()[0].maximum).toBeNull();
  });

  it("shows the daemon's below_guarantee for each pool", () => {
    const model = new KiwiModel();
    const document = statusWith(['c1'], ['c2']);
    document.pools = [
      { name: 'training', guarantee: 0.3, weight: 1, maximum: 0.7, share: 0.2, clients: 1, below_guarantee: true },
      { name: 'simulation', guarantee: 0.5, weight: 3, maximum: -1, share: 0.8, clients: 1, below_guarantee: false }
    ];
    model.update(document, 0);
    expect(model.pools().map(p => [p.name, p.belowGuarantee, p.maximum])).toEqual([
      ['training', true, 0.7],
      ['simulation', false, null]
    ]);
  });

  it('computes no rule of its own: a pool the daemon does not flag is not flagged', () => {
    const model = new KiwiModel();
    const document = statusWith(['c1'], ['c2']);
    document.pools = [
      { name: 'training', guarantee: 0.3, weight: 1, maximum: 0.7, share: 0.1, clients: 1 },
      { name: 'simulation', guarantee: 0.5, weight: 3, maximum: -1, share: 0.9, clients: 1 }
    ];
    model.update(document, 0);
    expect(model.pools().map(p => p.belowGuarantee)).toEqual([false, false]);
  });
});

describe('KiwiModel: the timeline of recent holders', () => {
  it('records each turn with its start and end as holders change', () => {
    const model = new KiwiModel();
    model.update(statusWith(['c1'], ['c2']), 10);
    model.update(statusWith(['c1'], ['c2']), 11);
    model.update(statusWith(['c2'], []), 12);
    model.update(statusWith([], []), 15);
    expect(model.timeline(15).map(e => [e.clientId, e.start, e.end])).toEqual([
      ['c1', 10, 12],
      ['c2', 12, 15]
    ]);
  });

  it('keeps the label of a client that has left', () => {
    const model = new KiwiModel();
    model.setKernelLabels(new Map([[KERNEL_A, 'a.ipynb']]));
    model.update(statusWith(['c1'], []), 0);
    model.update(statusWith([], []), 1);
    expect(model.timeline(1)[0].label).toBe('a.ipynb');
  });

  it('forgets turns that ended before the window', () => {
    const model = new KiwiModel({ timelineWindow: 60 });
    model.update(statusWith(['c1'], []), 0);
    model.update(statusWith(['c2'], []), 10);
    model.update(statusWith(['c2'], []), 100);
    expect(model.timeline(100).map(e => e.clientId)).toEqual(['c2']);
  });

  it('closes open turns when the daemon becomes unreachable', () => {
    const model = new KiwiModel();
    model.update(statusWith(['c1'], []), 0);
    model.fail('gone', 5);
    expect(model.timeline(6)).toMatchObject([{ clientId: 'c1', start: 0, end: 5 }]);
  });

  it('keeps at most maxTimelineEntries turns', () => {
    const model = new KiwiModel({ maxTimelineEntries: 3 });
    for (let t = 0; t < 10; t++) {
      model.update(statusWith([t % 2 === 0 ? 'c1' : 'c2'], []), t);
    }
    expect(model.timeline(10)).toHaveLength(3);
    expect(model.timeline(10)[2]).toMatchObject({ start: 9, end: null });
  });
});

describe('KiwiModel: change notifications', () => {
  it('signals on each document and on a change of kernel, not on the same kernel again', () => {
    const model = new KiwiModel();
    let count = 0;
    model.changed.connect(() => (count += 1));
    model.update(statusWith([], []), 0);
    model.kernelId = KERNEL_A;
    model.kernelId = KERNEL_A;
    expect(count).toBe(2);
  });
});
