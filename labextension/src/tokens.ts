/**
 * The shapes the panel works with: the status document of CONTRACT section 5 as the server
 * extension returns it, and the command ids. Types only; no behaviour lives here.
 */

/** One GPU as the daemon reports it. */
export interface IGpuStatus {
  index: number;
  name: string;
  uuid: string | null;
  memory_total: number | null;
  memory_used: number | null;
  /** Client ids holding this GPU now (several only in mode off or auto). */
  holders: string[];
  /** Client ids waiting for it, next first. */
  queue: string[];
  /** Seconds left in the current holder's quantum; null when nobody holds or no quantum runs. */
  quantum_remaining: number | null;
  /** How the next holder is chosen: `round-robin` or `interactive` (absent from older daemons). */
  policy?: string;
  /** Why the first in the queue is next, in words; null when nobody waits. */
  next_reason?: string | null;
  /** Seconds of a turn when holders side by side take turns; 0 or absent: they do not. */
  turns?: number;
  /** Why nothing is granted on this GPU (a failed checkpoint); null or absent when nothing is held back. */
  evict_blocked?: string | null;
}

export type ClientState = 'idle' | 'waiting' | 'holding';

/** One scheduling client: a kernel registers under its Jupyter kernel id as `name`. */
export interface IClientStatus {
  id: string;
  name: string;
  pid: number | null;
  gpu: number;
  pool: string;
  priority: 'HIGH' | 'NORMAL' | 'LOW';
  state: ClientState;
  queue_position: number | null;
  working_set: number;
  gpu_seconds: number;
  /** What people call it (a kernel's notebook path); falls back to `name`. */
  display_name?: string | null;
  /** The user name of the client's process, when the daemon knows it. */
  user?: string | null;
  /** How its memory leaves the GPU: the shim's managed memory, or the driver's checkpoint. */
  evict?: 'managed' | 'checkpoint';
  /** Checkpointed clients: running, checkpointing, checkpointed, restoring or failed. */
  checkpoint_state?: string;
  /** Holding, but paused while a holder beside it has its turn (mode auto, taking turns). */
  paused?: boolean;
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
  /** The daemon's verdict: the pool contends and gets less than its guarantee. */
  below_guarantee?: boolean;
}

export type SchedulerMode = 'on' | 'off' | 'auto';

/** `GET kiwi/api/status`: the status document plus whether the daemon answered. */
export interface IStatusDocument {
  reachable: boolean;
  /** Why the daemon could not be reached, when it could not. */
  reason?: string;
  /** The socket the server talks to, for the unreachable message. */
  socket?: string;
  version?: number;
  mode?: SchedulerMode;
  tq?: number;
  gpus?: IGpuStatus[];
  clients?: IClientStatus[];
  pools?: IPoolStatus[];
  /** Long-poll answers only: the document's tag, to name in the next `?after=`. */
  etag?: string;
  /** Long-poll answers only: true when the server hears the daemon's changes, so asking again
   * at once waits for the next one; false when it does not (poll at the refresh rate). */
  pushed?: boolean;
}

/** `POST kiwi/api/scheduler`: either field or both. */
export interface ISchedulerChange {
  mode?: SchedulerMode;
  tq?: number;
}

/** The panel's settings (schema/plugin.json). */
export interface IKiwiSettings {
  /** Milliseconds between two status requests while all is well. */
  refreshRate: number;
  /** Seconds of holder history the timeline shows. */
  timelineWindow: number;
}

export const DEFAULT_SETTINGS: IKiwiSettings = { refreshRate: 500, timelineWindow: 300 };

export namespace CommandIDs {
  export const openPanel = 'kiwi:open-panel';
  export const refresh = 'kiwi:refresh';
  export const setMode = 'kiwi:set-mode';
}
