/**
 * Where each kernel's memory is by tier (issue 42): the model's view of a document from a daemon
 * with tiers, the words the panel writes for it (the same as kiwictl's and %kiwi's: the examples
 * are made by nodeside/memory_words.py), and the hints a notebook brought to the front sends.
 */

import { describeSpill, describeTier, describeTierFailed } from '../src/format';
import { TIER_EXAMPLES, TIER_WORDS } from '../src/formats.generated';
import { FrontHints } from '../src/front';
import { KiwiModel } from '../src/model';
import { MEMORY_STATUS } from './status.generated';

const GiB = 1024 ** 3;

const trans = {
  __: (text: string, ...args: unknown[]) =>
    args.reduce<string>((s, a, i) => s.replace(`%${i + 1}`, String(a)), text)
} as any;

function tiered(): any {
  const document = JSON.parse(JSON.stringify(MEMORY_STATUS));
  const tiers: Record<string, object> = {
    c1: { tier: 'moving', disk_bytes: 0, pinned_bytes: 14 * GiB },
    c2: { tier: 'gpu', disk_bytes: 0, pinned_bytes: 0 },
    c3: { tier: 'host', disk_bytes: 0, pinned_bytes: 0, tier_failed: 'no space left on the disk' },
    c4: { tier: 'disk', disk_bytes: 20 * GiB, host_bytes: 0, pinned_bytes: 0 }
  };
  for (const client of document.clients) {
    Object.assign(client, { tier_failed: null }, tiers[client.id]);
  }
  for (const gpu of document.gpus) {
    Object.assign(gpu, { pinned_bytes: 14 * GiB, spill_bytes: 20 * GiB });
  }
  return document;
}

function memoryOf(document: any) {
  const model = new KiwiModel();
  model.update(document, 0);
  return model.gpus(0)[0].memory!;
}

describe('the panel writes a tier as every text view', () => {
  it.each(TIER_EXAMPLES)('%j', (client, words) => {
    const kernel = {
      tier: client.tier as any,
      hostBytes: Number(client.host_bytes ?? 0),
      pinnedBytes: Number(client.pinned_bytes ?? 0),
      diskBytes: Number(client.disk_bytes ?? 0)
    };
    expect(describeTier(kernel, trans)).toBe(words);
  });

  it('has words for every tier, those of nodeside/memory_words.py', () => {
    for (const [tier, words] of Object.entries(TIER_WORDS)) {
      const written = describeTier({ tier: tier as any, hostBytes: 0, pinnedBytes: 0, diskBytes: 0 }, trans);
      expect(written.startsWith(words)).toBe(true);
    }
  });

  it('says why a move failed and that nothing was lost', () => {
    expect(describeTierFailed('no space left on the disk', trans)).toBe(
      'could not move to or from disk: no space left on the disk'
    );
  });
});

describe('the model: each kernel by tier', () => {
  it('has each kernel tier, its bytes by tier and a failed move', () => {
    const memory = memoryOf(tiered());
    expect(memory.kernels.map(k => [k.label, k.tiers?.tier, k.tiers?.diskBytes, k.tiers?.failed])).toEqual([
      ['nbA.ipynb', 'moving', 0, null],
      ['nbB.ipynb', 'gpu', 0, null],
      ['nbC.ipynb', 'host', 0, 'no space left on the disk'],
      ['nbD.ipynb', 'disk', 20 * GiB, null]
    ]);
    expect(memory.spill).toEqual({ pinned: 14 * GiB, spilled: 20 * GiB });
    expect(describeSpill(memory.spill!, trans)).toBe('14.0 GiB pinned, 20.0 GiB on disk');
  });

  it('has no tiers from a daemon without them', () => {
    const memory = memoryOf(MEMORY_STATUS);
    expect(memory.spill).toBeNull();
    expect(memory.kernels.every(k => k.tiers === null)).toBe(true);
  });
});

describe('a notebook brought to the front', () => {
  it('hints its kernel at most once a second, each kernel apart', () => {
    let now = 0;
    const sent: string[] = [];
    const hints = new FrontHints(
      id => {
        sent.push(id);
        return Promise.resolve();
      },
      () => now
    );
    for (let i = 0; i < 5; i++) {
      hints.front('a');
      hints.front('b');
      hints.front(null);
      now += 300;
    }
    expect(sent).toEqual(['a', 'b', 'a', 'b']);
  });

  it('lets a failed hint go unsaid', async () => {
    const hints = new FrontHints(() => Promise.reject(new Error('503')), () => 0);
    expect(hints.front('a')).toBe(true);
    await Promise.resolve();
  });
});
