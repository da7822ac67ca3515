import { describeMemory, describeStanding, formatBytes, formatSeconds, formatShare, hueOf } from '../src/format';

describe('formatting', () => {
  it('writes bytes in binary units with three significant digits', () => {
    expect(formatBytes(512)).toBe('512 B');
    expect(formatBytes(8 * 1024 ** 3)).toBe('8.00 GiB');
    expect(formatBytes(1536 * 1024)).toBe('1.50 MiB');
    expect(formatBytes(null)).toBe('?');
  });

  it('writes durations for people', () => {
    expect(formatSeconds(0.44)).toBe('0.4 s');
    expect(formatSeconds(29.6)).toBe('30 s');
    expect(formatSeconds(125)).toBe('2 min 5 s');
    expect(formatSeconds(120)).toBe('2 min');
    expect(formatSeconds(-3)).toBe('0.0 s');
    expect(formatSeconds(null)).toBe('–');
  });

  it('rounds a duration before splitting it into minutes and seconds', () => {
    expect(formatSeconds(119.6)).toBe('2 min');
    expect(formatSeconds(179.5)).toBe('3 min');
    expect(formatSeconds(59.7)).toBe('1 min');
    expect(formatSeconds(61.4)).toBe('1 min 1 s');
  });

  it('writes shares as percentages', () => {
    expect(formatShare(0.35)).toBe('35%');
    expect(formatShare(null)).toBe('–');
  });

  it('gives a client the same hue every time', () => {
    expect(hueOf('c7')).toBe(hueOf('c7'));
    expect(hueOf('c7')).toBeGreaterThanOrEqual(0);
    expect(hueOf('c7')).toBeLessThan(360);
  });
});

describe('the status bar words', () => {
  // The translator's job is substitution; these specs check which words each standing gets.
  const trans = {
    __: (text: string, ...args: unknown[]) =>
      args.reduce<string>((s, a, i) => s.replace(`%${i + 1}`, String(a)), text)
  } as any;

  it('says holding, waiting with the position, idle or unreachable', () => {
    expect(describeStanding({ kind: 'holding' }, trans)).toBe('GPU: holding');
    expect(describeStanding({ kind: 'paused' }, trans)).toBe("GPU: holding, paused for another cell's turn");
    expect(describeStanding({ kind: 'waiting', position: 2 }, trans)).toBe('GPU: waiting #2');
    expect(describeStanding({ kind: 'idle' }, trans)).toBe('GPU: idle');
    expect(describeStanding({ kind: 'no-kernel' }, trans)).toBe('GPU: idle');
    expect(describeStanding({ kind: 'unreachable' }, trans)).toBe('GPU: scheduler unreachable');
  });
});

describe('the memory line', () => {
  const trans = {
    __: (text: string, ...args: unknown[]) =>
      args.reduce<string>((s, a, i) => s.replace(`%${i + 1}`, String(a)), text)
  } as any;
  const unknown = 'capacity unknown (no NVML, no --gpu-memory)';

  it('reads the same idle and busy when the capacity is unknown, and says why', () => {
    expect(describeMemory(null, null, trans)).toBe(unknown);
    expect(describeMemory(0, null, trans)).toBe(unknown);
    expect(describeMemory(2 * 1024 ** 3, null, trans)).toBe(`${unknown}; 2.00 GiB in use`);
  });

  it('gives used of total when the capacity is known', () => {
    expect(describeMemory(2 * 1024 ** 3, 16 * 1024 ** 3, trans)).toBe('2.00 GiB of 16.0 GiB');
    expect(describeMemory(null, 16 * 1024 ** 3, trans)).toBe('0 B of 16.0 GiB');
  });
});
