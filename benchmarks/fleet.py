"""A notebook fleet replayed through the real scheduler core, in simulated time.

    python -m benchmarks.fleet [--notebooks 20] [--gpus 2] [--hours 8] [--seed 1] [--plot]
                               [--explain]
    python -m benchmarks.fleet --seeds 1-20 [--jobs N]   (the key runs over many seeds)

Each notebook is a person at work: think, run a cell, think again. Some cells use the GPU for a
burst; now and then the person goes away. Every GPU burst goes through ``Scheduler`` exactly as
the daemon would feed it (``nodeside.scheduler.replay``), with the seed's pools and a 30 s TQ,
so the figures are the policy's, not a model of it. Time jumps from event to event: a working
day of a fleet replays in seconds.

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
  fit; a grant that needs room moves the least recently granted ones to host and its own back,
  over a host link of 25 GB/s (PCIe Gen4) or 55 GB/s (Gen5), see
  ``nodeside.scheduler.switching``. That time is in the hold but is nobody's work.

What it reports, each against a floor measured in the same run:

* GPU utilization: the fraction of GPU time spent working, against the offered load (the GPU
  seconds the fleet asked for over the GPU time there was): 1.0 means every request was served
  in the end. Switching loss: the fraction of GPU time spent moving memory.
* Wait per GPU cell, mean and p95, in seconds and as slowdown against the floor of an exclusive
  GPU (where a cell takes exactly its burst, its memory already in place), for all cells, for
  short ones (burst under 10 s: what a person waits for) and for long ones.
* Two floors under short cells' mean slowdown (``fleet_bound``), NORMAL, LOW and all short
  cells: what the priority rules, handoffs and memory restores made each cell wait at least,
  given the queue it found in this run; and what they would make it wait under any policy,
  given only when the cells arrived.
* Each pool's share error: during sustained contention (both pools contending for a GPU for at
  least ten quanta), how far each pool's fraction of that GPU's time is from its entitlement
  (0.35 / 0.65). Shorter episodes are decided by who holds the current quantum, not by shares.
* GPUs an exclusive one-GPU-per-notebook assignment needs for the same fleet (one each), and the
  peak number of notebooks in a GPU burst at once (what even a perfect dynamic assignment of
  whole GPUs would need).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.common import percentile
from benchmarks.fleet_bound import LowFloor
from benchmarks.fleet_explain import Explain
from benchmarks.fleet_report import explain_table, side_by_side
from benchmarks.fleet_seeds import parse_seeds, replay_seeds, summary
from nodeside.config import from_mapping
from nodeside.scheduler.core import Action, GpuSpec, Scheduler
from nodeside.scheduler.pools import entitlements
from nodeside.scheduler.replay import Replay, Worker
from nodeside.scheduler.switching import PCIE_GEN4, PCIE_GEN5, SwitchingModel

POOLS = {
    "training": {"guarantee": 0.3, "weight": 1, "maximum": 0.7},
    "simulation": {"guarantee": 0.5, "weight": 3, "maximum": -1},
}
GiB = 1024**3
GPU_MEMORY = 40 * GiB
#: Cells shorter than this are the ones a person sits and waits for.
SHORT_CELL = 10.0
LINKS = {"none": None, "gen4": PCIE_GEN4, "gen5": PCIE_GEN5}


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


@dataclass
class Cell:
    notebook: str
    pool: str
    gpu: int
    start: float
    burst: float
    end: float | None = None
    priority: str = "NORMAL"

    @property
    def wait(self) -> float:
        assert self.end is not None
        return max(0.0, self.end - self.start - self.burst)


@dataclass
class Contention:
    """Per GPU, each pool's held seconds during sustained contention between pools.

    An episode is a stretch of time during which more than one pool contends for a GPU. Only
    episodes of at least ``min_quanta`` quanta count: the policy acts once per quantum, so a
    notebook that waits ten seconds behind another's burst says nothing about shares.

    The scheduler's state changes only when actions are applied, so between two calls of
    ``observe`` it is what the earlier call saw: that snapshot is what the elapsed time is
    charged to.
    """

    min_length: float
    last: float = 0.0
    held: dict[str, float] = field(default_factory=dict)  # sustained episodes, all GPUs
    sustained: float = 0.0  # seconds of GPU time in sustained episodes
    contended: float = 0.0  # seconds of GPU time in any episode
    concurrent_peak: int = 0
    _holding: dict[int, list[str]] = field(default_factory=dict)  # contended GPU -> pools held
    _episodes: dict[int, tuple[float, dict[str, float]]] = field(default_factory=dict)

    def observe(self, replay: Replay, _: list[Action]) -> None:
        dt = replay.now - self.last
        for index, pools in self._holding.items():
            seconds = self._episodes.setdefault(index, (self.last, {}))[1]
            for pool in pools:
                seconds[pool] = seconds.get(pool, 0.0) + dt
        self.last = replay.now
        self._holding = {}
        for index, gpu in replay.scheduler.gpus.items():
            if len({c.pool for c in (*gpu.holders.values(), *gpu.waiters.values())}) > 1:
                self._holding[index] = [h.pool for h in gpu.holders.values()]
            elif index in self._episodes:
                self._close(index, replay.now)
        wanting = sum(len(g.holders) + len(g.waiters) for g in replay.scheduler.gpus.values())
        self.concurrent_peak = max(self.concurrent_peak, wanting)

    def finish(self, now: float) -> None:
        for index in list(self._episodes):
            self._close(index, now)

    def _close(self, index: int, now: float) -> None:
        began, seconds = self._episodes.pop(index)
        self.contended += now - began
        if now - began >= self.min_length:
            self.sustained += now - began
            for pool, value in seconds.items():
                self.held[pool] = self.held.get(pool, 0.0) + value


def build_fleet(notebooks: int, gpus: int, seed: int, workload: Workload, mode: str,
                memory: int | None, tq: float, policy: str = "round-robin",
                bandwidth: float | None = None, tuning: dict | None = None,
                open_cells: dict[str, Cell] | None = None
                ) -> tuple[Replay, list[Cell], Contention]:
    """The fleet, ready to run; ``open_cells`` (if given) maps each client id to its GPU cell
    in progress, for observers that explain the waits."""
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
    switching = None
    if bandwidth is not None and memory is not None:
        switching = SwitchingModel(memory - config.memory_reserve, bandwidth)
    replay = Replay(sched, release_delay=workload.release_delay, switching=switching)
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
        worker = replay.add(f"nb{n:02d}", pool=pool, priority=priority, gpu=(n // 2) % gpus,
                            working_set=size if memory else None)
        _start_notebook(replay, worker, rng, workload, cells, priority,
                        {} if open_cells is None else open_cells)
    return replay, cells, contention


def _start_notebook(replay: Replay, worker: Worker, rng: random.Random, w: Workload,
                    cells: list[Cell], priority: str, open_cells: dict[str, Cell]) -> None:

    def next_cell(now: float) -> None:
        start = now + rng.lognormvariate(_mu(w.think_median), w.think_sigma)
        if rng.random() < w.away_probability:
            start += rng.lognormvariate(_mu(w.away_median), w.away_sigma)
        if rng.random() < w.gpu_cell_probability:
            burst = min(rng.lognormvariate(_mu(w.burst_median), w.burst_sigma), w.burst_cap)
            cell = Cell(worker.name, worker.pool, worker.gpu, start, burst, priority=priority)
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
        next_cell(now)

    worker.on_done = done
    next_cell(rng.uniform(0, 120.0))  # people do not all start at nine sharp


def _mu(median: float) -> float:
    """The lognormal's mu for a given median."""
    return math.log(median)


def run(notebooks: int = 20, gpus: int = 2, hours: float = 8.0, seed: int = 1,
        mode: str = "on", memory: int | None = GPU_MEMORY, tq: float = 30.0,
        policy: str = "round-robin", link: str = "gen4", tuning: dict | None = None,
        explain: bool = False) -> dict:
    """One replay of the fleet; ``link`` names the host link (``none``: no switching costs);
    ``explain`` adds where short cells' waiting went (``fleet_explain``)."""
    workload = Workload()
    duration = hours * 3600.0
    started = time.perf_counter()
    open_cells: dict[str, Cell] = {}
    replay, cells, contention = build_fleet(notebooks, gpus, seed, workload, mode, memory, tq,
                                            policy, LINKS[link], tuning, open_cells)
    explainer = Explain(SHORT_CELL, open_cells) if explain else None
    floor = LowFloor(SHORT_CELL, open_cells)
    replay.observers.append(floor.observe)
    if explainer is not None:
        replay.observers.append(explainer.observe)
    replay.run_until(duration)
    wall = time.perf_counter() - started
    finished = [c for c in cells if c.end is not None and c.end <= duration]
    offered = sum(c.burst for c in cells if c.start < duration)
    held = sum(min(s.end if s.end is not None else duration, duration) - s.start
               for s in replay.spans if s.start < duration)
    busy = _busy_seconds(replay, duration)
    switching = sum(max(0.0, s.working(duration)[0] - s.start)
                    for s in replay.spans if s.start < duration)
    waits = [c.wait for c in finished]
    mean_burst = statistics.fmean(c.burst for c in finished)
    contention.finish(duration)
    ent = entitlements(replay.scheduler.pool(p) for p in POOLS)
    total = sum(contention.held.values())
    shares = {pool: contention.held.get(pool, 0.0) / total for pool in POOLS} if total else {}
    share_error = {pool: abs(shares[pool] - ent[pool]) for pool in shares}
    short = [_slowdown(c) for c in finished if c.burst < SHORT_CELL]
    by_priority = {p: [_slowdown(c) for c in finished if c.burst < SHORT_CELL
                       and c.priority == p] for p in ("NORMAL", "LOW")}
    long = [_slowdown(c) for c in finished if c.burst >= SHORT_CELL]
    explained = {}
    if explainer is not None:
        explainer.observe(replay, [])  # charge the last interval
        explained = {"explain": explainer.report(
            sum(c.wait for c in finished if c.burst < SHORT_CELL), finished)}
    return {
        **explained,
        "mode": mode, "policy": policy, "link": link, "notebooks": notebooks, "gpus": gpus,
        "hours": hours, "tq": tq, "seed": seed, "cells": len(finished),
        "offered_load": offered / (duration * gpus),
        "utilization": busy / (duration * gpus),
        "switching_loss": switching / (duration * gpus),
        "moved_gib": (replay.switching.moved_bytes / GiB) if replay.switching else 0.0,
        "held_gpu_seconds_per_gpu_second": held / (duration * gpus),
        "served_fraction": (held - switching) / offered if offered else 1.0,
        "wait_mean_s": statistics.fmean(waits), "wait_p95_s": percentile(waits, 95),
        "wait_mean_over_mean_burst": statistics.fmean(waits) / mean_burst,
        "slowdown_mean": statistics.fmean(_slowdown(c) for c in finished),
        "short_cells": len(short), "long_cells": len(long),
        "short_slowdown_mean": statistics.fmean(short), "short_slowdown_p95": percentile(short, 95),
        "long_slowdown_mean": statistics.fmean(long), "long_slowdown_p95": percentile(long, 95),
        # A small fleet may have no LOW notebook (two in eight, from the seventh on).
        "short_slowdown_mean_normal": _mean_or_nan(by_priority["NORMAL"]),
        "short_slowdown_mean_low": _mean_or_nan(by_priority["LOW"]),
        **floor.report(replay, finished, cells),
        "share_error": share_error, "shares_in_contention": shares,
        "contended_fraction": contention.contended / (duration * gpus),
        "sustained_fraction": contention.sustained / (duration * gpus),
        "exclusive_gpus": notebooks, "peak_concurrent_bursts": contention.concurrent_peak,
        "notebooks_per_gpu": notebooks / gpus,
        "simulated_seconds_per_wall_second": duration / wall, "wall_s": wall,
        "counts": dict(replay.scheduler.counts),
        "_replay": replay,
    }


def _mean_or_nan(values: list[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def _slowdown(cell: Cell) -> float:
    return (cell.wait + cell.burst) / cell.burst


def _busy_seconds(replay: Replay, end: float) -> float:
    """GPU seconds in which some holder worked (side-by-side work counts once; moving memory
    does not count)."""
    total = 0.0
    for gpu in replay.scheduler.gpus:
        spans = sorted(s.working(end) for s in replay.spans if s.gpu == gpu and s.start < end)
        covered_to = 0.0
        for start, stop in spans:
            start = max(start, covered_to)
            if stop > start:
                total += stop - start
                covered_to = stop
    return total


#: The runs ``main`` puts side by side: (label, mode, TQ, policy, link). The first is the seed's
#: default without switching costs, the figure the issue starts from.
RUNS = (
    ("round robin, TQ 30 s, no switching cost", "on", 30.0, "round-robin", "none"),
    ("round robin, TQ 30 s", "on", 30.0, "round-robin", "gen4"),
    ("round robin, TQ 5 s", "on", 5.0, "round-robin", "gen4"),
    ("interactive, TQ 30 s", "on", 30.0, "interactive", "gen4"),
    ("interactive, TQ 10 s", "on", 10.0, "interactive", "gen4"),
    ("round robin, TQ 30 s, Gen5", "on", 30.0, "round-robin", "gen5"),
    ("round robin, TQ 5 s, Gen5", "on", 5.0, "round-robin", "gen5"),
    ("interactive, TQ 30 s, Gen5", "on", 30.0, "interactive", "gen5"),
    ("auto, TQ 30 s", "auto", 30.0, "round-robin", "gen4"),
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--notebooks", type=int, default=20)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--hours", type=float, default=8.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--plot", action="store_true",
                        help="draw docs/timeline.png and the fleet timelines into docs/")
    parser.add_argument("--explain", action="store_true",
                        help="also break short cells' waiting down by cause, run by run")
    parser.add_argument("--seeds", type=parse_seeds, metavar="1-20",
                        help="instead: the key runs over these seeds, as means and ranges")
    parser.add_argument("--jobs", type=int, help="with --seeds: processes (default: CPUs)")
    args = parser.parse_args(argv)
    if args.seeds:
        print(summary(replay_seeds(args.seeds, args.notebooks, args.gpus, args.hours,
                                   args.jobs)))
        return
    results = []
    # Side-by-side holds in mode auto are modelled as running at full speed, which flatters
    # it: two kernels sharing the SMs each run slower in reality.
    for label, mode, tq, policy, link in RUNS:
        result = run(args.notebooks, args.gpus, args.hours, args.seed, mode, GPU_MEMORY, tq,
                     policy, link, explain=args.explain)
        result["label"] = label
        results.append(result)
    print(side_by_side(results))
    if args.explain:
        print()
        print(explain_table(results))
    if args.json:
        args.json.write_text(json.dumps([{k: v for k, v in r.items() if not k.startswith("_")}
                                         for r in results], indent=2))
    if args.plot:
        from benchmarks.timeline import draw_fleet, draw_seed_example

        docs = Path(__file__).resolve().parent.parent / "docs"
        draw_seed_example(docs / "timeline.png")
        window = {"gpu": 0, "start": 3600.0, "end": 3600.0 + 900.0}
        by_label = {r["label"]: r for r in results}
        for label, name in (("round robin, TQ 30 s", "fleet-timeline.png"),
                            ("interactive, TQ 10 s", "fleet-timeline-interactive.png")):
            draw_fleet(by_label[label]["_replay"], docs / name, title=label, **window)
        print(f"wrote timeline.png, fleet-timeline.png and fleet-timeline-interactive.png "
              f"into {docs}")


if __name__ == "__main__":
    main()
