"""Where short cells' waiting goes: the fleet benchmark's ``--explain`` breakdown.

An observer on the replay, like ``shares.Contention``: between two batches of actions the
scheduler's state does not change, so each interval is charged to what the earlier batch left.
For every short cell (burst under ``runs.SHORT_CELL``) that is not working, the interval goes
to one cause, the first that applies:

* ``own memory moves``: it holds the GPU, and its own grant is still moving memory;
* ``side by side: sharing the GPU``: it works, beside other holders, so slower than alone, or
  it holds but is paused while another has its turn (``interactive.turns``): the seconds its
  work took beyond its burst, from the replay's record of each cell, not an interval's cause;
* ``handoff: memory moves``: another holder's grant is moving memory;
* ``handoff: holder giving back``: the holder was asked to leave and has not yet;
* ``held back: a light request's turn``: mode auto under ``policy: interactive``, it is heavy
  beside a light holder in its turn (``nodeside.scheduler.light_first``);
* ``holder's remaining quantum``: it is next, and the holder works on; under a policy that cuts
  quanta, split by why the quantum is not cut yet: ``LOW never cuts``, ``not lighter than
  half the holder`` (``CUT_RATIO``), ``cut due`` (after the first quantum or the memory
  moves' cost);
* ``pool at its maximum``: its pool has reached its maximum share (it waits, even with the GPU
  idle, until the pool's share falls below it);
* ``higher priority``: the next holder-to-be has a higher priority;
* ``pool rule: guarantee owed`` / ``pool rule: share``: the next is of another pool (or the
  holder, competing as if it asked again, is), chosen by the pools' rules (a guarantee owed, a
  pool further below its entitlement) rather than by attained service;
* ``other pool, less used``: the next is of another pool, chosen by attained service;
* ``counted heavy for earlier cells``: the next, of its own lane, used less GPU time than this
  cell's notebook did including its earlier cells, but more than this request alone;
* ``waiters ahead``: the next is of its own lane and goes first by request order or by using
  less (the queue itself).

Each cause is counted twice: in seconds, and in what it adds to short cells' mean slowdown
(a second of waiting adds 1/burst to its cell's slowdown), the figure the fleet reports; a
quarter-second cell waiting one second weighs as much as a ten-second cell waiting forty.

It also counts what the diagnosis needs besides: quanta cut short (and by how much), short
cells dropped mid-cell, and how light a short cell's request looks to the policy when it asks.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nodeside import protocol as p
from nodeside.scheduler.core import (
    PRIORITY_RANK,
    Action,
    ClientRecord,
    Drop,
    GpuState,
    Grant,
    HoldState,
)
from nodeside.scheduler.interactive import CUT_RATIO, InteractivePolicy
from nodeside.scheduler.turns import as_tail

if TYPE_CHECKING:
    from benchmarks.fleet.workload import Cell
    from nodeside.testing import Replay

#: The cause a cell's own record gives (``Cell.shared``), not an interval of waiting.
SHARING = "side by side: sharing the GPU"
HELD_BACK = "held back: a light request's turn"
CAUSES = (
    "own memory moves", SHARING, "handoff: memory moves", "handoff: holder giving back",
    HELD_BACK, "holder's remaining quantum", "holder's quantum: LOW never cuts",
    "holder's quantum: not lighter than half the holder", "holder's quantum: cut due",
    "pool at its maximum", "higher priority", "pool rule: guarantee owed", "pool rule: share",
    "other pool, less used", "counted heavy for earlier cells", "waiters ahead",
)
_EPS = 1e-9


@dataclass
class Explain:
    """Short cells' waiting seconds by cause, and the policy's decisions that shaped them."""

    short: float
    open_cells: dict[str, Cell]
    last: float = 0.0
    seconds: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    #: id(cell) -> its waiting seconds by cause, for what each cause adds to its slowdown.
    by_cell: dict[int, defaultdict[str, float]] = field(default_factory=dict)
    #: Quanta ended early for a lighter waiter: how many, and the seconds each one ran.
    cut_short: list[float] = field(default_factory=list)
    quantum_drops: int = 0
    #: Drops of a holder whose cell is short, by reason (it must ask again: more waiting).
    short_dropped: Counter[str] = field(default_factory=Counter)
    #: Short-cell requests: its notebook's attained service when it asks, and the holder's.
    asked: list[tuple[float, float]] = field(default_factory=list)
    #: Grants whose holder's memory had to move, and of those, short cells'.
    grants: int = 0
    grants_moving: int = 0
    #: (cause, when a memory move ends or None, the cause after it, the cell waiting).
    _pending: list[tuple[str, float | None, str, Cell]] = field(default_factory=list)

    def observe(self, replay: Replay, actions: list[Action]) -> None:
        now = replay.now
        for cause, split, after, cell in self._pending:
            # A memory move that ends inside the interval: the rest is the next cause.
            if split is not None and self.last < split < now:
                self._charge(cell, cause, split - self.last)
                if after:  # else it works from then on
                    self._charge(cell, after, now - split)
            else:
                self._charge(cell, cause, now - self.last)
        self.last = now
        self._count(replay, actions)
        self._pending = []
        for gpu in replay.scheduler.gpus.values():
            self._snapshot(replay, gpu)

    def _charge(self, cell: Cell, cause: str, seconds: float) -> None:
        self.seconds[cause] += seconds
        self.by_cell.setdefault(id(cell), defaultdict(float))[cause] += seconds

    def _short_cell(self, client_id: str) -> Cell | None:
        cell = self.open_cells.get(client_id)
        return cell if cell is not None and cell.burst < self.short else None

    def _is_short(self, client_id: str) -> bool:
        return self._short_cell(client_id) is not None

    def _count(self, replay: Replay, actions: list[Action]) -> None:
        sched = replay.scheduler
        for action in actions:
            if isinstance(action, Grant):
                self.grants += 1
                span = replay.open_span(action.client)
                if span is not None and span.switching > 0:
                    self.grants_moving += 1
            elif isinstance(action, Drop):
                client = sched.clients.get(action.client)
                hold = client.hold if client is not None else None
                if action.reason == p.REASON_QUANTUM and hold is not None:
                    self.quantum_drops += 1
                    ran = replay.now - hold.quantum_start
                    if ran < sched.tq_for(action.gpu) - _EPS:
                        self.cut_short.append(ran)
                if self._is_short(action.client):
                    self.short_dropped[action.reason] += 1
        policy = sched.choice
        for client_id, wait in replay.open_waits().items():
            if wait.start == replay.now and self._is_short(client_id) \
                    and isinstance(policy, InteractivePolicy):
                gpu = sched.gpus[sched.clients[client_id].gpu]
                holders = [policy.attained(h, replay.now) for h in gpu.holders]
                self.asked.append((policy.attained(client_id, replay.now),
                                   max(holders, default=0.0)))

    def _snapshot(self, replay: Replay, gpu: GpuState) -> None:
        now = replay.now
        moving_until = None
        for holder_id in gpu.holders:
            span = replay.open_span(holder_id)
            if span is None or span.start + span.switching <= now + _EPS:
                continue
            moving_until = span.start + span.switching
            cell = self._short_cell(holder_id)
            if cell is not None:
                self._pending.append(("own memory moves", moving_until, "", cell))
        if not gpu.waiters:
            return
        nxt = _next(replay, gpu)
        for waiter in gpu.waiters.values():
            cell = self._short_cell(waiter.id)
            if cell is None:
                continue
            after = self._cause(replay, gpu, waiter, nxt)
            if moving_until is not None:
                self._pending.append(("handoff: memory moves", moving_until, after, cell))
            elif any(h.hold_state is HoldState.DROPPING for h in gpu.holders.values()):
                self._pending.append(("handoff: holder giving back", None, "", cell))
            else:
                self._pending.append((after, None, "", cell))

    def _cause(self, replay: Replay, gpu: GpuState, waiter: ClientRecord,
               nxt: ClientRecord | None) -> str:
        policy = replay.scheduler.choice
        # The interactive policy's own measures, where it runs (None under round robin).
        las = policy if isinstance(policy, InteractivePolicy) else None
        if policy.over_maximum(gpu, waiter.pool, replay.now):
            return "pool at its maximum"
        light_first = policy.light_first
        if light_first is not None and light_first.holds_back(gpu, waiter, replay.now):
            return HELD_BACK
        if nxt is None or nxt.id == waiter.id:
            holder = next(iter(gpu.holders.values()), None)
            if las is None or holder is None:
                return "holder's remaining quantum"
            if PRIORITY_RANK[waiter.priority] > PRIORITY_RANK[holder.priority]:
                return "holder's quantum: LOW never cuts"
            # The holder competes as if it asked again (turns._end_quanta): where it would win,
            # its quantum is not cut, and it is the pools' rules or its lane's order that keep it.
            tail = policy.pick(gpu, replay.now, as_tail(holder))
            if tail is not None and tail.id == holder.id:
                if holder.pool == waiter.pool:
                    return "waiters ahead"
                if policy.below_guarantee(gpu, holder, replay.now):
                    return "pool rule: guarantee owed"
                return "pool rule: share"
            if las.attained(waiter.id, replay.now) > CUT_RATIO * las.attained(
                    holder.id, replay.now):
                return "holder's quantum: not lighter than half the holder"
            return "holder's quantum: cut due"
        if PRIORITY_RANK[nxt.priority] < PRIORITY_RANK[waiter.priority]:
            return "higher priority"
        if nxt.pool != waiter.pool:
            if policy.below_guarantee(gpu, nxt, replay.now):
                return "pool rule: guarantee owed"
            if las is not None and las.attained(nxt.id, replay.now) < las.attained(
                    waiter.id, replay.now):
                return "other pool, less used"
            return "pool rule: share"
        if las is not None and not las.starved(nxt):
            now = replay.now
            theirs = las.attained(nxt.id, now)
            mine = las.attained(waiter.id, now)
            this_request = las.request_seconds(waiter.id)
            if this_request <= theirs < mine:
                return "counted heavy for earlier cells"
        return "waiters ahead"

    def report(self, waited: float, finished: list[Cell] | None = None) -> dict:
        """The breakdown, with ``waited`` (short cells' total wait as the fleet measured it)
        to check the causes add up; with the ``finished`` cells, also what each cause adds to
        their short cells' mean slowdown."""
        light = [mine for mine, _ in self.asked]
        short = [c for c in finished or [] if c.burst < self.short]
        by_cause = dict(self.seconds)
        slowdown: defaultdict[str, float] = defaultdict(float)
        for cell in short:
            causes = {**self.by_cell.get(id(cell), {})}
            if cell.shared > 0:
                causes[SHARING] = cell.shared
                by_cause[SHARING] = by_cause.get(SHARING, 0.0) + cell.shared
            for cause, seconds in causes.items():
                slowdown[cause] += seconds / cell.burst / len(short)
        return {
            "short_wait_seconds": by_cause,
            "short_slowdown_by_cause": dict(slowdown),
            "short_wait_total": waited,
            "quanta_ended": self.quantum_drops,
            "cut_short": len(self.cut_short),
            "cut_short_ran_mean": statistics.fmean(self.cut_short) if self.cut_short else 0.0,
            "short_dropped": dict(self.short_dropped),
            "grants": self.grants, "grants_moving_memory": self.grants_moving,
            "short_asked": len(self.asked),
            "short_asked_with_history": sum(1 for v in light if v > 1.0),
            "short_asked_attained_median": statistics.median(light) if light else 0.0,
            "short_asked_lighter_than_half_the_holder": sum(
                1 for mine, holder in self.asked if mine <= 0.5 * holder),
        }


def _next(replay: Replay, gpu: GpuState) -> ClientRecord | None:
    """Who the GPU goes to next: the one a drop promised, else the policy's pick."""
    for holder in gpu.holders.values():
        if holder.hold is not None and holder.hold.drop_incoming is not None:
            return gpu.waiters.get(holder.hold.drop_incoming)
    return replay.scheduler.choice.pick(gpu, replay.now)
