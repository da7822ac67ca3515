"""One replay of a notebook fleet through the real scheduler core, in simulated time, and
what it measures (``run``); the runs the benchmark puts side by side (``RUNS``).

The command is ``python -m benchmarks.fleet`` (``cli``).

Each notebook is a person at work: think, run a cell, think again. Some cells use the GPU for a
burst; now and then the person goes away. Every GPU burst goes through ``Scheduler`` exactly as
the daemon would feed it (``nodeside.testing.Replay``), with the seed's pools and a 30 s TQ,
so the figures are the policy's, not a model of it. Time jumps from event to event: a working
day of a fleet replays in seconds.

The workload (who the notebooks are, when they ask, their memory) is ``workload``'s.

What it reports, each against a floor measured in the same run:

* GPU utilization: the fraction of GPU time spent working, against the offered load (the GPU
  seconds the fleet asked for over the GPU time there was): 1.0 means every request was served
  in the end. Switching loss: the fraction of GPU time spent moving memory. The switches: how
  many grants had to move memory (the others found their working set resident, with room), and
  how long those took, mean and p95 (``memory`` compares them with handoffs overlapped).
* Wait per GPU cell, mean and p95, in seconds and as slowdown against the floor of an exclusive
  GPU (where a cell takes exactly its burst, its memory already in place), for all cells, for
  short ones (burst under 10 s: what a person waits for) and for long ones.
* Two floors under short cells' mean slowdown (``bound``), NORMAL, LOW and all short
  cells: what the priority rules, handoffs and memory restores made each cell wait at least,
  given the queue it found in this run; and what they would make it wait under any policy,
  given only when the cells arrived.
* Each pool's share error: during sustained contention (both pools contending for a GPU for at
  least ten quanta), how far each pool's fraction of that GPU's time is from its entitlement
  (0.35 / 0.65). Shorter episodes are decided by who holds the current quantum, not by shares.
* With a host budget (``tiers``): refusals for host memory, cells failed after the shim's
  room timeout (apart from the finished ones), spills, fetches, restores from disk and the
  peak of host use.
* GPUs an exclusive one-GPU-per-notebook assignment needs for the same fleet (one each), and the
  peak number of notebooks in a GPU burst at once (what even a perfect dynamic assignment of
  whole GPUs would need).
"""

from __future__ import annotations

import math
import statistics
import time

from benchmarks.common import percentile
from benchmarks.fleet.bound import LowFloor
from benchmarks.fleet.explain import Explain
from benchmarks.fleet.hints import HintModel, install_hinted
from benchmarks.fleet.oracle import ORACLES, install
from benchmarks.fleet.switching import model_of
from benchmarks.fleet.tiers import HostTiers, TierSetting
from benchmarks.fleet.turns import KEY_TURNS, TurnRun
from benchmarks.fleet.workload import (
    GPU_MEMORY,
    POOLS,
    Cell,
    GiB,
    Workload,
    build_fleet,
    parse_link,
)
from nodeside.config import POLICY_INTERACTIVE
from nodeside.scheduler.pools import entitlements
from nodeside.testing import Replay

__all__ = ["ORACLE_RUNS", "RUNS", "SHORT_CELL", "busy_seconds", "run"]

#: Cells shorter than this are the ones a person sits and waits for.
SHORT_CELL = 10.0


def run(notebooks: int = 20, gpus: int = 2, hours: float = 8.0, seed: int = 1,
        mode: str = "on", memory: int | None = GPU_MEMORY, tq: float = 30.0,
        policy: str = "round-robin", link: str = "gen4", tuning: dict | None = None,
        explain: bool = False, co_run: float = 1.0, tiers: TierSetting | None = None) -> dict:
    """One replay of the fleet; ``link`` names the host link (``none``: no switching costs;
    ``gen5+overlap``: a handoff's moves overlapped, ``workload.parse_link``);
    ``explain`` adds where short cells' waiting went (``explain``); ``co_run`` is the
    fraction of the GPU's work holders side by side get done together (1.0: sharing is free).
    A ``policy`` in ``oracle.ORACLES`` is the clairvoyant reference, one named
    ``hints:...`` the reference on hinted estimates (``hints``); both on the pure Python
    core only. One named ``turns:...`` is ``interactive`` with holders taking turns
    (``turns``). ``tiers`` gives the node a host budget and a disk tier (``tiers``): cells
    refused room past the shim's timeout fail, and are counted apart from the finished."""
    workload = Workload(co_run=co_run)
    duration = hours * 3600.0
    started = time.perf_counter()
    open_cells: dict[str, Cell] = {}
    low_cuts, hints = ORACLES.get(policy), HintModel.parse(policy)
    turns = TurnRun.parse(policy)
    bandwidth, overlap = parse_link(link)
    if turns is not None:
        tuning = {**(tuning or {}), "turns": turns.turn}
    reference = low_cuts is not None or hints is not None  # it replaces interactive
    replay, cells, contention = build_fleet(
        notebooks, gpus, seed, workload, mode, memory, tq,
        POLICY_INTERACTIVE if reference or turns else policy, bandwidth, tuning, open_cells,
        overlap, tiers)
    if hints is not None:
        install_hinted(replay, open_cells, seed, hints)
    elif low_cuts is not None:
        install(replay, low_cuts=low_cuts)
    if turns is not None:
        replay.resume_cost = turns.switch_cost
    explainer = Explain(SHORT_CELL, open_cells) if explain else None
    floor = LowFloor(SHORT_CELL, open_cells)
    replay.observers.append(floor.observe)
    if explainer is not None:
        replay.observers.append(explainer.observe)
    replay.run_until(duration)
    wall = time.perf_counter() - started
    ended = [c for c in cells if c.end is not None and c.end <= duration]
    finished = [c for c in ended if not c.failed]
    offered = sum(c.burst for c in cells if c.start < duration)
    held = sum(min(s.end if s.end is not None else duration, duration) - s.start
               for s in replay.spans if s.start < duration)
    busy = busy_seconds(replay, duration)
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
    long_by_priority = {p: [_slowdown(c) for c in finished if c.burst >= SHORT_CELL
                            and c.priority == p] for p in ("NORMAL", "LOW")}
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
        "moved_gib": (model.moved_bytes / GiB) if (model := model_of(replay)) else 0.0,
        **_switches(replay), **_tiers(replay, len(ended) - len(finished)),
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
        "long_slowdown_mean_normal": _mean_or_nan(long_by_priority["NORMAL"]),
        "long_slowdown_mean_low": _mean_or_nan(long_by_priority["LOW"]),
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


def _switches(replay: Replay) -> dict:
    """The grants that had to move memory: how many, their seconds in all, and the p95."""
    model = model_of(replay)
    switches = model.switches if model else []
    return {"overlap": bool(model and model.overlap),
            "switches": len(switches), "switch_seconds": sum(switches),
            "switch_p95_s": percentile(switches, 95) if switches else 0.0,
            "evicted_gib": model.evicted_bytes / GiB if model else 0.0,
            "restored_gib": model.restored_bytes / GiB if model else 0.0}


def _tiers(replay: Replay, failed: int) -> dict:
    """The host budget and disk tier's figures (``tiers``), where the run has them."""
    model = model_of(replay)
    if not isinstance(model, HostTiers):
        return {}
    budget = model.tiers.budget
    return {"tiers": {
        "node": model.tiers.name, "failed_cells": failed,
        "host_budget_gib": budget / GiB if budget is not None else math.inf,
        "peak_host_gib": model.peak_host / GiB, "spilled_gib": model.spilled_bytes / GiB,
        **model.counts, "refused_workers": sum(1 for w in replay.workers.values()
                                               if w.refusals),
        "reasons": model.reasons}}


def _mean_or_nan(values: list[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def _slowdown(cell: Cell) -> float:
    return (cell.wait + cell.burst) / cell.burst


def busy_seconds(replay: Replay, end: float) -> float:
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
    ("auto, interactive, TQ 30 s", "auto", 30.0, "interactive", "gen4"),
    ("auto, interactive, TQ 30 s, 1 s turns", "auto", 30.0, KEY_TURNS.policy, "gen4"),
)
#: The clairvoyant reference (``oracle``), with ``--oracle``: it runs on the pure Python
#: core, three times slower, so only when asked. The second lifts "a LOW request never cuts a
#: quantum short", to price that rule.
ORACLE_RUNS = (
    ("clairvoyant, TQ 10 s (reference: knows each cell's length)", "on", 10.0, "clairvoyant",
     "gen4"),
    ("clairvoyant, TQ 10 s, LOW requests cut quanta (variant)", "on", 10.0,
     "clairvoyant-low-cuts", "gen4"),
)
