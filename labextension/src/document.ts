/**
 * The status document (CONTRACT section 5) as the server extension returns it.
 *
 * Generated from nodeside/protocol/document.py by `python -m nodeside.protocol.generate`: edit
 * the table there and run it, never this file (a test fails while the two differ).
 */

/** A client's state: holding includes a holder asked to give the GPU back. */
export type ClientState = 'idle' | 'waiting' | 'holding';

/** The scheduler's mode. */
export type SchedulerMode = 'on' | 'off' | 'auto';

/**
 * One hold in the scheduler's own history of a GPU: times are seconds before the document was
 * made.
 */
export interface IHeldSpan {
  /** The holder's client id. */
  client: string;
  name: string;
  display_name: string | null;
  user: string | null;
  /** Seconds before the document when the hold began. */
  started_ago: number;
  /** Seconds before the document when it ended; null while it holds. */
  ended_ago: number | null;
  /** `started_ago` under its first name, kept for the readers of older documents. */
  started: number;
  /** `ended_ago` under its first name, kept likewise. */
  ended: number | null;
}

/** What a waiter waits for besides its turn: another client to move memory out of the way. */
export interface IWaitingFor {
  /** The client id of who moves the memory. */
  client: string;
  /** Its display name. */
  name: string;
  /** How much it moves. */
  bytes: number;
  /**
   * What it does: `evict` or `checkpoint` (to host memory), `restore` (back onto the GPU),
   * `spill` (from host memory to disk: the node's host budget cannot hold the evictions the
   * waiter needs until it has).
   */
  action: 'evict' | 'checkpoint' | 'restore' | 'spill';
}

/** One GPU as the daemon reports it. */
export interface IGpuStatus {
  index: number;
  name: string;
  uuid: string | null;
  /** bytes */
  memory_total: number | null;
  /** bytes */
  memory_used: number | null;
  /** Client ids holding this GPU now (several only in mode off or auto). */
  holders: string[];
  /** Client ids waiting for it, next first. */
  queue: string[];
  /** Seconds left in the current holder's quantum; null when nobody holds or no quantum runs. */
  quantum_remaining: number | null;
  /** This GPU's time quantum, in seconds. */
  tq?: number;
  /** How the next holder is chosen: `round-robin` or `interactive` (absent from older daemons). */
  policy?: string;
  /** Why the first in the queue is next, in words; null when nobody waits. */
  next_reason?: string | null;
  /** Seconds of a turn when holders side by side take turns; 0 or absent: they do not. */
  turns?: number;
  /**
   * Why nothing is granted on this GPU (a failed checkpoint); null or absent when nothing is
   * held back.
   */
  evict_blocked?: string | null;
  /**
   * The holds of the last minutes, oldest first (the panel's timeline; absent from older
   * daemons).
   */
  recent_holders?: IHeldSpan[];
  /**
   * Bytes its clients have on it as the scheduler counts them: holders' needs, idle clients'
   * `counted_bytes`.
   */
  resident_bytes?: number;
  /** Bytes the scheduler plans with (`--gpu-memory` or NVML's total). */
  capacity?: number | null;
  /** Host memory held by its evicted clients (at most what the host has). */
  host_bytes?: number;
  /**
   * Host memory evicted memory may take on this node: the node's host budget where the daemon
   * plans with one (the config's `host_budget`, or where a client speaks `tiers`); otherwise
   * what it holds (its clients' `host_bytes`, or their `shadow_bytes` where larger) plus the
   * host's MemAvailable; at most the host's MemTotal (a process's cgroup may allow less);
   * null where that cannot be read.
   */
  host_budget?: number | null;
  /**
   * Pinned host memory its clients keep (shadows, staging): part of `host_bytes` the host's
   * OS cannot page.
   */
  pinned_bytes?: number;
  /** Bytes its clients keep in spill files on the node's disk. */
  spill_bytes?: number;
}

/** One scheduling client: a kernel registers under its Jupyter kernel id as `name`. */
export interface IClientStatus {
  id: string;
  name: string;
  pid: number | null;
  gpu: number;
  pool: string;
  priority: 'HIGH' | 'NORMAL' | 'LOW';
  state: ClientState;
  /** 1-based; null while not waiting. */
  queue_position: number | null;
  /** bytes */
  working_set: number;
  /** Wall time it has held a GPU. */
  gpu_seconds: number;
  /** What people call it (a kernel's notebook path); falls back to `name`. */
  display_name?: string | null;
  /** The user name of the client's process, when the daemon knows it. */
  user?: string | null;
  /** Holding, but paused while a holder beside it has its turn (mode auto, taking turns). */
  paused?: boolean;
  /** `kernel`, `shim` or `client`. */
  kind?: string;
  /**
   * How its memory leaves the GPU: the shim's mapped (vmm) or managed memory, or the driver's
   * checkpoint.
   */
  evict?: 'managed' | 'checkpoint' | 'vmm';
  /** The Kubernetes namespace verified for it; null when none (or hidden from this viewer). */
  namespace?: string | null;
  /**
   * Its labels (a pod's name, a namespace); absent for a viewer who may not see them, or when
   * the document had to be cut.
   */
  labels?: Record<string, string>;
  /** Seconds it has waited; null while not waiting. */
  waiting_since?: number | null;
  /** Checkpointed clients: running, checkpointing, checkpointed, restoring or failed. */
  checkpoint_state?: string;
  /** Why its last checkpoint failed. */
  checkpoint_error?: string | null;
  /** Where its memory is: on the GPU, moving out, in host memory, moving in. */
  residency?: 'resident' | 'evicting' | 'evicted' | 'restoring';
  /**
   * Bytes on the GPU now, on the best evidence: NVML's figure for its process where the
   * daemon reads one, else its own report.
   */
  resident_bytes?: number;
  /**
   * What of `resident_bytes` counts against others' room while it is idle (0 once it could
   * not evict and only its own report says it holds them).
   */
  counted_bytes?: number;
  /**
   * Why it could not evict (or holds no GPU memory, by its checkpoint); it is not asked again
   * until its next grant. Null: nothing failed.
   */
  evict_failed?: string | null;
  /** Evictions of others asked so far for its grants. */
  evictions_asked?: number;
  /** Bytes in host memory now (at most what the host has). */
  host_bytes?: number;
  /**
   * Host memory it keeps for its evictions (the vmm evictor's shadows, made ahead; they hold
   * `host_bytes` while evicted).
   */
  shadow_bytes?: number;
  /** The tier its memory is in: the GPU, host memory, the node's disk, or moving between two. */
  tier?: 'gpu' | 'host' | 'disk' | 'moving';
  /** Bytes in its spill files now. */
  disk_bytes?: number;
  /** Of `host_bytes` and `shadow_bytes`, the bytes that are pinned. */
  pinned_bytes?: number;
  /**
   * Why its last move between host memory and disk failed (a full or failing disk: the memory
   * stayed where it was). Null: nothing failed.
   */
  tier_failed?: string | null;
  /**
   * Where `resident_bytes` comes from: NVML wherever it vouches for the process, else its
   * reports.
   */
  memory_source?: 'shim' | 'nvml' | 'working_set';
  /** What it waits for besides its turn; null: nothing. */
  waiting_for?: IWaitingFor | null;
  /**
   * Pauses this `pausable` client was seen working through (NVML's per-process samples);
   * absent when none.
   */
  pause_ignored?: number;
}

/** A pool on one GPU. */
export interface IPoolGpuStatus {
  index?: number;
  /** Fraction of this GPU's time over the share window. */
  share?: number;
  /** Null while the pool does not contend for this GPU. */
  entitlement?: number | null;
  holding?: number;
  waiting?: number;
  /** Why the pool waits here, when it waits for a reason worth telling. */
  stuck?: string | null;
  below_guarantee?: boolean;
}

/** A pool's share of GPU time against what it is promised (fractions of one GPU). */
export interface IPoolStatus {
  name: string;
  guarantee: number;
  weight: number;
  /** -1 means no maximum. */
  maximum: number;
  share: number;
  clients: number;
  /** Among the pools with a client holding or waiting, node-wide; null when not contending. */
  entitlement?: number | null;
  /** How many of its clients wait. */
  waiting?: number;
  /** How many of its clients hold a GPU. */
  holding?: number;
  /** The config's `pools:` section names it. */
  configured?: boolean;
  /** Guarantee, weight and maximum all configured. */
  complete?: boolean;
  /** What its configuration leaves out. */
  missing?: string[];
  /** Names of the waiting clients, next first. */
  waiting_clients?: string[];
  /** Why the pool waits, when it waits for a reason worth telling. */
  stuck?: string | null;
  /** The daemon's verdict: the pool contends and gets less than its guarantee. */
  below_guarantee?: boolean;
  /** The pool on each GPU. */
  gpus?: IPoolGpuStatus[];
}

/** `GET kiwi/api/status`: the status document plus whether the daemon answered. */
export interface IStatusDocument {
  reachable: boolean;
  /** Why the daemon could not be reached, when it could not. */
  reason?: string;
  /** The socket the server talks to, for the unreachable message. */
  socket?: string;
  /**
   * The user the server runs as: the panel names this user's own clients without "(user)", as
   * kiwictl does the user's who runs it.
   */
  viewer?: string;
  version?: number;
  mode?: SchedulerMode;
  tq?: number;
  gpus?: IGpuStatus[];
  clients?: IClientStatus[];
  pools?: IPoolStatus[];
  /** How the next holder is chosen on every GPU. */
  policy?: string;
  /** The names the config's `pools:` section gives, sorted; empty when it gives none. */
  configured_pools?: string[];
  /** Whether a request may cut a holder's quantum short. */
  preemption?: boolean;
  /** Why preemption is off. */
  preemption_off_reason?: string | null;
  /** The clients' labels were left out to keep the document within what a client reads. */
  labels_omitted?: boolean;
  /** Long-poll answers only: the document's tag, to name in the next `?after=`. */
  etag?: string;
  /**
   * Long-poll answers only: true when the server hears the daemon's changes, so asking again
   * at once waits for the next one; false when it does not (poll at the refresh rate).
   */
  pushed?: boolean;
}
