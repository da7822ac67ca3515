/** Small formatting rules shared by the panel and the status bar item; pure, tested with Jest. */

import type { TranslationBundle } from '@jupyterlab/translation';

import type { KernelStanding } from './model';

const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];

/** Bytes in binary units with three significant digits: 8589934592 -> "8.00 GiB". */
export function formatBytes(bytes: number | null): string {
  if (bytes === null || !Number.isFinite(bytes) || bytes < 0) {
    return '?';
  }
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < UNITS.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${value} B` : `${value.toPrecision(3)} ${UNITS[unit]}`;
}

/** A duration for people: "0.4 s", "12 s", "2 min 5 s". */
export function formatSeconds(seconds: number | null): string {
  if (seconds === null || !Number.isFinite(seconds)) {
    return '–';
  }
  const s = Math.max(0, seconds);
  if (s < 10) {
    return `${s.toFixed(1)} s`;
  }
  // Round to whole seconds before splitting: 119.6 s is "2 min", never "1 min 60 s".
  const whole = Math.round(s);
  if (whole < 60) {
    return `${whole} s`;
  }
  const minutes = Math.floor(whole / 60);
  const rest = whole - minutes * 60;
  return rest === 0 ? `${minutes} min` : `${minutes} min ${rest} s`;
}

/** A fraction of one GPU's time as a percentage: 0.35 -> "35%". */
export function formatShare(fraction: number | null): string {
  if (fraction === null || !Number.isFinite(fraction)) {
    return '–';
  }
  return `${Math.round(fraction * 100)}%`;
}

/** A stable hue per client, so a client keeps its colour across the timeline and the queue. */
export function hueOf(id: string): number {
  let hash = 0;
  for (let i = 0; i < id.length; i++) {
    hash = (hash * 31 + id.charCodeAt(i)) | 0;
  }
  return Math.abs(hash) % 360;
}

/** The words for a standing; the model decides the standing, this only names it. */
export function describeStanding(standing: KernelStanding, trans: TranslationBundle): string {
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
      return trans.__('GPU: idle');
  }
}

/**
 * The GPU's memory line. Without a capacity (no NVML on the node and no `--gpu-memory` given to
 * the scheduler) it reads the same whether the GPU is idle or busy, and says why; what the
 * clients use is then shown after it, not instead of it.
 */
export function describeMemory(used: number | null, total: number | null, trans: TranslationBundle): string {
  if (total === null) {
    const unknown = trans.__('capacity unknown (no NVML, no --gpu-memory)');
    return used ? trans.__('%1; %2 in use', unknown, formatBytes(used)) : unknown;
  }
  return trans.__('%1 of %2', formatBytes(used ?? 0), formatBytes(total));
}
