"""The fleet benchmark's notebooks: who they are and when they ask for the GPU.

The workload model (assumptions, chosen to be stated and varied, not measured here):

* Think time between cells: lognormal, median 40 s, sigma 1.0 (mean about 66 s). Human think and
  idle times in interactive systems are heavy-tailed and skewed to the right; the lognormal is
  the usual fit for them, and the median matches reading an output and editing a cell.
* A break: after any cell, with probability 0.04, the person is away for lognormal minutes
  (median 15 min, sigma 0.8): meetings, lunch. This is what makes one GPU per notebook wasteful:
  the analyses of shared GPU clusters (Microsoft's Philly traces, Jeon et al., USENIX ATC 2019;
  Alibaba PAI, Weng et al., NSDI 2022) report low GPU utilization for interactive work.
* 60 % of cells use the GPU. Burst length: lognormal, median 6 s, sigma 1.3, capped at 20 min:
  most cells are a quick forward pass or a few training steps, a few are long training runs.
  Job durations in those same traces are heavy-tailed and lognormal-like over orders of
  magnitude; sigma 1.3 puts the 99th percentile near two minutes.
* CPU-only cells last lognormal median 3 s.
* Half the notebooks are in pool ``training`` (0.3 / 1 / 0.7), half in ``simulation``
  (0.5 / 3 / unlimited), the seed's pools; two of every eight notebooks run LOW (exploratory),
  one in each pool: four of the twenty, and with two GPUs all four on GPU 1 (a quirk of the
  numbering, kept so that the figures stay comparable with earlier runs; spreading them over
  both GPUs moved interactive TQ 10 s's short cells by -20% to +50% on seeds 1 to 3).
* Giving the GPU back takes 0.2 s (pausing the work in flight).
* Switching costs (``--link``, on unless ``none``): each notebook has a working set, lognormal
  with median 5 GiB and sigma 1.0 (a mid-sized model with its activations and optimizer state;
  the 99th percentile near 50 GiB, so a few notebooks hold tens of GiB), bounded by the GPU's
  memory (40 GiB, less the scheduler's reserve). A GPU keeps working sets resident while they
  fit; a grant that needs room moves the least recently used ones to host and its own back,
  over a host link of 25 GB/s (PCIe Gen4) or 55 GB/s (Gen5: the pinned copy measured on the
  H100 and the H200), see ``benchmarks.fleet.switching``. That time is in the hold but is
  nobody's work. The two moves follow each other (out + in), as today's evictors do them; a
  link named with ``+overlap`` (``gen5+overlap``) runs them at once, as a chunked evictor
  would: max(out, in) and one chunk.
* Host memory (``tiers``, only where a run asks): the node's host budget holds evicted working
  sets until they spill to a disk tier; each cell's execute request is a hint
  (``tiers.HostTiers``).
* Holders side by side (mode auto) share the GPU's time (``co_run`` 1.0): with k of them
  working, each does 1/k of a second's work per second. Without MPS a GPU time-slices between
  processes, so compute-bound cells side by side each run at about 1/k speed; cells too small
  to fill the GPU would do better, the context switches a little worse. ``None`` runs them all
  at full speed, the earlier model, which made mode auto look far better than it is.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.fleet.shares import Contention
from benchmarks.fleet.switching import PCIE_GEN4, PCIE_GEN5, SwitchingModel
from benchmarks.fleet.tiers import HostTiers, TierSetting
from nodeside.config import from_mapping
from nodeside.scheduler.core import GpuSpec, Scheduler
from nodeside.testing import Replay, Worker

POOLS = {
    "training": {"guarantee": 0.3, "weight": 1, "maximum": 0.7},
    "simulation": {"guarantee": 0.5, "weight": 3, "maximum": -1},
}
GiB = 1024**3
GPU_MEMORY = 40 * GiB
LINKS = {"none": None, "gen4": PCIE_GEN4, "gen5": PCIE_GEN5}
#: A link name with this suffix overlaps a handoff's way out and way in (``switch_seconds``).
OVERLAP = "+overlap"


def parse_link(name: str) -> tuple[float | None, bool]:
    """(bytes per second or None, overlapped) for a link name: ``gen4``, ``gen5+overlap`` ..."""
    base = name.removesuffix(OVERLAP)
    if base not in LINKS or (base != name and LINKS[base] is None):
        raise ValueError(f"no host link {name!r}: one of {', '.join(LINKS)}, the last two "
                         f"optionally with {OVERLAP}")
    return LINKS[base], base != name


@dataclass
class Workload:
    think_median: float = 40.0
    think_sigma: float = 1.0
    away_probability: float = 0.04
    away_median: float = 15 * 60.0
    away_sigma: float = 0.8
    gpu_cell_probability: float = 0.6
    burst_median: float = 6.0
    burst_sigma: float = 1.3
    burst_cap: float = 20 * 60.0
    cpu_cell_median: float = 3.0
    release_delay: float = 0.2
    working_set_median: float = 5.0 * GiB
    working_set_sigma: float = 1.0
    co_run: float | None = 1.0


@dataclass
class Cell:
    notebook: str
    pool: str
    gpu: int
    start: float
    burst: float
    end: float | None = None
    priority: str = "NORMAL"
    #: Seconds its work took beyond its burst by sharing the GPU's time with holders beside it.
    shared: float = 0.0
    #: Its GPU calls failed: refused room past the shim's room timeout (``Replay``).
    failed: bool = False

    @property
    def wait(self) -> float:
        assert self.end is not None
        return max(0.0, self.end - self.start - self.burst)


def build_fleet(notebooks: int, gpus: int, seed: int, workload: Workload, mode: str,
                memory: int | None, tq: float, policy: str = "round-robin",
                bandwidth: float | None = None, tuning: dict | None = None,
                open_cells: dict[str, Cell] | None = None, overlap: bool = False,
                tiers: TierSetting | None = None) -> tuple[Replay, list[Cell], Contention]:
    """The fleet, ready to run; ``open_cells`` (if given) maps each client id to its GPU cell
    in progress, for observers that explain the waits; ``overlap`` runs each handoff's moves
    at once (``switching.switch_seconds``); ``tiers`` puts the node's host budget and disk
    tier in the memory model (``tiers.HostTiers``), each cell's execute request a hint."""
    rng = random.Random(seed)
    sizes = random.Random(seed + 1)  # its own stream: the same traces in every mode
    settings = {"tq": tq, "mode": mode, "pools": POOLS}
    if policy != "round-robin":  # the default, left out so the seed's config stays as it was
        settings["policy"] = policy
        # The policy prices moving memory at the link the replay models.
        settings["interactive"] = {"link_bandwidth": int(bandwidth or PCIE_GEN4),
                                   **(tuning or {})}
    config = from_mapping(settings)
    sched = Scheduler(config, [GpuSpec(i, memory_total=memory) for i in range(gpus)], 0.0)
    switching: SwitchingModel | None = None
    if bandwidth is not None and memory is not None:
        switching = SwitchingModel(memory - config.memory_reserve, bandwidth, overlap=overlap)
        if tiers is not None:
            switching = HostTiers(switching.capacity, bandwidth, overlap=overlap, tiers=tiers)
    replay = Replay(sched, release_delay=workload.release_delay, switching=switching,
                    co_run=workload.co_run)
    intent = None
    if isinstance(switching, HostTiers):
        switching.clock = lambda: replay.now
        intent = switching.intent
    contention = Contention(min_length=10 * tq)
    replay.observers.append(contention.observe)
    cells: list[Cell] = []
    for n in range(notebooks):
        pool = "training" if n % 2 == 0 else "simulation"
        priority = "LOW" if n % 8 in (6, 7) else "NORMAL"  # two in eight, in both pools
        size = int(sizes.lognormvariate(_mu(workload.working_set_median),
                                        workload.working_set_sigma))
        if memory is not None:
            size = min(size, memory - config.memory_reserve)
        # Pools alternate, GPUs every two notebooks: each GPU gets notebooks of both pools.
        # Each notebook's kernel runs under the shim, which can pause (taking turns).
        worker = replay.add(f"nb{n:02d}", pool=pool, priority=priority, gpu=(n // 2) % gpus,
                            working_set=size if memory else None, pausable=True)
        _start_notebook(replay, worker, rng, workload, cells, priority,
                        {} if open_cells is None else open_cells, intent)
    return replay, cells, contention


def _start_notebook(replay: Replay, worker: Worker, rng: random.Random, w: Workload,
                    cells: list[Cell], priority: str, open_cells: dict[str, Cell],
                    intent: Callable[[str], None] | None = None) -> None:
    shared_before = 0.0  # the worker's record of time lost sharing runs on from cell to cell
    failed_before = 0

    def next_cell(now: float) -> None:
        nonlocal shared_before, failed_before
        start = now + rng.lognormvariate(_mu(w.think_median), w.think_sigma)
        if rng.random() < w.away_probability:
            start += rng.lognormvariate(_mu(w.away_median), w.away_sigma)
        if intent is not None:  # the execute request, before the kernel runs the cell
            replay.at(start, functools.partial(intent, worker.id))
        if rng.random() < w.gpu_cell_probability:
            burst = min(rng.lognormvariate(_mu(w.burst_median), w.burst_sigma), w.burst_cap)
            cell = Cell(worker.name, worker.pool, worker.gpu, start, burst, priority=priority)
            shared_before, failed_before = worker.shared, worker.failed
            open_cells[worker.id] = cell
            cells.append(cell)
            replay.burst(worker, burst, when=start)
        else:
            cpu = rng.lognormvariate(_mu(w.cpu_cell_median), 1.0)
            replay.at(start + cpu, lambda: next_cell(replay.now))

    def done(_: Worker, now: float) -> None:
        cell = open_cells.pop(worker.id, None)
        if cell is not None:
            cell.end = now
            cell.shared = worker.shared - shared_before
            cell.failed = worker.failed > failed_before
        next_cell(now)

    worker.on_done = done
    next_cell(rng.uniform(0, 120.0))  # people do not all start at nine sharp


def _mu(median: float) -> float:
    """The lognormal's mu for a given median."""
    return math.log(median)
