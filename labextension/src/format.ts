/** Small formatting rules shared by the panel and the status bar item; pure, tested with Jest. */

import type { TranslationBundle } from '@jupyterlab/translation';

import {
  KERNEL_ID_PREFIX,
  KERNEL_ID_SHOWN,
  NO_DURATION,
  SIZE_UNITS,
  TENTHS_BELOW,
  UNKNOWN_SIZE
} from './formats.generated';
import type { KernelStanding } from './views';
import type { Residency, SchedulerMode, Tier, WaitingAction } from './tokens';

/** Half away from zero, to `places` decimals: the rounding nodeside/formats.py spells out. */
function roundTo(value: number, places = 0): number {
  const scale = 10 ** places;
  return Math.floor(value * scale + 0.5) / scale;
}

/**
 * Bytes as every view writes them (nodeside/formats.py `size`): "512 B", "8.0 MiB", "7.8 MiB";
 * "unknown" for null. Checked against its examples (formats.generated.ts).
 */
export function formatBytes(bytes: number | null): string {
  if (bytes === null || !Number.isFinite(bytes) || bytes < 0) {
    return UNKNOWN_SIZE;
  }
  if (bytes < 1024) {
    return `${Math.trunc(bytes)} B`;
  }
  let value = bytes;
  let unit = 0;
  while (unit < SIZE_UNITS.length - 1 && roundTo(value, 1) >= 1024) {
    value /= 1024;
    unit += 1;
  }
  return `${roundTo(value, 1).toFixed(1)} ${SIZE_UNITS[unit]}`;
}

/**
 * A duration as every view writes it (nodeside/formats.py `seconds`): "0.05 s", "4.3 s", "5 s",
 * "12 s", "2 min 5 s", "1 h 5 min"; "–" for null.
 */
export function formatSeconds(seconds: number | null): string {
  if (seconds === null || !Number.isFinite(seconds)) {
    return NO_DURATION;
  }
  const s = Math.max(0, seconds);
  if (s < 1) {
    return `${String(roundTo(s, 2))} s`;
  }
  if (s < TENTHS_BELOW) {
    const tenths = roundTo(s, 1);
    if (tenths < TENTHS_BELOW) {
      return `${String(tenths)} s`;
    }
  }
  // Rounded before splitting: 119.6 s is "2 min", never "1 min 60 s".
  const whole = roundTo(s);
  if (whole < 60) {
    return `${whole} s`;
  }
  if (whole < 3600) {
    const minutes = Math.floor(whole / 60);
    const rest = whole - minutes * 60;
    return rest === 0 ? `${minutes} min` : `${minutes} min ${rest} s`;
  }
  const allMinutes = roundTo(whole / 60);
  const hours = Math.floor(allMinutes / 60);
  const rest = allMinutes - hours * 60;
  return rest === 0 ? `${hours} h` : `${hours} h ${rest} min`;
}

/** A Jupyter kernel id: a kernel known by nothing else is shown by its first characters. */
const KERNEL_ID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/**
 * A client as every view names it (nodeside/names.py `label`): its display name (a notebook's
 * path), else its name, a bare kernel id as "kernel 3f2a9c1e"; with its user in brackets unless
 * that is the viewer's own (the user the server runs as).
 */
export function clientLabel(
  name: string,
  displayName: string | null | undefined,
  user: string | null | undefined,
  viewer: string | null | undefined
): string {
  const shown =
    displayName && displayName !== name
      ? displayName
      : KERNEL_ID.test(name)
        ? KERNEL_ID_PREFIX + name.slice(0, KERNEL_ID_SHOWN)
        : name;
  return user && user !== viewer ? `${shown} (${user})` : shown;
}

/** A fraction of one GPU's time as a percentage: 0.35 -> "35%". */
export function formatShare(fraction: number | null): string {
  if (fraction === null || !Number.isFinite(fraction)) {
    return '–';
  }
  return `${Math.round(fraction * 100)}%`;
}

/** Degrees between the hues of consecutive clients: the golden angle, so that any run of them
 * stays spread around the colour wheel (c1, c2, c3 land 137.5 degrees apart). */
const GOLDEN_ANGLE = 137.508;

/**
 * A stable hue per client, so a client keeps its colour across the timeline, the holder and the
 * queue, in every tab, after every reload and after a scheduler restart: the panel gives it the
 * client's name (model.colourKey: a kernel's id, a worker's name), never the daemon's ids. Names
 * that end in a number (worker-1, worker-2) step the golden angle per number, which keeps a run
 * of them far apart; any other name gets a well-mixed hash.
 */
export function hueOf(id: string): number {
  const numbered = /^(.*?)(\d+)$/.exec(id);
  const base = mix(numbered ? numbered[1] : id);
  const step = numbered ? Number(numbered[2]) * GOLDEN_ANGLE : 0;
  return Math.round((base % 360) + step) % 360;
}

/** The least distance, in degrees, between the hues of two clients shown together. */
export const MIN_HUE_GAP = 40;
/** The step that moves a hue away from one too near: the golden angle, which lands far. */
const HUE_STEP = GOLDEN_ANGLE;

/**
 * Hues for the clients shown together, keyed by their names (hueOf each): the same names give
 * the same hues in every tab and after every scheduler restart. Where two would be nearer than
 * MIN_HUE_GAP, the one later in hue order steps away by the golden angle until it is clear (a
 * few steps at most): two notebooks never share a colour, whatever their ids hash to.
 */
export function huesOf(names: Iterable<string>): Map<string, number> {
  const hues = new Map<string, number>();
  const order = [...new Set(names)].map(name => [hueOf(name), name] as const);
  order.sort((a, b) => a[0] - b[0] || (a[1] < b[1] ? -1 : a[1] > b[1] ? 1 : 0));
  for (const [start, name] of order) {
    let hue = start;
    for (let step = 0; step < 8 && [...hues.values()].some(h => gap(h, hue) < MIN_HUE_GAP); step++) {
      hue = Math.round(hue + HUE_STEP) % 360;
    }
    hues.set(name, hue);
  }
  return hues;
}

function gap(a: number, b: number): number {
  const d = Math.abs(a - b) % 360;
  return Math.min(d, 360 - d);
}

/** FNV-1a with a final avalanche: nearby strings get unrelated numbers. */
function mix(text: string): number {
  let hash = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    hash = Math.imul(hash ^ text.charCodeAt(i), 0x01000193);
  }
  hash = Math.imul(hash ^ (hash >>> 16), 0x85ebca6b);
  hash = Math.imul(hash ^ (hash >>> 13), 0xc2b2ae35);
  return (hash ^ (hash >>> 16)) >>> 0;
}

/** Characters a cut name keeps at its end at least (".ipynb" and a few before it). */
export const MIN_TAIL = 12;
/** ...and at most, so the part before it still shows where the sidebar is narrow. */
export const MAX_TAIL = 24;

/**
 * Where to cut a name so that it stays told apart from `others` shown beside it: the view
 * shortens the head with an ellipsis and keeps the tail whole. The tail starts where the name
 * first differs from the most alike of the others ("kiwi-demo.ipynb" and
 * "kiwi-demo-partner.ipynb" keep "…demo.ipynb" and "…-partner.ipynb"), and is at least
 * MIN_TAIL and at most MAX_TAIL characters long.
 */
export function splitName(name: string, others: Iterable<string> = []): [string, string] {
  // Where the name first differs from the most alike of the others; null when there are none.
  let differsAt: number | null = null;
  for (const other of others) {
    if (other === name) {
      continue;
    }
    let common = 0;
    while (common < name.length && common < other.length && name[common] === other[common]) {
      common++;
    }
    differsAt = Math.max(differsAt ?? 0, common);
  }
  const wanted = differsAt === null ? MIN_TAIL : Math.max(MIN_TAIL, name.length - differsAt);
  let start = name.length - Math.min(MAX_TAIL, wanted, name.length);
  // Start the tail at a word where one is near ("demo.ipynb", not "i-demo.ipynb"), as long as it
  // still holds where the name differs from the others.
  const limit = differsAt ?? name.length;
  if (start > 0 && !SEPARATOR.test(name[start - 1])) {
    for (let i = start; i < name.length; i++) {
      if (SEPARATOR.test(name[i])) {
        if (i + 1 <= limit && name.length - (i + 1) >= MIN_WORD_TAIL) {
          start = i + 1;
        }
        break;
      }
    }
  }
  return [name.slice(0, start), name.slice(start)];
}

/** What ends a word in a notebook's name or path. */
const SEPARATOR = /[-_. /]/;
/** The shortest tail a cut at a word may leave. */
const MIN_WORD_TAIL = 8;

/** Who has the GPU, for a status bar that no kernel of its own is focused on. */
export interface IGpuGlance {
  /** Labels of the holders on the GPUs looked at. */
  holders: string[];
  /** How many wait for them. */
  waiting: number;
}

/**
 * The status bar's words. The focused kernel's own standing comes first ("GPU: holding",
 * "GPU: waiting #2"); where it has none (a Launcher, a terminal, an idle notebook) the bar says
 * who holds the GPU and how many wait, as the panel does, and "GPU: idle" only when nobody does.
 */
export function describeStanding(
  standing: KernelStanding,
  trans: TranslationBundle,
  glance: IGpuGlance = { holders: [], waiting: 0 }
): string {
  switch (standing.kind) {
    case 'holding':
      return trans.__('GPU: holding');
    case 'paused':
      return trans.__("GPU: holding, paused for another cell's turn");
    case 'waiting':
      return trans.__('GPU: waiting #%1', standing.position);
    case 'unreachable':
      return trans.__('GPU: scheduler unreachable');
    case 'idle':
    case 'no-kernel':
      return describeGlance(glance, trans);
  }
}

function describeGlance(glance: IGpuGlance, trans: TranslationBundle): string {
  const [first, ...more] = glance.holders;
  if (first === undefined) {
    return glance.waiting > 0 ? trans.__('GPU: %1 waiting', glance.waiting) : trans.__('GPU: idle');
  }
  const held =
    more.length === 0 ? trans.__('GPU: held by %1', first) : trans.__('GPU: held by %1 and %2 more', first, more.length);
  return glance.waiting > 0 ? trans.__('%1 · %2 waiting', held, glance.waiting) : held;
}

/**
 * The GPU's memory line, in words a notebook user can act on (nothing names a daemon flag).
 * The same words as kiwictl's and %kiwi's (nodeside/memory_words.py `memory_use_words`). With a
 * capacity: used of total. Without one (no NVIDIA driver where the scheduler runs, and no size
 * given to it), what the kernels report if they report anything, and that the size is not known
 * here; null when nothing is known (the text views say "its size is not known here"), so the
 * panel leaves the line out: no figure stands in for one nobody measured.
 */
export function describeMemory(used: number | null, total: number | null, trans: TranslationBundle): string | null {
  if (total === null) {
    return used ? trans.__("kernels use %1 (the GPU's size is not known here)", formatBytes(used)) : null;
  }
  if (used === null) {
    return trans.__('%1, its use not known here', formatBytes(total));
  }
  return trans.__('%1 of %2 used', formatBytes(used), formatBytes(total));
}

/** What a mode does, for the question before the panel changes it for the whole node. */
export function describeMode(mode: SchedulerMode, trans: TranslationBundle): string {
  switch (mode) {
    case 'on':
      return trans.__('ON: one kernel at a time holds the GPU, round robin by time quantum.');
    case 'off':
      return trans.__('OFF: every kernel uses the GPU at once, as without Kiwi.');
    case 'auto':
      return trans.__('AUTO: kernels run side by side while their memory fits, and take turns when it does not.');
  }
}

/** A residency in the words kiwictl and %kiwi use too: "on GPU", "moving out", ... */
export function describeResidency(residency: Residency, trans: TranslationBundle): string {
  switch (residency) {
    case 'resident':
      return trans.__('on GPU');
    case 'evicting':
      return trans.__('moving out');
    case 'evicted':
      return trans.__('in host memory');
    case 'restoring':
      return trans.__('moving in');
  }
}

/**
 * Where a kernel's memory is by tier, in the words kiwictl and %kiwi use too (`tier_words` in
 * nodeside/memory_words.py): "on GPU", "in host memory (24.0 GiB, 8.0 GiB pinned)",
 * "on disk (3.0 GiB)", "moving".
 */
export function describeTier(
  kernel: { tier: Tier; hostBytes: number; pinnedBytes: number; diskBytes: number },
  trans: TranslationBundle
): string {
  switch (kernel.tier) {
    case 'gpu':
      return trans.__('on GPU');
    case 'moving':
      return trans.__('moving');
    case 'disk':
      return trans.__('on disk (%1)', formatBytes(kernel.diskBytes));
    case 'host':
      return kernel.pinnedBytes > 0
        ? trans.__('in host memory (%1, %2 pinned)', formatBytes(kernel.hostBytes), formatBytes(kernel.pinnedBytes))
        : trans.__('in host memory (%1)', formatBytes(kernel.hostBytes));
  }
}

/** Why a kernel's last move between host memory and disk failed (`tier_failed_words`). */
export function describeTierFailed(reason: string, trans: TranslationBundle): string {
  return trans.__('could not move to or from disk: %1', reason);
}

/** The node's host memory beyond the budget line: "14.0 GiB pinned, 20.0 GiB on disk". */
export function describeSpill(spill: { pinned: number; spilled: number }, trans: TranslationBundle): string {
  return trans.__('%1 pinned, %2 on disk', formatBytes(spill.pinned), formatBytes(spill.spilled));
}

/** A client's memory: "10.0 GiB on GPU, 14.0 GiB in host memory". */
export function describeClientMemory(residentBytes: number, hostBytes: number, trans: TranslationBundle): string {
  return trans.__('%1 on GPU, %2 in host memory', formatBytes(residentBytes), formatBytes(hostBytes));
}

/** Where a kernel's memory figures come from, for the figures' tooltip. */
export function describeMemorySource(source: string | null, trans: TranslationBundle): string {
  switch (source) {
    case 'shim':
      return trans.__("as the kernel's CUDA shim reports them");
    case 'nvml':
      return trans.__('as NVML reads the process (more than the kernel reported)');
    case 'working_set':
      return trans.__('the working set the kernel declared (nothing measured yet)');
    default:
      return trans.__('source not said');
  }
}

/** What a waiting kernel waits for: "waiting for nbA.ipynb to move 24.0 GiB to host memory". */
export function describeWaitingFor(
  waiting: { label: string; bytes: number; action: WaitingAction },
  trans: TranslationBundle
): string {
  const size = formatBytes(waiting.bytes);
  switch (waiting.action) {
    case 'checkpoint':
      return trans.__('waiting for %1 to be checkpointed (%2 to host memory)', waiting.label, size);
    case 'restore':
      return trans.__('waiting for %1 to move %2 back onto the GPU', waiting.label, size);
    case 'evict':
      return trans.__('waiting for %1 to move %2 to host memory', waiting.label, size);
    case 'spill':
      return trans.__('waiting for %1 to move %2 to disk (the host memory budget is full)', waiting.label, size);
  }
}

/**
 * A GPU's resident memory against what the scheduler plans with, and the host RAM its evicted
 * kernels hold against the daemon's budget: two lines, the same figures as kiwictl's.
 */
export function describeResidentMemory(
  memory: { resident: number; capacity: number | null; host: number; hostBudget: number | null },
  trans: TranslationBundle
): [string, string] {
  const onGpu =
    memory.capacity === null
      ? trans.__("%1 on the GPU (the GPU's size is not known here)", formatBytes(memory.resident))
      : trans.__('%1 of %2 on the GPU', formatBytes(memory.resident), formatBytes(memory.capacity));
  const inHost =
    memory.hostBudget === null
      ? trans.__('%1 in host memory (no limit set)', formatBytes(memory.host))
      : trans.__('%1 of %2 in host memory', formatBytes(memory.host), formatBytes(memory.hostBudget));
  return [onGpu, inHost];
}

/** A pool's figures in plain words: "using 23% of the GPU; guaranteed 100%; no maximum". */
export function describePool(
  pool: { share: number; guarantee: number; maximum: number | null; belowGuarantee: boolean },
  trans: TranslationBundle
): string[] {
  const words = [
    trans.__('using %1 of the GPU', formatShare(pool.share)),
    pool.guarantee > 0 ? trans.__('guaranteed %1', formatShare(pool.guarantee)) : trans.__('nothing guaranteed'),
    pool.maximum === null ? trans.__('no maximum') : trans.__('at most %1', formatShare(pool.maximum))
  ];
  if (pool.belowGuarantee) {
    words.push(trans.__('below its guarantee: it goes first'));
  }
  return words;
}
