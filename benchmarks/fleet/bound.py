"""A floor under short cells' mean slowdown that the priority rules, handoffs and memory impose.

In mode on (one holder at a time), under either policy a LOW request never preempts a NORMAL
holder and never cuts its quantum short, and within a pool NORMAL goes before LOW, a holder's
quantum ending included (docs/policy.md). So a LOW short cell waits at least for the
remaining work of every NORMAL request of its own pool on its GPU when it asks (waiting or
holding: all of it runs before the cell can, whatever the policy, given the queue the cell
finds), and, when the holder is a NORMAL one of the other pool, for that holder's quantum or
hold as it ran, whichever ended first (the cell could not cut it; another policy might have
cut it for a NORMAL request, so this part is this run's); the GPU serves one at a time, so
the two add up.

And in mode on any short cell that asks while another client holds its GPU waits at least
until that holder's work is done or, if it is asked to leave, until it has given the GPU back
(the fleet's ``release_delay``, 0.2 s): the smaller of the two. A cell's floor is the larger
of what applies to it.

``LowFloor`` records both for every short cell as it asks, and ``report`` turns them into
floors of the mean slowdown: NORMAL short cells', LOW short cells', and all short cells'.
Memory: a cell whose notebook's working set was moved to host since its previous cell waits at
least for it to come back (``restores``). That is certain, whatever the policy, when another
notebook on its GPU had a GPU cell that began after the previous one ended and was over before
this one began, and the two working sets do not fit in the GPU's room together: that cell was
granted in between and its memory went in. Both floors count that restore.

The floor above depends on the run (the queue a cell finds is the policy's doing). ``report``
also gives one that does not, given when the cells arrived (``any_policy``): a LOW short cell
waits at least for the NORMAL work of its own pool that a server doing nothing else would still
have when it asks (``backlog``: NORMAL work only ever waits for the GPU under a policy, so no
policy has less of it left at any instant), plus its restore. Everything else (requests that
come later, evicting others to make room, the other pool's turns, the policy's own choices)
comes on top.
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from benchmarks.fleet.switching import model_of
from nodeside.scheduler.core import PRIORITY_RANK, Action

if TYPE_CHECKING:
    from benchmarks.fleet.workload import Cell
    from nodeside.testing import Replay


@dataclass
class LowFloor:
    """Per short cell, what it must wait for by the rules and the handoff, as it asks."""

    short: float
    open_cells: dict[str, Cell]
    #: id(cell) -> its own pool's NORMAL work ahead of it, in GPU seconds.
    ahead: dict[int, float] = field(default_factory=dict)
    #: id(cell) -> (the other pool's NORMAL holder, its hold's start, its quantum's end).
    found: dict[int, tuple[str, float, float]] = field(default_factory=dict)
    #: id(cell) -> the handoff it waits for at the least (any short cell, mode on).
    handoff: dict[int, float] = field(default_factory=dict)

    def observe(self, replay: Replay, _: list[Action]) -> None:
        now = replay.now
        sched = replay.scheduler
        for client_id, wait in replay.open_waits().items():
            cell = self.open_cells.get(client_id)
            if wait.start != now or cell is None or cell.start != now \
                    or cell.burst >= self.short:
                continue  # only a short cell's first request, as it is made
            gpu = sched.gpus[sched.clients[client_id].gpu]
            if sched.mode == "on":
                for holder in gpu.holders.values():
                    worker = replay.workers.get(holder.id)
                    if holder.id == client_id or worker is None or holder.hold is None:
                        continue
                    asked = holder.hold.drop_sent_at  # already asked to leave: less to go
                    giving_back = replay.release_delay - (now - asked if asked is not None
                                                          else 0.0)
                    self.handoff[id(cell)] = max(0.0, min(giving_back, worker.left(now)))
            if cell.priority != "LOW" or sched.mode != "on":
                continue  # (in mode auto a LOW cell may run beside NORMAL work that fits)
            ahead = 0.0
            for other in (*gpu.holders.values(), *gpu.waiters.values()):
                worker = replay.workers.get(other.id)
                if other.preemptible or other.pool != cell.pool or worker is None:
                    continue
                ahead += worker.left(now)
            self.ahead[id(cell)] = ahead
            for holder in gpu.holders.values():
                if holder.preemptible or holder.hold is None or holder.pool == cell.pool:
                    continue
                quantum_end = holder.hold.quantum_start + sched.tq_for(gpu.spec.index)
                self.found[id(cell)] = (holder.id, holder.hold.granted_at, quantum_end)

    def report(self, replay: Replay, finished: list[Cell], cells: list[Cell] | None = None
               ) -> dict[str, float]:
        """The floors over ``finished`` cells, and how many LOW short cells asked behind NORMAL
        work; ``cells`` are all the fleet's cells (default ``finished``), for the memory and
        backlog that cells still running at the end imposed."""
        everyone = finished if cells is None else cells
        restore = restores(replay, everyone)
        # One holder at a time (mode on) is what makes the backlog a floor.
        backlog = higher_priority_backlog(everyone) if replay.scheduler.mode == "on" else {}
        ends = {(s.client, s.start): s.end for s in replay.spans}
        low, normal, any_low, any_normal = [], [], [], []
        for cell in finished:
            if cell.burst >= self.short:
                continue
            memory = restore.get(id(cell), 0.0)
            handoff = self.handoff.get(id(cell), 0.0)
            if cell.priority != "LOW":
                normal.append(_slowdown(cell, handoff + memory))
                any_normal.append(_slowdown(cell, backlog.get(id(cell), 0.0) + memory))
                continue
            imposed = self.ahead.get(id(cell), 0.0)
            found = self.found.get(id(cell))
            if found is not None:
                holder, granted, quantum_end = found
                end = ends.get((holder, granted))
                stop = quantum_end if end is None else min(end, quantum_end)
                imposed += max(0.0, stop - cell.start)
            low.append(_slowdown(cell, max(imposed, handoff) + memory))
            any_low.append(_slowdown(cell, backlog.get(id(cell), 0.0) + memory))
        return {
            "low_asked_behind_normal": sum(1 for c in finished if id(c) in self.found
                                           or self.ahead.get(id(c), 0.0) > 0.0),
            "short_slowdown_mean_low_floor": _mean(low),
            "short_slowdown_mean_normal_floor": _mean(normal),
            "short_slowdown_mean_floor": _mean(normal + low),
            "short_slowdown_mean_low_floor_any_policy": _mean(any_low),
            "short_slowdown_mean_normal_floor_any_policy": _mean(any_normal),
            "short_slowdown_mean_floor_any_policy": _mean(any_normal + any_low),
            "short_restores": sum(1 for c in finished if c.burst < self.short
                                  and id(c) in restore),
        }


def restores(replay: Replay, cells: list[Cell]) -> dict[int, float]:
    """id(cell) -> seconds its own working set takes to come back from host, for each cell
    whose memory was certainly moved out since its notebook's previous cell (module docstring):
    what a policy cannot spare it, given when the cells arrived."""
    switching = model_of(replay)
    if switching is None:
        return {}
    sizes = {w.name: min(w.working_set if w.working_set is not None else switching.capacity,
                         switching.capacity) for w in replay.workers.values()}
    by_gpu: dict[int, list[Cell]] = {}
    for cell in sorted(cells, key=lambda c: c.start):
        by_gpu.setdefault(cell.gpu, []).append(cell)
    seconds: dict[int, float] = {}
    for on_gpu in by_gpu.values():
        starts = [c.start for c in on_gpu]
        previous: dict[str, Cell] = {}
        for cell in on_gpu:
            before = previous.get(cell.notebook)
            previous[cell.notebook] = cell
            if before is None or before.end is None:
                continue
            mine = sizes[cell.notebook]
            for other in on_gpu[bisect.bisect_left(starts, before.end):]:
                if other.start >= cell.start:
                    break
                if other.notebook != cell.notebook and other.end is not None \
                        and other.end <= cell.start \
                        and mine + sizes[other.notebook] > switching.capacity:
                    seconds[id(cell)] = mine / switching.bandwidth
                    break
    return seconds


def higher_priority_backlog(cells: list[Cell]) -> dict[int, float]:
    """id(cell) -> GPU seconds of its own pool's higher-priority work on its GPU that a server
    serving that work first, and nothing else, would still have when the cell asks.

    Under any policy that keeps "within a pool, HIGH before NORMAL before LOW", that work is
    served before the cell starts; and no policy has served more of it by then than a server
    that did nothing else (the same arrivals, no handoffs, no memory moves), so the cell waits
    at least this long."""
    left: dict[tuple[int, str, int], float] = {}  # (GPU, pool, rank) -> backlog of ranks below
    last: dict[tuple[int, str, int], float] = {}
    ranks = sorted(set(PRIORITY_RANK.values()))
    backlog: dict[int, float] = {}
    for cell in sorted(cells, key=lambda c: c.start):
        mine = PRIORITY_RANK[cell.priority]
        for rank in ranks:
            key = (cell.gpu, cell.pool, rank)
            work = max(0.0, left.get(key, 0.0) - (cell.start - last.get(key, cell.start)))
            if rank == mine:
                backlog[id(cell)] = work
            if mine < rank:  # higher priority than the cells of this rank
                work += cell.burst
            left[key], last[key] = work, cell.start
    return backlog


def _slowdown(cell: Cell, imposed: float) -> float:
    """The cell's slowdown had it waited only ``imposed`` (never more than it did wait)."""
    return (cell.burst + min(imposed, cell.wait)) / cell.burst


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 1.0
