/**
 * The shapes the panel works with: the status document of docs/interfaces.md section 5 as the server
 * extension returns it (generated, in document.ts), the panel's settings and the command ids.
 * Types only; no behaviour lives here.
 */

// The status document's types are generated from the daemon's table of it
// (nodeside/protocol/document.py): see document.ts.
export type {
  ClientState,
  IClientStatus,
  IGpuStatus,
  IHeldSpan,
  IPoolGpuStatus,
  IPoolStatus,
  IStatusDocument,
  IWaitingFor,
  SchedulerMode
} from './document';
import type { IClientStatus, IWaitingFor, SchedulerMode } from './document';

/** Where a client's memory is (the status document's `residency`). */
export type Residency = NonNullable<IClientStatus['residency']>;

/** What a waiting client waits for another to do (the document's `waiting_for.action`). */
export type WaitingAction = IWaitingFor['action'];

/** Which tier a client's memory is in (the status document's `tier`, feature `tiers`). */
export type Tier = NonNullable<IClientStatus['tier']>;

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
