import {
  clientLabel,
  describeMemory,
  describePool,
  describeStanding,
  formatBytes,
  formatSeconds,
  formatShare,
  hueOf,
  huesOf,
  MIN_HUE_GAP,
  MAX_TAIL,
  splitName
} from '../src/format';
import { LABEL_EXAMPLES, SECONDS_EXAMPLES, SIZE_EXAMPLES } from '../src/formats.generated';

describe('formatting', () => {
  it('writes bytes as every view does (nodeside/formats.py)', () => {
    for (const [bytes, text] of SIZE_EXAMPLES) {
      expect([bytes, formatBytes(bytes)]).toEqual([bytes, text]);
    }
  });

  it('writes durations as every view does (nodeside/formats.py)', () => {
    for (const [seconds, text] of SECONDS_EXAMPLES) {
      expect([seconds, formatSeconds(seconds)]).toEqual([seconds, text]);
    }
  });

  it('names clients as every view does (nodeside/names.py)', () => {
    for (const [[name, displayName, user, viewer], text] of LABEL_EXAMPLES) {
      expect(clientLabel(name, displayName, user, viewer)).toBe(text);
    }
  });

  it('keeps clients shown together far apart, whatever their names hash to', () => {
    // Names whose own hues are near: found among kernel-like names, as a panel would meet them.
    const names = Array.from({ length: 400 }, (_, i) => `3f2a9c1e-0b7d-4e55-9a61-${String(i).padStart(12, '0')}x`);
    const near = names.flatMap(a => names.filter(b => b > a && Math.abs(hueOf(a) - hueOf(b)) < 5).map(b => [a, b]))[0];
    expect(near).toBeDefined();
    const hues = huesOf(near);
    const [h1, h2] = near.map(n => hues.get(n)!);
    const d = Math.abs(h1 - h2);
    expect(Math.min(d, 360 - d)).toBeGreaterThanOrEqual(MIN_HUE_GAP);
    // The same names, in any order and in any tab, get the same hues.
    expect(huesOf([...near].reverse())).toEqual(hues);
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

  it('gives clients registered one after another hues far apart', () => {
    // The daemon's ids c1, c2, c3 once landed within 3 degrees of each other.
    const distance = (a: number, b: number) => Math.min(Math.abs(a - b), 360 - Math.abs(a - b));
    for (let first = 1; first < 40; first++) {
      const hues = [first, first + 1, first + 2, first + 3].map(n => hueOf(`c${n}`));
      for (let i = 0; i < hues.length; i++) {
        for (let j = i + 1; j < hues.length; j++) {
          expect(distance(hues[i], hues[j])).toBeGreaterThanOrEqual(30);
        }
      }
    }
  });

  it('spreads ids without a number too', () => {
    const hues = new Set(['trainer', 'trainee', 'worker-a', 'worker-b'].map(hueOf));
    expect(hues.size).toBe(4);
  });
});

describe('cutting names apart', () => {
  it('keeps the end that tells two demo notebooks apart', () => {
    const names = ['kiwi-demo.ipynb', 'kiwi-demo-partner.ipynb'];
    const [head, tail] = splitName(names[1], names);
    expect(head + tail).toBe(names[1]);
    expect(tail).toBe('-partner.ipynb');
    const [, other] = splitName(names[0], names);
    expect(other.endsWith('demo.ipynb')).toBe(true);
    expect(other).not.toBe(tail);
  });

  it('keeps a few characters before the extension of a name alone', () => {
    expect(splitName('forecasting-electricity-demand.ipynb')).toEqual(['forecasting-electricity-', 'demand.ipynb']);
  });

  it('never keeps more than MAX_TAIL characters, so the head still shows', () => {
    const names = ['a-very-long-experiment-name-one.ipynb', 'b-very-long-experiment-name-two.ipynb'];
    const [head, tail] = splitName(names[0], names);
    expect(tail.length).toBe(MAX_TAIL);
    expect(head.length).toBeGreaterThan(0);
    expect(splitName('short.ipynb')).toEqual(['', 'short.ipynb']);
  });
});

describe('the status bar words', () => {
  // The translator's job is substitution; these specs check which words each standing gets.
  const trans = {
    __: (text: string, ...args: unknown[]) =>
      args.reduce<string>((s, a, i) => s.replace(`%${i + 1}`, String(a)), text)
  } as any;

  it('says who holds the GPU when the focused tab has no kernel or an idle one', () => {
    const held = { holders: ['kiwi-demo.ipynb'], waiting: 1 };
    expect(describeStanding({ kind: 'no-kernel' }, trans, held)).toBe('GPU: held by kiwi-demo.ipynb · 1 waiting');
    expect(describeStanding({ kind: 'idle' }, trans, { holders: ['a', 'b'], waiting: 0 })).toBe('GPU: held by a and 1 more');
    expect(describeStanding({ kind: 'no-kernel' }, trans, { holders: [], waiting: 0 })).toBe('GPU: idle');
    expect(describeStanding({ kind: 'holding' }, trans, held)).toBe('GPU: holding');
  });

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

  it('names no daemon flag: without a capacity it says what the kernels use, or nothing', () => {
    expect(describeMemory(null, null, trans)).toBeNull();
    expect(describeMemory(0, null, trans)).toBeNull();
    expect(describeMemory(2 * 1024 ** 3, null, trans)).toBe("kernels use 2.0 GiB (the GPU's size is not known here)");
  });

  it('gives used of total when the capacity is known', () => {
    expect(describeMemory(2 * 1024 ** 3, 16 * 1024 ** 3, trans)).toBe('2.0 GiB of 16.0 GiB used');
    expect(describeMemory(null, 16 * 1024 ** 3, trans)).toBe('16.0 GiB, its use not known here');
  });
});

describe('the pool line', () => {
  const trans = {
    __: (text: string, ...args: unknown[]) =>
      args.reduce<string>((s, a, i) => s.replace(`%${i + 1}`, String(a)), text)
  } as any;

  it('says a share and its limits in plain words', () => {
    const pool = { share: 0.23, guarantee: 1, maximum: null, belowGuarantee: false };
    expect(describePool(pool, trans)).toEqual(['using 23% of the GPU', 'guaranteed 100%', 'no maximum']);
  });

  it('says what the orange of a pool below its guarantee means', () => {
    const pool = { share: 0.1, guarantee: 0.3, maximum: 0.7, belowGuarantee: true };
    expect(describePool(pool, trans)).toEqual([
      'using 10% of the GPU',
      'guaranteed 30%',
      'at most 70%',
      'below its guarantee: it goes first'
    ]);
  });
});
