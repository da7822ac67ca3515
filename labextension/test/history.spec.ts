import { KiwiModel } from '../src/model';
import type { IHeldSpan } from '../src/tokens';
import { KERNEL_A, KERNEL_B, statusWith } from './documents';

/** A status document whose GPU carries the scheduler's own holder history. */
function withHistory(holders: string[], queue: string[], spans: Partial<IHeldSpan>[]) {
  const document = statusWith(holders, queue);
  (document.gpus![0] as any).recent_holders = spans;
  return document;
}

const DEMO = { client: 'c1', name: KERNEL_A, display_name: 'kiwi-demo.ipynb', user: null };
const PARTNER = { client: 'c2', name: KERNEL_B, display_name: 'kiwi-demo-partner.ipynb', user: null };

describe('KiwiModel: the timeline from the scheduler', () => {
  it("reads an older daemon's started and ended as its own", () => {
    const model = new KiwiModel({ timelineWindow: 300 });
    const older = [{ ...DEMO, started: 150, ended: 135 }];
    model.update(withHistory([], [], older), 1000);
    expect(model.timeline(1000).map(e => [e.start, e.end])).toEqual([[850, 865]]);
  });

  it('shows turns that ended before the page was loaded', () => {
    const model = new KiwiModel({ timelineWindow: 300 });
    // Loaded 2 minutes after the demo: nobody holds now, the scheduler remembers.
    model.update(withHistory([], [], [
      { ...DEMO, started_ago: 150, ended_ago: 135 },
      { ...PARTNER, started_ago: 135, ended_ago: 120 }
    ]), 1000);
    const timeline = model.timeline(1000);
    expect(timeline.map(e => [e.label, e.start, e.end])).toEqual([
      ['kiwi-demo.ipynb', 850, 865],
      ['kiwi-demo-partner.ipynb', 865, 880]
    ]);
  });

  it('draws the same history in two tabs that started looking at different times', () => {
    const early = new KiwiModel();
    const late = new KiwiModel();
    early.update(withHistory(['c1'], [], [{ ...DEMO, started_ago: 0, ended_ago: null }]), 100);
    const spans = [
      { ...DEMO, started_ago: 20, ended_ago: 5 },
      { ...PARTNER, started_ago: 5, ended_ago: null }
    ];
    early.update(withHistory(['c2'], [], spans), 120);
    late.update(withHistory(['c2'], [], spans), 120);
    expect(early.timeline(121)).toEqual(late.timeline(121));
    expect(late.timeline(121).map(e => e.end)).toEqual([115, null]);
  });

  it('names a client that has left by what the scheduler recorded', () => {
    const model = new KiwiModel();
    model.update(withHistory([], [], [{ ...DEMO, user: 'alice', started_ago: 30, ended_ago: 10 }]), 50);
    expect(model.timeline(50)[0].label).toBe('kiwi-demo.ipynb (alice)');
  });
});

describe('KiwiModel: the status bar with no kernel of its own', () => {
  it('says who holds the GPU and how many wait', () => {
    const model = new KiwiModel();
    model.setKernelLabels(new Map([[KERNEL_A, 'kiwi-demo.ipynb']]));
    model.update(statusWith(['c1'], ['c2']), 0);
    expect(model.standing()).toEqual({ kind: 'no-kernel' });
    expect(model.glance()).toEqual({ holders: ['kiwi-demo.ipynb'], waiting: 1 });
  });

  it('sees nothing while the scheduler cannot be reached', () => {
    const model = new KiwiModel();
    model.update({ reachable: false, reason: 'gone' }, 0);
    expect(model.glance()).toEqual({ holders: [], waiting: 0 });
  });
});

describe('KiwiModel: NVML readings', () => {
  it('shows the devices NVML reads, and none where the server has no NVML', () => {
    const model = new KiwiModel();
    expect(model.nvml()).toEqual([]);
    const device = {
      index: 0, name: 'NVIDIA H100', uuid: 'GPU-1', memory_used: 1, memory_total: 2,
      utilization: 45, memory_utilization: 10
    };
    model.setNvml({ nvml: true, gpus: [device] });
    expect(model.nvml()).toEqual([device]);
    model.setNvml({ nvml: false, reason: 'NVML Shared Library Not Found' });
    expect(model.nvml()).toEqual([]);
  });
});

describe('KiwiModel: kernels no session names yet', () => {
  it('lists the kernel ids the scheduler knows and this page cannot name', () => {
    const model = new KiwiModel();
    model.setKernelLabels(new Map([[KERNEL_A, 'kiwi-demo.ipynb']]));
    model.update(statusWith(['c1'], ['c2', 'c3']), 0);
    expect(model.unlabelledKernels()).toEqual([KERNEL_B]);
  });
});
