/**
 * The panel's model: the latest status document, turned into what the views show.
 *
 * Pure state and no I/O, so every rule here is tested with Jest by feeding documents and clock
 * readings (seconds). The poller feeds it; the sidebar panel and the status bar item read it.
 */

import { ISignal, Signal } from '@lumino/signaling';

import { clientLabel, hueOf, huesOf } from './format';
import type { IGpuGlance } from './format';
import type { INvmlGpu, INvmlReading } from './nvml';
import {
  IClientStatus,
  IGpuStatus,
  IHeldSpan,
  IStatusDocument,
  SchedulerMode
} from './tokens';
import type {
  KernelStanding,
  IWaitingForView,
  IMemoryShare,
  IGpuMemoryView,
  IGpuView,
  IPoolView,
  ITimelineEntry
} from './views';

/** A span's time in seconds before its document: `started_ago`/`ended_ago`, or, from an older
 * daemon that sends only their first names, `started`/`ended`. */
function agoOf(span: IHeldSpan, which: 'started'): number;
function agoOf(span: IHeldSpan, which: 'ended'): number | null;
function agoOf(span: IHeldSpan, which: 'started' | 'ended'): number | null {
  const value = which === 'started' ? span.started_ago ?? span.started : span.ended_ago ?? span.ended;
  return value ?? null;
}

export interface IKiwiModelOptions {
  /** Seconds of holder history kept for the timeline. */
  timelineWindow?: number;
  /** Most timeline entries kept, whatever their age. */
  maxTimelineEntries?: number;
}

const UUID_PREFIX = /^[0-9a-f]{8}-[0-9a-f]{4}-/i;

export class KiwiModel {
  constructor(options: IKiwiModelOptions = {}) {
    this.timelineWindow = options.timelineWindow ?? 300;
    this._maxTimelineEntries = options.maxTimelineEntries ?? 50;
  }

  /** Emitted after every document, failure or change of the current kernel. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Seconds of history the timeline shows. */
  timelineWindow: number;

  /** Whether the last request reached the daemon (through the server). */
  get reachable(): boolean {
    return this._document?.reachable ?? false;
  }

  /** False until the first answer or failure: the panel says "connecting", not "unreachable". */
  get loaded(): boolean {
    return this._document !== null;
  }

  /** Why the daemon is unreachable, in the words of whoever failed. */
  get unreachableReason(): string {
    return this._document?.reason ?? '';
  }

  get socket(): string {
    return this._document?.socket ?? '';
  }

  /** How many clients the scheduler has registered (every notebook's kernel on the node). */
  get clientCount(): number {
    return this._document?.clients?.length ?? 0;
  }

  get mode(): SchedulerMode | null {
    return this.reachable ? this._document?.mode ?? null : null;
  }

  get tq(): number | null {
    return this.reachable ? this._document?.tq ?? null : null;
  }

  /** The Jupyter kernel id of the notebook in focus; kernels register under it as their name. */
  get kernelId(): string | null {
    return this._kernelId;
  }

  set kernelId(id: string | null) {
    if (id === this._kernelId) {
      return;
    }
    this._kernelId = id;
    this._changed.emit();
  }

  /** Readable names (notebook paths) for kernel ids, from the session manager. */
  setKernelLabels(labels: ReadonlyMap<string, string>): void {
    this._kernelLabels = new Map(labels);
    this._changed.emit();
  }

  /** Kernels (by their ids) the scheduler knows that no running session names yet. */
  unlabelledKernels(): string[] {
    return (this._document?.clients ?? [])
      .map(c => c.name)
      .filter(name => UUID_PREFIX.test(name) && !this._kernelLabels.has(name));
  }

  /** Take a fresh status document received at `now` (seconds). */
  update(document: IStatusDocument, now: number): void {
    this._document = document;
    this._hues = null;
    this._receivedAt = now;
    this._clientsById = new Map((document.clients ?? []).map(c => [c.id, c]));
    const gpus: IGpuStatus[] = document.reachable ? document.gpus ?? [] : [];
    if (gpus.length > 0 && gpus.every(gpu => Array.isArray(gpu.recent_holders))) {
      this._takeHistory(gpus, now);
    } else {
      this._recordHolders(gpus, now);
    }
    this._changed.emit();
  }

  /** What NVML reads on the server's machine (`kiwi/api/nvml`), or that it cannot. */
  setNvml(reading: INvmlReading): void {
    this._nvml = reading;
    this._changed.emit();
  }

  /** The GPUs NVML reads on the server's machine; none where there is no NVML. */
  nvml(): INvmlGpu[] {
    return this._nvml?.nvml ? this._nvml.gpus ?? [] : [];
  }

  /**
   * Who holds the GPUs and how many wait, for a status bar with no kernel of its own in focus:
   * the focused kernel's GPU when it has registered, else every GPU.
   */
  glance(): IGpuGlance {
    if (!this.reachable) {
      return { holders: [], waiting: 0 };
    }
    const mine = new Set(this._myClients().map(c => c.gpu));
    const gpus = (this._document?.gpus ?? []).filter(gpu => mine.size === 0 || mine.has(gpu.index));
    return {
      holders: gpus.flatMap(gpu => gpu.holders.map(id => this.labelFor(id))),
      waiting: gpus.reduce((sum, gpu) => sum + gpu.queue.length, 0)
    };
  }

  /** Every client label the panel shows at `now`, so names can be cut apart from each other. */
  labels(now: number): string[] {
    const shown = new Set<string>();
    for (const gpu of this.gpus(now)) {
      gpu.holders.forEach(h => shown.add(h.label));
      gpu.queue.forEach(q => shown.add(q.label));
      gpu.memory?.kernels.forEach(k => shown.add(k.label));
    }
    this.timeline(now).forEach(e => shown.add(e.label));
    return [...shown];
  }

  /** The server itself could not be asked (network error, server gone). */
  fail(reason: string, now: number): void {
    this.update({ reachable: false, reason }, now);
  }

  /** Where the focused notebook's kernel stands. */
  standing(): KernelStanding {
    if (!this.reachable) {
      return { kind: 'unreachable' };
    }
    const mine = this._myClients();
    if (this._kernelId === null || mine.length === 0) {
      return this._kernelId === null ? { kind: 'no-kernel' } : { kind: 'idle' };
    }
    const holding = mine.filter(c => c.state === 'holding');
    if (holding.length > 0) {
      return holding.every(c => c.paused === true) ? { kind: 'paused' } : { kind: 'holding' };
    }
    const positions = mine
      .filter(c => c.state === 'waiting' && c.queue_position !== null)
      .map(c => c.queue_position as number);
    if (positions.length > 0) {
      return { kind: 'waiting', position: Math.min(...positions) };
    }
    return { kind: 'idle' };
  }

  gpus(now: number): IGpuView[] {
    if (!this.reachable) {
      return [];
    }
    return (this._document?.gpus ?? []).map(gpu => this._gpuView(gpu, now));
  }

  pools(): IPoolView[] {
    if (!this.reachable) {
      return [];
    }
    return (this._document?.pools ?? []).map(p => ({
      name: p.name,
      share: p.share,
      guarantee: p.guarantee,
      maximum: p.maximum < 0 ? null : p.maximum,
      clients: p.clients,
      belowGuarantee: p.below_guarantee ?? false
    }));
  }

  /** Holder stretches that overlap the last `timelineWindow` seconds, oldest first. */
  timeline(now: number): ITimelineEntry[] {
    const since = now - this.timelineWindow;
    return this._timeline
      .filter(e => e.end === null || e.end >= since)
      .map(e => ({ ...e, label: this.labelFor(e.clientId), mine: this._isMine(e.clientId) }));
  }

  /**
   * What a client's colour follows: its name, the key it registered under (a notebook's kernel
   * id), which outlives the daemon's ids: those are numbered again after a scheduler restart,
   * and when a kernel registers again (its stand-in GPU), and a colour must not change then.
   */
  colourKey(clientId: string): string {
    return this._clientsById.get(clientId)?.name ?? this._lastNames.get(clientId) ?? clientId;
  }

  /** A client's hue: format.huesOf over every client the document and the timeline name, so
   * that two shown together are far apart, the same in every tab and after a restart. */
  hueFor(clientId: string): number {
    if (this._hues === null) {
      const names = [...this._clientsById.values()].map(c => c.name);
      this._timeline.forEach(e => names.push(this.colourKey(e.clientId)));
      this._hues = huesOf(names);
    }
    return this._hues.get(this.colourKey(clientId)) ?? hueOf(this.colourKey(clientId));
  }

  /**
   * What to call a client, as every view does (format.clientLabel): its notebook (this server's
   * session for it, which follows a rename at once; else the display name it registered), else
   * its name; with its user unless that is the user the server runs as (this server's own
   * kernels are all that user's, and kiwictl leaves its own user out the same way). The view
   * cuts long labels in front (format.splitName) and keeps the whole label in the tooltip.
   */
  labelFor(clientId: string): string {
    const client = this._clientsById.get(clientId);
    const name = client?.name ?? this._lastNames.get(clientId) ?? clientId;
    const known = client ?? this._lastPeople.get(clientId);
    const session = this._kernelLabels.get(name);
    return clientLabel(name, session ?? known?.display_name, session ? null : known?.user, this._document?.viewer);
  }

  private _gpuView(gpu: IGpuStatus, now: number): IGpuView {
    const elapsed = Math.max(0, now - this._receivedAt);
    const fraction =
      gpu.memory_total && gpu.memory_used !== null && gpu.memory_total > 0
        ? Math.min(1, gpu.memory_used / gpu.memory_total)
        : null;
    const queue = gpu.queue.map((clientId, i) => {
      const client = this._clientsById.get(clientId);
      return {
        position: i + 1,
        clientId,
        label: this.labelFor(clientId),
        mine: this._isMine(clientId),
        pool: client?.pool ?? '',
        priority: client?.priority ?? '',
        evict: this._evictOf(clientId),
        waitingFor: this._waitingForOf(client)
      };
    });
    return {
      index: gpu.index,
      name: gpu.name,
      memoryUsed: gpu.memory_used,
      memoryTotal: gpu.memory_total,
      memoryFraction: fraction,
      holders: gpu.holders.map(clientId => ({
        clientId,
        label: this.labelFor(clientId),
        mine: this._isMine(clientId),
        evict: this._evictOf(clientId),
        paused: this._clientsById.get(clientId)?.paused === true
      })),
      evictBlocked: gpu.evict_blocked ?? null,
      quantumLeft:
        gpu.quantum_remaining === null ? null : Math.max(0, gpu.quantum_remaining - elapsed),
      queue,
      policy: gpu.policy ?? null,
      nextReason: gpu.queue.length > 0 ? gpu.next_reason ?? null : null,
      turns: gpu.turns ? gpu.turns : null,
      memory: this._memoryOf(gpu)
    };
  }

  /**
   * The GPU's memory split by kernel, from the keys a memory-keeping daemon adds (null from
   * any other, which the view then leaves out).
   */
  private _memoryOf(gpu: IGpuStatus): IGpuMemoryView | null {
    if (gpu.resident_bytes === undefined) {
      return null;
    }
    const kernels: IMemoryShare[] = [];
    for (const client of this._document?.clients ?? []) {
      if (client.gpu !== gpu.index || client.residency === undefined) {
        continue;
      }
      kernels.push({
        clientId: client.id,
        label: this.labelFor(client.id),
        mine: this._isMine(client.id),
        residency: client.residency,
        residentBytes: client.resident_bytes ?? 0,
        hostBytes: client.host_bytes ?? 0,
        tiers: client.tier === undefined ? null : {
          tier: client.tier,
          hostBytes: client.host_bytes ?? 0,
          pinnedBytes: client.pinned_bytes ?? 0,
          diskBytes: client.disk_bytes ?? 0,
          failed: client.tier_failed ?? null
        },
        source: client.memory_source ?? null,
        waitingFor: this._waitingForOf(client)
      });
    }
    return {
      resident: gpu.resident_bytes,
      capacity: gpu.capacity ?? null,
      host: gpu.host_bytes ?? 0,
      hostBudget: gpu.host_budget ?? null,
      spill: gpu.spill_bytes === undefined ? null : { pinned: gpu.pinned_bytes ?? 0, spilled: gpu.spill_bytes },
      kernels
    };
  }

  private _waitingForOf(client: IClientStatus | undefined): IWaitingForView | null {
    const waiting = client?.waiting_for;
    if (!waiting) {
      return null;
    }
    // Named as the panel names it elsewhere when the document lists it, else as the daemon did.
    const known = this._clientsById.has(waiting.client);
    return {
      clientId: waiting.client,
      label: known ? this.labelFor(waiting.client) : waiting.name,
      bytes: waiting.bytes,
      action: waiting.action
    };
  }

  private _evictOf(clientId: string): string {
    const client = this._clientsById.get(clientId);
    const evict = client?.evict ?? 'managed';
    const state = client?.checkpoint_state;
    return state && state !== 'running' ? `${evict} (${state})` : evict;
  }

  private _myClients(): IClientStatus[] {
    return (this._document?.clients ?? []).filter(c => c.name === this._kernelId);
  }

  private _isMine(clientId: string): boolean {
    if (this._kernelId === null) {
      return false;
    }
    const name = this._clientsById.get(clientId)?.name ?? this._lastNames.get(clientId);
    return name === this._kernelId;
  }

  /**
   * The timeline from the scheduler's own history: the same in every tab and after a reload,
   * and with holds no document showed (one that began and ended between two of them).
   */
  private _takeHistory(gpus: IGpuStatus[], now: number): void {
    this._open.clear();
    this._timeline = gpus.flatMap(gpu =>
      (gpu.recent_holders ?? []).map(span => {
        this._lastNames.set(span.client, span.name);
        this._lastPeople.set(span.client, { display_name: span.display_name, user: span.user });
        return {
          gpu: gpu.index,
          clientId: span.client,
          label: '',
          mine: false,
          start: now - agoOf(span, 'started'),
          end: agoOf(span, 'ended') === null ? null : now - (agoOf(span, 'ended') as number)
        };
      })
    );
    this._timeline.sort((a, b) => a.start - b.start);
    this._forgetOld(now);
  }

  /**
   * For a daemon that keeps no history (older ones): open a timeline entry for each new holder
   * and close the entries of those that stopped. Snapshots are all we see, so a hold shorter than one refresh may be missed: the timeline is
   * a picture of recent turns, not an audit log (the daemon's gpu_seconds is the exact count).
   */
  private _recordHolders(gpus: IGpuStatus[], now: number): void {
    const current = new Set<string>();
    for (const gpu of gpus) {
      for (const clientId of gpu.holders) {
        current.add(`${gpu.index}\u0000${clientId}`);
      }
    }
    for (const [key, entry] of this._open) {
      if (!current.has(key)) {
        entry.end = now;
        this._open.delete(key);
      }
    }
    for (const gpu of gpus) {
      for (const clientId of gpu.holders) {
        const key = `${gpu.index}\u0000${clientId}`;
        const client = this._clientsById.get(clientId);
        if (client !== undefined) {
          this._lastNames.set(clientId, client.name);
          this._lastPeople.set(clientId, { display_name: client.display_name, user: client.user });
        }
        if (!this._open.has(key)) {
          const entry: ITimelineEntry = {
            gpu: gpu.index,
            clientId,
            label: '',
            mine: false,
            start: now,
            end: null
          };
          this._open.set(key, entry);
          this._timeline.push(entry);
        }
      }
    }
    this._forgetOld(now);
  }

  private _forgetOld(now: number): void {
    const since = now - this.timelineWindow;
    this._timeline = this._timeline.filter(e => e.end === null || e.end >= since);
    const excess = this._timeline.length - this._maxTimelineEntries;
    if (excess > 0) {
      const dropped = this._timeline.splice(0, excess);
      for (const entry of dropped) {
        if (entry.end === null) {
          this._open.delete(`${entry.gpu}\u0000${entry.clientId}`);
        }
      }
    }
    const live = new Set(this._timeline.map(e => e.clientId));
    for (const clientId of [...this._lastNames.keys()]) {
      if (!live.has(clientId) && !this._clientsById.has(clientId)) {
        this._lastNames.delete(clientId);
        this._lastPeople.delete(clientId);
      }
    }
  }

  private _changed = new Signal<this, void>(this);
  private _document: IStatusDocument | null = null;
  private _nvml: INvmlReading | null = null;
  private _receivedAt = 0;
  private _clientsById = new Map<string, IClientStatus>();
  private _kernelId: string | null = null;
  private _kernelLabels = new Map<string, string>();
  private _timeline: ITimelineEntry[] = [];
  private _open = new Map<string, ITimelineEntry>();
  /** Hues of the clients shown now (hueFor), made again with each document. */
  private _hues: Map<string, number> | null = null;
  /** Names of clients that left while still on the timeline, so their entries stay labelled. */
  private _lastNames = new Map<string, string>();
  /** Their display names and users, likewise. */
  private _lastPeople = new Map<string, Pick<IClientStatus, 'display_name' | 'user'>>();
  private _maxTimelineEntries: number;
}
