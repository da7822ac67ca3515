"""A floor under short cells' mean slowdown that the priority rules impose, run by run.

Under either policy a LOW request never preempts a NORMAL holder and never cuts its quantum
short, and within a pool NORMAL goes before LOW, a holder's quantum ending included
(docs/policy.md). So a LOW short cell waits at least for the remaining work of every NORMAL
request of its own pool on its GPU when it asks (waiting or holding: all of it runs before the
cell can), and, when the holder is a NORMAL one of the other pool, for that holder's current
quantum or hold, whichever ends first; the GPU serves one at a time, so the two add up. That
is what the rules impose however the next holder is chosen. ``LowFloor`` records it for every
LOW short cell as it asks, and ``report`` turns it into two floors: LOW short cells' mean
slowdown, and the mean over all short cells were every NORMAL one served at once (slowdown 1)
and every LOW one waited only for that. Everything else (NORMAL requests that come later,
handoffs, memory moves, the other pool's turns) comes on top.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nodeside.scheduler.actions import Action

if TYPE_CHECKING:
    from benchmarks.fleet import Cell
    from nodeside.scheduler.replay import Replay


@dataclass
class LowFloor:
    """Per LOW short cell, the NORMAL hold it asked during and when that hold's quantum ended."""

    short: float
    open_cells: dict[str, Cell]
    #: id(cell) -> its own pool's NORMAL work ahead of it, in GPU seconds.
    ahead: dict[int, float] = field(default_factory=dict)
    #: id(cell) -> (the other pool's NORMAL holder, its hold's start, its quantum's end).
    found: dict[int, tuple[str, float, float]] = field(default_factory=dict)

    def observe(self, replay: Replay, _: list[Action]) -> None:
        now = replay.now
        sched = replay.scheduler
        for client_id, wait in replay.open_waits().items():
            cell = self.open_cells.get(client_id)
            if wait.start != now or cell is None or cell.start != now \
                    or cell.priority != "LOW" or cell.burst >= self.short:
                continue  # only a LOW short cell's first request, as it is made
            gpu = sched.gpus[sched.clients[client_id].gpu]
            ahead = 0.0
            for other in (*gpu.holders.values(), *gpu.waiters.values()):
                worker = replay.workers.get(other.id)
                if other.preemptible or other.pool != cell.pool or worker is None:
                    continue
                done = max(0.0, now - worker.holding_since) if worker.holding_since else 0.0
                ahead += max(0.0, worker.remaining - done)
            self.ahead[id(cell)] = ahead
            for holder in gpu.holders.values():
                if holder.preemptible or holder.hold is None or holder.pool == cell.pool:
                    continue
                quantum_end = holder.hold.quantum_start + sched.tq_for(gpu.spec.index)
                self.found[id(cell)] = (holder.id, holder.hold.granted_at, quantum_end)

    def report(self, replay: Replay, finished: list[Cell]) -> dict[str, float]:
        """The two floors over ``finished`` cells, and how many LOW short cells asked behind
        NORMAL work."""
        ends = {(s.client, s.start): s.end for s in replay.spans}
        low, normal = [], 0
        for cell in finished:
            if cell.burst >= self.short:
                continue
            if cell.priority != "LOW":
                normal += 1
                continue
            imposed = self.ahead.get(id(cell), 0.0)
            found = self.found.get(id(cell))
            if found is not None:
                holder, granted, quantum_end = found
                end = ends.get((holder, granted))
                stop = quantum_end if end is None else min(end, quantum_end)
                imposed += max(0.0, stop - cell.start)
            low.append((cell.burst + min(imposed, cell.wait)) / cell.burst)
        short = normal + len(low)
        return {
            "low_asked_behind_normal": sum(1 for c in finished if id(c) in self.found
                                           or self.ahead.get(id(c), 0.0) > 0.0),
            "short_slowdown_mean_low_floor": statistics.fmean(low) if low else 1.0,
            "short_slowdown_mean_floor": (normal + sum(low)) / short if short else 1.0,
        }
