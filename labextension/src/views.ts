/**
 * What the panel's model hands its views: each GPU, pool and timeline entry as shown, worked out
 * from the status document (model.ts). Types only.
 */

import type { Residency, Tier, WaitingAction } from './tokens';

/** Where this notebook's kernel stands with the GPU. */
export type KernelStanding =
  | { kind: 'unreachable' }
  | { kind: 'no-kernel' }
  | { kind: 'idle' }
  | { kind: 'holding' }
  | { kind: 'paused' }
  | { kind: 'waiting'; position: number };

export interface IHolderView {
  clientId: string;
  label: string;
  mine: boolean;
  /** 'managed' or 'checkpoint', with the checkpoint's state when it is not running. */
  evict: string;
  /** Holding, but paused while another holder has its turn. */
  paused: boolean;
}

export interface IQueueEntry {
  position: number;
  clientId: string;
  label: string;
  mine: boolean;
  pool: string;
  priority: string;
  evict: string;
  /** What it waits for beside its turn (another kernel's memory to move), or null. */
  waitingFor: IWaitingForView | null;
}

/** What a waiting kernel waits for: another kernel to move memory. */
export interface IWaitingForView {
  clientId: string;
  label: string;
  bytes: number;
  action: WaitingAction;
}

/** One kernel's memory on a GPU: its part of the GPU's bar and its row under it. */
export interface IMemoryShare {
  clientId: string;
  label: string;
  mine: boolean;
  residency: Residency;
  residentBytes: number;
  hostBytes: number;
  /** Its tier and bytes by tier, from a daemon with tiers (issue 42); null from any other. */
  tiers: IKernelTiers | null;
  /** Where the figures come from: 'shim', 'nvml' or 'working_set'; null when not said. */
  source: string | null;
  waitingFor: IWaitingForView | null;
}

/** Where one kernel's memory is by tier. */
export interface IKernelTiers {
  tier: Tier;
  hostBytes: number;
  pinnedBytes: number;
  diskBytes: number;
  /** Why its last move between host memory and disk failed; null: nothing failed. */
  failed: string | null;
}

/** A GPU's memory from a daemon that keeps each kernel's resident memory. */
export interface IGpuMemoryView {
  /** Bytes its kernels have on it, summed. */
  resident: number;
  /** The bytes the scheduler plans with; null when unknown. */
  capacity: number | null;
  /** Host RAM its evicted kernels hold. */
  host: number;
  /** The host RAM evicted memory may take; null: no limit set. */
  hostBudget: number | null;
  /** Pinned host memory and bytes spilled to disk, from a daemon with tiers; else null. */
  spill: { pinned: number; spilled: number } | null;
  /** Every kernel on the GPU, in the document's order. */
  kernels: IMemoryShare[];
}

export interface IGpuView {
  index: number;
  name: string;
  memoryUsed: number | null;
  memoryTotal: number | null;
  /** used / total in [0, 1], or null when either is unknown. */
  memoryFraction: number | null;
  holders: IHolderView[];
  /** Why nothing is granted on this GPU now (a failed checkpoint), or null. */
  evictBlocked: string | null;
  /** Seconds left in the holder's quantum, counted down since the document arrived. */
  quantumLeft: number | null;
  queue: IQueueEntry[];
  /** The scheduling policy, null when the daemon does not say. */
  policy: string | null;
  /** Why the first in the queue goes next, null when nobody waits or the daemon does not say. */
  nextReason: string | null;
  /** Seconds of a turn when the holders take turns, null when they do not. */
  turns: number | null;
  /** Where its kernels' memory is; null from a daemon that does not say. */
  memory: IGpuMemoryView | null;
}

export interface IPoolView {
  name: string;
  share: number;
  guarantee: number;
  /** null: the pool has no maximum (-1 in the document). */
  maximum: number | null;
  clients: number;
  /** The daemon says the pool contends and gets less than its guarantee (its rule, not ours). */
  belowGuarantee: boolean;
}

/** One stretch of time during which a client held a GPU. */
export interface ITimelineEntry {
  gpu: number;
  clientId: string;
  label: string;
  mine: boolean;
  start: number;
  /** null while it still holds. */
  end: number | null;
}
