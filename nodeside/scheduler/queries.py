"""What the shell and the status document ask the scheduler: deadlines, queues, shares.

Read-only, except that ``next_deadline`` keeps its answer until the next event. The queue is a
prediction (see ``choosing.PoolsPolicy.order``); ``queue_position`` answers for one waiter
without building it, which is what every ``waiting`` reply asks.
"""

from __future__ import annotations

import math
from typing import Final, final

from nodeside.scheduler.gpu_state import ClientRecord, GpuState, HoldState
from nodeside.scheduler.node import NodeState
from nodeside.scheduler.residency import ResidencyRules
from nodeside.scheduler.room import Room
from nodeside.scheduler.taking_turns import TakingTurns
from nodeside.scheduler.turns import Turns, current_quantum_start

# A pool held back at its maximum is looked at again after this fraction of the share window.
_MAX_RECHECK: Final = 0.005


@final
class Queries:
    """The questions asked between events; ``next_deadline`` keeps its answer meanwhile."""

    def __init__(self, state: NodeState, room: Room, turns: Turns, taking: TakingTurns,
                 residency: ResidencyRules) -> None:
        self.state = state
        self.room = room
        self.turns = turns
        self.taking = taking
        self.residency = residency
        #: The last answer, and the marks of the node it holds for (``_marks``); -1: none kept.
        self._deadline_marks = -1
        self._deadline: float | None = None

    def next_deadline(self, now: float) -> float | None:
        """When ``tick`` must next be called, or None if nothing is due until the next event.

        The shell asks after every request; the answer changes only with an event (holders,
        waiters, quanta, mode, TQ), so it is kept until the next one, unless it depended on
        ``now`` or on shares that move with time (a pool with a maximum).
        """
        marks = self._marks()
        if marks == self._deadline_marks:
            return self._deadline
        deadline, timeless = self.compute_deadline(now)
        self._deadline_marks = marks if timeless else -1
        self._deadline = deadline
        return deadline

    def _marks(self) -> int:
        """Events and TQ changes so far: both only grow, so an equal sum means neither moved."""
        state = self.state
        marks = state.events
        for gpu in state.gpus.values():
            marks += gpu.tq_changes
        return marks

    def compute_deadline(self, now: float) -> tuple[float | None, bool]:
        """The next deadline, and whether it holds until the next event whatever the time."""
        state = self.state
        mode = state.mode
        if mode == "off":
            return None, True  # mode off keeps no deadline on any GPU
        # The earliest so far (inf: none), not a list and min(): asked after every handoff. A
        # deadline is never inf itself: a TQ, a grace and the windows are finite.
        earliest = math.inf
        timeless = True
        capped = state.capped
        choice = state.choice
        for gpu in state.gpus.values():
            for holder in gpu.holders.values():
                hold = holder.hold
                assert hold is not None
                if capped and state.pool(holder.pool).cap < 1.0:
                    timeless = False  # its share crosses the maximum as time goes
                if hold.drop_sent_at is not None:
                    earliest = min(earliest, hold.drop_sent_at + state.grace)
                elif gpu.waiters or choice.over_maximum(gpu, holder.pool, now):
                    earliest = min(earliest, hold.quantum_start
                                   + self.turns.quantum_length(gpu, holder, now))
                    if choice.light_first is not None and gpu.waiters and mode == "on":
                        # Whether the quantum is cut short changes as GPU time is used, with
                        # no event to say so: look again after a first quantum.
                        earliest = min(earliest, now + state.config.interactive.first_quantum)
                        timeless = False
            if mode == "auto":
                turn_end = self.taking.turn_deadline(gpu)
                if turn_end is not None:
                    earliest = min(earliest, turn_end)
                light_first = choice.light_first
                if light_first is not None and light_first.aside_may_come(gpu, now):
                    # Who is light beside whom, and whose turn is over, change as GPU time is
                    # used, with no event to say so: look again after a first quantum.
                    earliest = min(earliest, now + state.config.interactive.first_quantum)
                    timeless = False
            if gpu.memory_clients:
                due = self.residency.deadline(gpu)
                if due is not None:
                    earliest = min(earliest, due)
            if not gpu.waiters:
                continue
            if capped:
                timeless = timeless and all(state.pool(p).cap >= 1.0
                                            for p in gpu.waiters.pools())
            if capped and any(choice.over_maximum(gpu, pool, now)
                              for pool in gpu.waiters.pools()):
                earliest = min(earliest, now + max(gpu.meter.window * _MAX_RECHECK, 0.001))
                timeless = False
            elif self._grantable(gpu, now):
                # Shares fall while the GPU idles: a pool held back at its maximum may have
                # become eligible since the last schedule with no event to say so. Asking for
                # a tick now (not at the recheck armed earlier, which a caller re-arming from
                # this answer would cancel) keeps that wake-up from being lost.
                earliest = min(earliest, now)
                timeless = False
        return (None if earliest == math.inf else earliest), timeless

    def _grantable(self, gpu: GpuState, now: float) -> bool:
        """Would a schedule now grant someone? (mode on or auto)"""
        state = self.state
        if gpu.holders and state.mode != "auto":
            return False  # mode on grants nobody beside a holder, whoever would be next
        candidate = state.choice.pick(gpu, now)
        if candidate is None:
            return False
        if gpu.memory_clients and gpu.ledger.shortfall(candidate) > \
                self.residency.coming(gpu, candidate):
            return False  # it waits for evictions, whose reports are events
        light_first = state.choice.light_first
        return not gpu.holders or (self.room.fits_beside(gpu, [candidate]) and not (
            light_first is not None and light_first.holds_back(gpu, candidate, now)))

    def gpu_seconds(self, client: ClientRecord, now: float) -> float:
        held = now - client.hold.granted_at if client.hold else 0.0
        return client.gpu_seconds + held

    def pool_gpu_seconds(self, gpu_index: int, now: float) -> dict[str, float]:
        """GPU seconds each pool has held ``gpu_index`` for since start, open holds included."""
        gpu = self.state.gpus[gpu_index]
        seconds = dict(gpu.pool_seconds)
        for holder in gpu.holders.values():
            seconds[holder.pool] = seconds.get(holder.pool, 0.0) + self.gpu_seconds(holder, now) \
                - holder.gpu_seconds
        return seconds

    def queue(self, gpu_index: int, now: float) -> list[ClientRecord]:
        """Waiters in the order they are expected to be granted, next first."""
        gpu = self.state.gpus[gpu_index]
        if not gpu.waiters:
            return []
        promised = self._promised(gpu)
        first = {c.id for c in promised}
        return promised + [c for c in self.state.choice.order(gpu, now) if c.id not in first]

    def queue_position(self, client_id: str, now: float) -> int | None:
        """A waiter's 1-based place in ``queue``, without building the queue."""
        state = self.state
        client = state.clients.get(client_id)
        if client is None or client.hold_state is not HoldState.WAITING:
            return None
        gpu = state.gpus[client.gpu]
        choice = state.choice
        promised = self._promised(gpu)
        if not promised:  # nobody was dropped for: the policy's order is the queue
            return choice.position(gpu, client, now)
        ids = [c.id for c in promised]
        if client.id in ids:
            return ids.index(client.id) + 1
        place = choice.position(gpu, client, now)
        before = sum(choice.position(gpu, c, now) < place for c in promised)
        return len(promised) + place - before

    def _promised(self, gpu: GpuState) -> list[ClientRecord]:
        """Waiters that holders asked to drop were dropped for: they go first, in that order."""
        for holder in gpu.holders.values():
            if holder.hold is not None and holder.hold.drop_incoming is not None:
                break
        else:
            return []  # nobody dropped for anyone (every waiting reply): no list to make
        promised: list[ClientRecord] = []
        for holder in gpu.holders.values():
            if holder.hold is not None and holder.hold.drop_incoming is not None:
                waiter = gpu.waiters.get(holder.hold.drop_incoming)
                if waiter is not None and all(w is not waiter for w in promised):
                    promised.append(waiter)
        return promised

    def quantum_remaining(self, gpu_index: int, now: float) -> float | None:
        state = self.state
        gpu = state.gpus[gpu_index]
        if state.mode == "off" or not gpu.holders:
            return None
        first = next(iter(gpu.holders.values()))
        assert first.hold is not None
        tq = state.tq_for(gpu_index)
        start = first.hold.quantum_start
        if not gpu.waiters and first.hold_state is HoldState.HOLDING:
            start = current_quantum_start(first.hold, tq, now)  # renewed while alone
        return max(0.0, start + tq - now)
