"""A floor under short cells' mean slowdown that the priority rules and handoffs impose.

Under either policy a LOW request never preempts a NORMAL holder and never cuts its quantum
short, and within a pool NORMAL goes before LOW, a holder's quantum ending included
(docs/policy.md). So a LOW short cell waits at least for the remaining work of every NORMAL
request of its own pool on its GPU when it asks (waiting or holding: all of it runs before the
cell can, whatever the policy, given the queue the cell finds), and, when the holder is a
NORMAL one of the other pool, for that holder's quantum or hold as it ran, whichever ended
first (the cell could not cut it; another policy might have cut it for a NORMAL request, so
this part is this run's); the GPU serves one at a time, so the two add up.

And in mode on any short cell that asks while another client holds its GPU waits at least
until that holder's work is done or, if it is asked to leave, until it has given the GPU back
(the fleet's ``release_delay``, 0.2 s): the smaller of the two. A cell's floor is the larger
of what applies to it.

``LowFloor`` records both for every short cell as it asks, and ``report`` turns them into
floors of the mean slowdown: NORMAL short cells', LOW short cells', and all short cells'.
Everything else (requests that come later, memory moves, the other pool's turns, the policy's
own choices) comes on top.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nodeside.scheduler.actions import Action

if TYPE_CHECKING:
    from benchmarks.fleet import Cell
    from nodeside.scheduler.replay import Replay, Worker


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
                    self.handoff[id(cell)] = max(0.0, min(giving_back, _left(worker, now)))
            if cell.priority != "LOW":
                continue
            ahead = 0.0
            for other in (*gpu.holders.values(), *gpu.waiters.values()):
                worker = replay.workers.get(other.id)
                if other.preemptible or other.pool != cell.pool or worker is None:
                    continue
                ahead += _left(worker, now)
            self.ahead[id(cell)] = ahead
            for holder in gpu.holders.values():
                if holder.preemptible or holder.hold is None or holder.pool == cell.pool:
                    continue
                quantum_end = holder.hold.quantum_start + sched.tq_for(gpu.spec.index)
                self.found[id(cell)] = (holder.id, holder.hold.granted_at, quantum_end)

    def report(self, replay: Replay, finished: list[Cell]) -> dict[str, float]:
        """The floors over ``finished`` cells, and how many LOW short cells asked behind NORMAL
        work."""
        ends = {(s.client, s.start): s.end for s in replay.spans}
        low, normal = [], []
        for cell in finished:
            if cell.burst >= self.short:
                continue
            handoff = self.handoff.get(id(cell), 0.0)
            if cell.priority != "LOW":
                normal.append((cell.burst + min(handoff, cell.wait)) / cell.burst)
                continue
            imposed = self.ahead.get(id(cell), 0.0)
            found = self.found.get(id(cell))
            if found is not None:
                holder, granted, quantum_end = found
                end = ends.get((holder, granted))
                stop = quantum_end if end is None else min(end, quantum_end)
                imposed += max(0.0, stop - cell.start)
            imposed = max(imposed, handoff)
            low.append((cell.burst + min(imposed, cell.wait)) / cell.burst)
        short = len(normal) + len(low)
        return {
            "low_asked_behind_normal": sum(1 for c in finished if id(c) in self.found
                                           or self.ahead.get(id(c), 0.0) > 0.0),
            "short_slowdown_mean_low_floor": statistics.fmean(low) if low else 1.0,
            "short_slowdown_mean_normal_floor": statistics.fmean(normal) if normal else 1.0,
            "short_slowdown_mean_floor": (sum(normal) + sum(low)) / short if short else 1.0,
        }


def _left(worker: Worker, now: float) -> float:
    """GPU seconds of ``worker``'s burst still to do at ``now``."""
    done = max(0.0, now - worker.holding_since) if worker.holding_since is not None else 0.0
    return max(0.0, worker.remaining - done)
