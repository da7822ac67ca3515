/**
 * The "Kiwi GPU" sidebar: a view of KiwiModel, redrawn on each change. The controls (mode, TQ)
 * are built once and kept, so a redraw never steals focus from a half-typed TQ.
 */

import { ITranslator, TranslationBundle } from '@jupyterlab/translation';
import { Widget } from '@lumino/widgets';

import { SchedulerControls } from './controls';
import { el } from './dom';
import {
  describeClientMemory,
  describeMemory,
  describeMemorySource,
  describePool,
  describeResidency,
  describeResidentMemory,
  describeSpill,
  describeTier,
  describeTierFailed,
  describeWaitingFor,
  formatBytes,
  formatSeconds,
  splitName
} from './format';
import { KiwiModel } from './model';
import { INvmlGpu } from './nvml';
import { ISchedulerChange } from './tokens';
import type { IGpuMemoryView, IGpuView, IMemoryShare, IPoolView, ITimelineEntry } from './views';

export interface IKiwiPanelOptions {
  model: KiwiModel;
  translator: ITranslator;
  /** Sends a change to the server; resolves when it is applied. */
  changeScheduler: (change: ISchedulerChange) => Promise<void>;
}

export class KiwiPanel extends Widget {
  constructor(options: IKiwiPanelOptions) {
    super();
    this._model = options.model;
    this._trans = options.translator.load('kiwi_jupyter');
    this.id = 'jp-kiwi-panel';
    this.addClass('jp-Kiwi-panel');
    this.title.caption = this._trans.__('Kiwi GPU');

    this._body = el('div', 'jp-Kiwi-body');
    this._controls = new SchedulerControls(this._model, this._trans, options.changeScheduler);
    this.node.append(
      el('header', 'jp-Kiwi-header', el('h2', 'jp-Kiwi-title', this._trans.__('Kiwi GPU'))),
      this._controls.node,
      this._body
    );
    this._model.changed.connect(this._render, this);
    this._render();
    // Documents now come on change only: the quantum's countdown and the timeline move on
    // between them, so the view is redrawn each second while it shows.
    this._ticker = setInterval(() => {
      if (this.isVisible && this._model.reachable) {
        this._render();
      }
    }, 1000);
  }

  /** Show the mode and TQ controls: the server's authorizer allows this user to write. */
  set canWrite(value: boolean) {
    this._canWrite = value;
    this._render();
  }

  dispose(): void {
    clearInterval(this._ticker);
    this._model.changed.disconnect(this._render, this);
    super.dispose();
  }

  private _render(): void {
    const now = Date.now() / 1000;
    const model = this._model;
    this._controls.node.hidden = !(this._canWrite && model.reachable);
    this._controls.sync();
    const parts: HTMLElement[] = [];
    this._shownLabels = model.reachable ? model.labels(now) : [];
    if (!model.loaded) {
      parts.push(el('p', 'jp-Kiwi-connecting', this._trans.__('Connecting to the Kiwi scheduler…')));
    } else if (!model.reachable) {
      parts.push(this._unreachable());
    } else {
      parts.push(this._scheduler());
      for (const gpu of model.gpus(now)) {
        parts.push(this._gpu(gpu));
      }
      for (const device of model.nvml()) {
        parts.push(this._nvmlDevice(device));
      }
      parts.push(this._pools(model.pools()));
      parts.push(this._timeline(model.timeline(now), now));
    }
    this._body.replaceChildren(...parts);
  }

  private _unreachable(): HTMLElement {
    const model = this._model;
    const box = el(
      'div',
      'jp-Kiwi-unreachable',
      el('strong', '', this._trans.__('The Kiwi scheduler cannot be reached.')),
      el('p', '', this._trans.__('GPU work is not being shared until it is back.'))
    );
    if (model.socket) {
      box.append(el('p', 'jp-Kiwi-detail', this._trans.__('Socket: %1', model.socket)));
    }
    if (model.unreachableReason) {
      box.append(el('p', 'jp-Kiwi-detail', model.unreachableReason));
    }
    return box;
  }

  private _scheduler(): HTMLElement {
    const model = this._model;
    const mode = model.mode ?? '?';
    return el(
      'section',
      'jp-Kiwi-scheduler',
      el('h3', 'jp-Kiwi-sectionTitle', this._trans.__('Scheduler')),
      this._field(this._trans.__('Mode'), el('span', `jp-Kiwi-mode jp-Kiwi-mode-${mode}`, mode.toUpperCase())),
      this._field(this._trans.__('Time quantum'), el('span', 'jp-Kiwi-tq', formatSeconds(model.tq)))
    );
  }

  private _gpu(gpu: IGpuView): HTMLElement {
    const section = el('section', 'jp-Kiwi-gpu');
    section.dataset.gpu = String(gpu.index);
    section.append(el('h3', 'jp-Kiwi-sectionTitle', this._trans.__('GPU %1', gpu.index), el('span', 'jp-Kiwi-gpuName', ` · ${gpu.name}`)));

    const holders = el('div', 'jp-Kiwi-holder');
    if (gpu.holders.length === 0) {
      holders.append(el('span', 'jp-Kiwi-muted', this._trans.__('Nobody holds this GPU.')));
    } else {
      for (const holder of gpu.holders) {
        const item = el('span', 'jp-Kiwi-holderName', this._swatch(holder.clientId), this._name(holder.label));
        item.dataset.clientId = holder.clientId;
        item.title = this._trans.__('paged out by: %1', holder.evict);
        if (holder.mine) {
          item.classList.add('jp-Kiwi-mine');
          item.append(el('span', 'jp-Kiwi-badge', this._trans.__('this notebook')));
        }
        if (holder.paused) {
          item.classList.add('jp-Kiwi-paused');
          item.append(el('span', 'jp-Kiwi-badge', this._trans.__('paused: another has its turn')));
        }
        holders.append(item);
      }
    }
    // The room the longest holder's whole name needs: where the label beside it leaves less,
    // the holder goes to the line below the label (style/base.css).
    const longest = Math.max(0, ...gpu.holders.map(h => h.label.length));
    holders.style.setProperty('--jp-Kiwi-holder-whole', `${longest + 1}ch`);
    const holderField = this._field(this._trans.__('Holder'), holders);
    holderField.classList.add('jp-Kiwi-holderField');
    section.append(holderField);
    if (gpu.evictBlocked !== null) {
      section.append(el('p', 'jp-Kiwi-evictBlocked', this._trans.__('Nothing is granted: %1', gpu.evictBlocked)));
    }
    section.append(this._field(this._trans.__('Quantum left'), el('span', 'jp-Kiwi-quantum', formatSeconds(gpu.quantumLeft))));

    if (gpu.memory !== null) {
      // The scheduler says where each kernel's memory is: one bar, split by kernel, in place
      // of the used-of-total line (NVML's own figures still show under "Device").
      section.append(this._residentMemory(gpu.memory));
    } else {
      const memoryText = describeMemory(gpu.memoryUsed, gpu.memoryTotal, this._trans);
      if (memoryText !== null) {
        section.append(this._field(this._trans.__('Memory'), el('span', 'jp-Kiwi-memory', memoryText)));
      }
      if (gpu.memoryFraction !== null) {
        section.append(this._bar(gpu.memoryFraction, 'jp-Kiwi-memoryBar'));
      }
    }

    const queue = el('ol', 'jp-Kiwi-queue');
    for (const entry of gpu.queue) {
      const item = el('li', 'jp-Kiwi-queueItem', el('span', 'jp-Kiwi-queuePosition', `#${entry.position}`), ' ', this._swatch(entry.clientId), this._name(entry.label));
      item.dataset.clientId = entry.clientId;
      item.title = `${entry.label} · ${entry.pool} · ${entry.priority} · ${entry.evict}`;
      if (entry.mine) {
        item.classList.add('jp-Kiwi-mine');
        item.append(el('span', 'jp-Kiwi-badge', this._trans.__('this notebook')));
      }
      if (entry.waitingFor !== null) {
        item.classList.add('jp-Kiwi-waitsForMemory');
        item.append(el('span', 'jp-Kiwi-waitingFor', describeWaitingFor(entry.waitingFor, this._trans)));
      }
      queue.append(item);
    }
    section.append(el('h4', 'jp-Kiwi-subTitle', this._trans.__('Queue')));
    section.append(gpu.queue.length > 0 ? queue : el('p', 'jp-Kiwi-muted', this._trans.__('Nobody is waiting.')));
    if (gpu.policy !== null) {
      section.append(this._field(this._trans.__('Policy'), el('span', 'jp-Kiwi-policy', gpu.policy)));
    }
    if (gpu.nextReason !== null) {
      section.append(this._field(this._trans.__('Next because'), el('span', 'jp-Kiwi-nextReason', gpu.nextReason)));
    }
    if (gpu.turns !== null) {
      section.append(this._field(this._trans.__('Turns'), el('span', 'jp-Kiwi-turns', this._trans.__('%1 each, least GPU time in the cell first', formatSeconds(gpu.turns)))));
    }
    return section;
  }

  /**
   * Where the GPU's memory is: one bar of the GPU's capacity split by kernel (each in the
   * colour it has everywhere in the panel; a kernel moving out or in is striped), the totals,
   * and each kernel's memory, where it is, and what a waiting one waits for.
   */
  private _residentMemory(memory: IGpuMemoryView): HTMLElement {
    const [onGpu, inHost] = describeResidentMemory(memory, this._trans);
    const box = el('div', 'jp-Kiwi-resident', el('h4', 'jp-Kiwi-subTitle', this._trans.__('Memory by kernel')));
    const bar = el('div', 'jp-Kiwi-bar jp-Kiwi-residentBar');
    bar.title = onGpu;
    // Without a capacity the bar is the resident total: the split still shows who has what.
    const whole = memory.capacity ?? Math.max(memory.resident, 1);
    for (const kernel of memory.kernels) {
      if (kernel.residentBytes <= 0) {
        continue;
      }
      const segment = el('div', `jp-Kiwi-residentSegment jp-Kiwi-residency-${kernel.residency}`);
      segment.dataset.clientId = kernel.clientId;
      segment.style.width = `${Math.min(100, (kernel.residentBytes / whole) * 100)}%`;
      segment.style.setProperty('--jp-Kiwi-hue', String(this._model.hueFor(kernel.clientId)));
      segment.title = `${kernel.label}: ${formatBytes(kernel.residentBytes)} (${describeResidency(kernel.residency, this._trans)})`;
      bar.append(segment);
    }
    box.append(bar, el('p', 'jp-Kiwi-detail jp-Kiwi-residentTotal', onGpu), el('p', 'jp-Kiwi-detail jp-Kiwi-hostTotal', inHost));
    if (memory.spill !== null) {
      box.append(el('p', 'jp-Kiwi-detail jp-Kiwi-spillTotal', describeSpill(memory.spill, this._trans)));
    }
    const list = el('ul', 'jp-Kiwi-memoryList');
    for (const kernel of memory.kernels) {
      const item = el(
        'li',
        `jp-Kiwi-memoryItem jp-Kiwi-residency-${kernel.residency}`,
        el(
          'div',
          'jp-Kiwi-memoryName',
          this._swatch(kernel.clientId),
          this._name(kernel.label),
          this._whereBadge(kernel)
        ),
        el('div', 'jp-Kiwi-detail jp-Kiwi-memoryFigures', describeClientMemory(kernel.residentBytes, kernel.hostBytes, this._trans))
      );
      item.dataset.clientId = kernel.clientId;
      item.title = describeMemorySource(kernel.source, this._trans);
      if (kernel.mine) {
        item.classList.add('jp-Kiwi-mine');
      }
      if (kernel.waitingFor !== null) {
        item.append(el('div', 'jp-Kiwi-detail jp-Kiwi-waitingFor', describeWaitingFor(kernel.waitingFor, this._trans)));
      }
      if (kernel.tiers?.failed) {
        item.append(el('div', 'jp-Kiwi-detail jp-Kiwi-tierFailed', describeTierFailed(kernel.tiers.failed, this._trans)));
      }
      list.append(item);
    }
    box.append(list);
    return box;
  }

  /** Where a kernel's memory is: its tier where the daemon has tiers, else its residency. */
  private _whereBadge(kernel: IMemoryShare): HTMLElement {
    if (kernel.tiers === null) {
      return el('span', 'jp-Kiwi-badge jp-Kiwi-residencyWord', describeResidency(kernel.residency, this._trans));
    }
    return el('span', `jp-Kiwi-badge jp-Kiwi-tierWord jp-Kiwi-tier-${kernel.tiers.tier}`, describeTier(kernel.tiers, this._trans));
  }

  /** One GPU as NVML reads it on the server's machine, as jupyterlab-nvdashboard shows it. */
  private _nvmlDevice(device: INvmlGpu): HTMLElement {
    const section = el(
      'section',
      'jp-Kiwi-nvml',
      el('h3', 'jp-Kiwi-sectionTitle', this._trans.__('Device %1', device.index), el('span', 'jp-Kiwi-gpuName', ` · ${device.name}`)),
      el('p', 'jp-Kiwi-note', this._trans.__('As NVML reads it: every process on the GPU counted.'))
    );
    section.dataset.uuid = device.uuid;
    const used = device.memory_total > 0 ? device.memory_used / device.memory_total : 0;
    section.append(
      this._field(this._trans.__('Memory used'), el('span', 'jp-Kiwi-nvmlMemory', this._trans.__('%1 of %2', formatBytes(device.memory_used), formatBytes(device.memory_total)))),
      this._bar(used, 'jp-Kiwi-nvmlMemoryBar')
    );
    if (device.utilization !== null) {
      section.append(
        this._field(this._trans.__('Utilization'), el('span', 'jp-Kiwi-nvmlUtilization', `${device.utilization}%`)),
        this._bar(device.utilization / 100, 'jp-Kiwi-nvmlUtilizationBar')
      );
    }
    return section;
  }

  private _pools(pools: IPoolView[]): HTMLElement {
    const section = el('section', 'jp-Kiwi-pools', el('h3', 'jp-Kiwi-sectionTitle', this._trans.__('Pools')));
    if (pools.length > 0) {
      section.append(
        el(
          'p',
          'jp-Kiwi-legend',
          this._trans.__('Each bar: the GPU time a pool used lately.'),
          ' ',
          el('span', 'jp-Kiwi-legendMark jp-Kiwi-guaranteeMark'),
          ` ${this._trans.__('guaranteed')} `,
          el('span', 'jp-Kiwi-legendMark jp-Kiwi-maximumMark'),
          ` ${this._trans.__('most it may use')}`
        )
      );
    }
    for (const pool of pools) {
      const row = el('div', 'jp-Kiwi-pool');
      row.dataset.pool = pool.name;
      if (pool.belowGuarantee) {
        row.classList.add('jp-Kiwi-pool-below');
      }
      // Each figure is kept whole; a narrow sidebar breaks the line between them.
      const words = describePool(pool, this._trans);
      const figures = words.flatMap((text, i) => [...(i ? [' · '] : []), el('span', 'jp-Kiwi-figure', text)]);
      const bar = this._bar(pool.share, 'jp-Kiwi-shareBar', pool.guarantee, pool.maximum);
      bar.title = `${pool.name}: ${words.join('; ')}`;
      row.append(
        el('div', 'jp-Kiwi-poolName', pool.name, el('span', 'jp-Kiwi-muted', ` ${this._trans._n('%1 client', '%1 clients', pool.clients)}`)),
        bar,
        el('div', 'jp-Kiwi-detail', ...figures)
      );
      section.append(row);
    }
    return section;
  }

  private _timeline(entries: ITimelineEntry[], now: number): HTMLElement {
    const window = this._model.timelineWindow;
    const section = el('section', 'jp-Kiwi-timeline', el('h3', 'jp-Kiwi-sectionTitle', this._trans.__('Recent holders')));
    if (entries.length === 0) {
      section.append(el('p', 'jp-Kiwi-muted', this._trans.__('No GPU turns in the last %1.', formatSeconds(window))));
      return section;
    }
    const track = el('div', 'jp-Kiwi-timelineTrack');
    const list = el('ul', 'jp-Kiwi-timelineList');
    const since = now - window;
    for (const entry of entries) {
      const start = Math.max(entry.start, since);
      const end = entry.end ?? now;
      const segment = el('div', 'jp-Kiwi-timelineSegment');
      segment.style.left = `${((start - since) / window) * 100}%`;
      segment.style.width = `${Math.max(0.5, ((end - start) / window) * 100)}%`;
      segment.style.setProperty('--jp-Kiwi-hue', String(this._model.hueFor(entry.clientId)));
      segment.title = entry.label;
      track.append(segment);
      const item = el('li', 'jp-Kiwi-timelineItem', this._swatch(entry.clientId), ' ', this._name(entry.label), ' ', el('span', 'jp-Kiwi-muted', entry.end === null ? this._trans.__('holding, %1', formatSeconds(end - entry.start)) : formatSeconds(end - entry.start)));
      item.dataset.clientId = entry.clientId;
      if (entry.mine) {
        item.classList.add('jp-Kiwi-mine');
      }
      list.prepend(item);
    }
    section.append(track, list);
    return section;
  }

  /**
   * A client's label, whole on hover. Where the sidebar is too narrow its head is cut with an
   * ellipsis and its tail kept, the part that tells it from the other names shown.
   */
  private _name(label: string): HTMLElement {
    const [head, tail] = splitName(label, this._shownLabels);
    const name = el('span', 'jp-Kiwi-name', el('span', 'jp-Kiwi-nameHead', head), el('span', 'jp-Kiwi-nameTail', tail));
    name.title = label;
    // The room the whole name needs (in `ch`, a character's width), which rows with badges keep
    // for it before the badges: a badge that does not fit beside the name goes to the next line.
    name.style.setProperty('--jp-Kiwi-whole', `${label.length + 1}ch`);
    // ...and the room its tail needs, which no row takes from it.
    name.style.setProperty('--jp-Kiwi-tail', `${tail.length + 2}ch`);
    return name;
  }

  /** The client's colour, the same wherever it shows and across scheduler restarts
   * (model.hueFor). */
  private _swatch(clientId: string): HTMLElement {
    const swatch = el('span', 'jp-Kiwi-swatch');
    swatch.style.setProperty('--jp-Kiwi-hue', String(this._model.hueFor(clientId)));
    return swatch;
  }

  private _field(label: string, value: HTMLElement): HTMLElement {
    return el('div', 'jp-Kiwi-field', el('span', 'jp-Kiwi-label', label), value);
  }

  /** A filled bar for a fraction, with optional marks for a guarantee and a maximum. */
  private _bar(fraction: number, className: string, guarantee?: number, maximum?: number | null): HTMLElement {
    const bar = el('div', `jp-Kiwi-bar ${className}`);
    const fill = el('div', 'jp-Kiwi-barFill');
    fill.style.width = `${Math.min(100, Math.max(0, fraction * 100))}%`;
    bar.append(fill);
    if (guarantee !== undefined && guarantee > 0) {
      const mark = el('div', 'jp-Kiwi-barMark jp-Kiwi-guaranteeMark');
      mark.style.left = `${Math.min(100, guarantee * 100)}%`;
      mark.title = this._trans.__('guarantee');
      bar.append(mark);
    }
    if (maximum !== undefined && maximum !== null) {
      const mark = el('div', 'jp-Kiwi-barMark jp-Kiwi-maximumMark');
      mark.style.left = `${Math.min(100, maximum * 100)}%`;
      mark.title = this._trans.__('maximum');
      bar.append(mark);
    }
    return bar;
  }

  private _model: KiwiModel;
  private _trans: TranslationBundle;
  private _body: HTMLElement;
  private _controls: SchedulerControls;
  private _canWrite = false;
  private _shownLabels: string[] = [];
  private _ticker: ReturnType<typeof setInterval>;
}
