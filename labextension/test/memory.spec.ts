/**
 * Where each kernel's memory is: the model's view of a GPU's memory split by kernel, and the
 * words the panel shows for it. MEMORY_STATUS is tests/status_fixtures.py's memory sample:
 * nbA.ipynb (c1) moving its 24 GiB out, nbB (c2) holding with 40 GiB, nbC (c3) first in the
 * queue and waiting for nbA's 24 GiB, nbD (c4) idle with 20 GiB in host memory.
 */

import {
  describeClientMemory,
  describeMemorySource,
  describeResidency,
  describeResidentMemory,
  describeWaitingFor
} from '../src/format';
import { KiwiModel } from '../src/model';
import { MEMORY_STATUS, SAMPLE_STATUS } from './status.generated';

const GiB = 1024 ** 3;

const trans = {
  __: (text: string, ...args: unknown[]) =>
    args.reduce<string>((s, a, i) => s.replace(`%${i + 1}`, String(a)), text)
} as any;

function memoryOfGpu0(document = MEMORY_STATUS, kernelId: string | null = null) {
  const model = new KiwiModel();
  model.kernelId = kernelId;
  model.update(document, 0);
  return model.gpus(0)[0];
}

describe('the model: a GPU memory split by kernel', () => {
  it('has every kernel on the GPU with where its memory is, in the document order', () => {
    const memory = memoryOfGpu0().memory!;
    expect(memory.kernels.map(k => [k.label, k.residency, k.residentBytes / GiB, k.hostBytes / GiB])).toEqual([
      ['nbA.ipynb', 'evicting', 10, 14],
      ['nbB.ipynb', 'resident', 40, 0],
      ['nbC.ipynb', 'resident', 0, 0],
      ['nbD.ipynb', 'evicted', 0, 20]
    ]);
  });

  it('says where each kernel\'s figures come from', () => {
    expect(memoryOfGpu0().memory!.kernels.map(k => k.source)).toEqual(['shim', 'nvml', 'working_set', 'shim']);
    expect(describeMemorySource('nvml', trans)).toBe('as NVML reads the process (more than the kernel reported)');
  });

  it('has the totals against the capacity and the host budget', () => {
    const { resident, capacity, host, hostBudget } = memoryOfGpu0().memory!;
    expect([resident, capacity, host, hostBudget].map(n => n! / GiB)).toEqual([50, 80, 34, 64]);
  });

  it('says what the waiting kernel waits for, naming the other as the panel names it', () => {
    const gpu = memoryOfGpu0();
    const waiting = gpu.memory!.kernels.find(k => k.label === 'nbC.ipynb')!.waitingFor;
    expect(waiting).toEqual({ clientId: 'c1', label: 'nbA.ipynb', bytes: 24 * GiB, action: 'evict' });
    expect(gpu.queue.map(q => q.waitingFor)).toEqual([waiting]);
    expect(gpu.memory!.kernels.filter(k => k.waitingFor !== null)).toHaveLength(1);
  });

  it("marks this notebook's kernel", () => {
    const kernelC = MEMORY_STATUS.clients![2].name;
    const memory = memoryOfGpu0(MEMORY_STATUS, kernelC).memory!;
    expect(memory.kernels.map(k => k.mine)).toEqual([false, false, true, false]);
  });

  it('has no memory view from a daemon that keeps no resident memory', () => {
    const gpu = memoryOfGpu0(SAMPLE_STATUS);
    expect(gpu.memory).toBeNull();
    expect(gpu.queue.every(q => q.waitingFor === null)).toBe(true);
  });

  it("names the kernel waited for by the daemon's name when the document does not list it", () => {
    const clients = MEMORY_STATUS.clients!.map(c =>
      c.id === 'c3' ? { ...c, waiting_for: { client: 'c9', name: 'gone.ipynb', bytes: GiB, action: 'evict' as const } } : c
    );
    const gpu = memoryOfGpu0({ ...MEMORY_STATUS, clients });
    expect(gpu.queue[0].waitingFor?.label).toBe('gone.ipynb');
  });
});

describe('the words of memory', () => {
  it('says each residency as kiwictl and %kiwi do', () => {
    expect((['resident', 'evicting', 'evicted', 'restoring'] as const).map(r => describeResidency(r, trans))).toEqual([
      'on GPU',
      'moving out',
      'in host memory',
      'moving in'
    ]);
  });

  it("says a kernel's memory on the GPU and in host memory", () => {
    expect(describeClientMemory(10 * GiB, 14 * GiB, trans)).toBe('10.0 GiB on GPU, 14.0 GiB in host memory');
  });

  it('says what a kernel waits for, for each action', () => {
    const waiting = { label: 'nbA.ipynb', bytes: 24 * GiB };
    expect(describeWaitingFor({ ...waiting, action: 'evict' }, trans)).toBe('waiting for nbA.ipynb to move 24.0 GiB to host memory');
    expect(describeWaitingFor({ ...waiting, action: 'checkpoint' }, trans)).toBe(
      'waiting for nbA.ipynb to be checkpointed (24.0 GiB to host memory)'
    );
    expect(describeWaitingFor({ ...waiting, action: 'restore' }, trans)).toBe('waiting for nbA.ipynb to move 24.0 GiB back onto the GPU');
    expect(describeWaitingFor({ ...waiting, action: 'spill' }, trans)).toBe(
      'waiting for nbA.ipynb to move 24.0 GiB to disk (the host memory budget is full)'
    );
  });

  it("says the GPU's totals, and what it does not know", () => {
    const memory = { resident: 50 * GiB, capacity: 80 * GiB, host: 34 * GiB, hostBudget: 64 * GiB };
    expect(describeResidentMemory(memory, trans)).toEqual(['50.0 GiB of 80.0 GiB on the GPU', '34.0 GiB of 64.0 GiB in host memory']);
    expect(describeResidentMemory({ ...memory, capacity: null, hostBudget: null }, trans)).toEqual([
      "50.0 GiB on the GPU (the GPU's size is not known here)",
      '34.0 GiB in host memory (no limit set)'
    ]);
  });
});
