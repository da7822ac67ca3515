"""What the shell and the status document ask the scheduler: deadlines, queues, shares.

Read-only, except that ``next_deadline`` keeps its answer until the next event. The queue is a
prediction (see ``choosing.PoolsPolicy.order``); ``queue_position`` answers for one waiter
without building it, which is what every ``waiting`` reply asks.
"""

from __future__ import annotations

from nodeside.scheduler import room
from nodeside.scheduler.choosing import contending_pools
from nodeside.scheduler.state import Client, GpuState, HoldState
from nodeside.scheduler.turns import Turns, current_quantum_start

# A pool held back at its maximum is looked at again after this fraction of the share window.
_MAX_RECHECK = 0.005


class Queries(Turns):
    _deadline_cache: tuple[object, float | None] | None

    def next_deadline(self, now: float) -> float | None:
        """When ``tick`` must next be called, or None if nothing is due until the next event.

        The shell asks after every request; the answer changes only with an event (holders,
        waiters, quanta, mode, TQ), so it is kept until the next one, unless it depended on
        ``now`` or on shares that move with time (a pool with a maximum).
        """
        key = (self._events, tuple([g.tq_override for g in self.gpus.values()]))  # no genexpr
        if self._deadline_cache is not None and self._deadline_cache[0] == key:
            return self._deadline_cache[1]
        deadline, timeless = self._compute_deadline(now)
        self._deadline_cache = (key, deadline) if timeless else None
        return deadline

    def _compute_deadline(self, now: float) -> tuple[float | None, bool]:
        """The next deadline, and whether it holds until the next event whatever the time."""
        if self.mode == "off":
            return None, True  # mode off keeps no deadline on any GPU
        deadlines: list[float] = []
        timeless = True
        capped = self.capped
        for gpu in self.gpus.values():
            for holder in gpu.holders.values():
                hold = holder.hold
                assert hold is not None
                if capped and self.pool(holder.pool).cap < 1.0:
                    timeless = False  # its share crosses the maximum as time goes
                if hold.drop_sent_at is not None:
                    deadlines.append(hold.drop_sent_at + self.config.grace)
                elif gpu.waiters or self.choice.over_maximum(gpu, holder.pool, now):
                    deadlines.append(hold.quantum_start + self._quantum_length(gpu, holder, now))
                    if self.choice.cuts_quanta and gpu.waiters and self.mode == "on":
                        # Whether the quantum is cut short changes as GPU time is used, with
                        # no event to say so: look again after a first quantum.
                        deadlines.append(now + self.config.interactive.first_quantum)
                        timeless = False
            turn_end = self._turn_deadline(gpu) if self.mode == "auto" else None
            if turn_end is not None:
                deadlines.append(turn_end)
            if self.mode == "auto" and self.choice.aside_may_come(gpu, now):
                # Who is light beside whom, and whose turn is over, change as GPU time is used,
                # with no event to say so: look again after a first quantum.
                deadlines.append(now + self.config.interactive.first_quantum)
                timeless = False
            if not gpu.waiters:
                continue
            if capped:
                timeless = timeless and all(self.pool(p).cap >= 1.0
                                            for p in gpu.waiters.pools())
            if capped and any(self.choice.over_maximum(gpu, pool, now)
                              for pool in gpu.waiters.pools()):
                deadlines.append(now + max(gpu.meter.window * _MAX_RECHECK, 0.001))
                timeless = False
            elif self._grantable(gpu, now):
                # Shares fall while the GPU idles: a pool held back at its maximum may have
                # become eligible since the last schedule with no event to say so. Asking for
                # a tick now (not at the recheck armed earlier, which a caller re-arming from
                # this answer would cancel) keeps that wake-up from being lost.
                deadlines.append(now)
                timeless = False
        return (min(deadlines) if deadlines else None), timeless

    def _grantable(self, gpu: GpuState, now: float) -> bool:
        """Would a schedule now grant someone? (mode on or auto)"""
        if gpu.holders and self.mode != "auto":
            return False  # mode on grants nobody beside a holder, whoever would be next
        candidate = self.choice.pick(gpu, now)
        if candidate is None:
            return False
        return not gpu.holders or (self._fits(gpu, [candidate])
                                   and not self.choice.holds_back(gpu, candidate, now))

    def _fits(self, gpu: GpuState, newcomers: list[Client]) -> bool:
        return room.fits_beside(gpu, newcomers, self.config.memory_reserve)

    def gpu_seconds(self, client: Client, now: float) -> float:
        held = now - client.hold.granted_at if client.hold else 0.0
        return client.gpu_seconds + held

    def pool_gpu_seconds(self, gpu_index: int, now: float) -> dict[str, float]:
        """GPU seconds each pool has held ``gpu_index`` for since start, open holds included."""
        gpu = self.gpus[gpu_index]
        seconds = dict(gpu.pool_seconds)
        for holder in gpu.holders.values():
            seconds[holder.pool] = seconds.get(holder.pool, 0.0) + self.gpu_seconds(holder, now) \
                - holder.gpu_seconds
        return seconds

    def queue(self, gpu_index: int, now: float) -> list[Client]:
        """Waiters in the order they are expected to be granted, next first."""
        gpu = self.gpus[gpu_index]
        if not gpu.waiters:
            return []
        promised = self._promised(gpu)
        first = {c.id for c in promised}
        return promised + [c for c in self.choice.order(gpu, now) if c.id not in first]

    def queue_position(self, client_id: str, now: float) -> int | None:
        """A waiter's 1-based place in ``queue``, without building the queue."""
        client = self.clients.get(client_id)
        if client is None or client.hold_state is not HoldState.WAITING:
            return None
        gpu = self.gpus[client.gpu]
        promised = self._promised(gpu)
        if not promised:  # nobody was dropped for: the policy's order is the queue
            return self.choice.position(gpu, client, now)
        ids = [c.id for c in promised]
        if client.id in ids:
            return ids.index(client.id) + 1
        place = self.choice.position(gpu, client, now)
        before = sum(self.choice.position(gpu, c, now) < place for c in promised)
        return len(promised) + place - before

    def _promised(self, gpu: GpuState) -> list[Client]:
        """Waiters that holders asked to drop were dropped for: they go first, in that order."""
        promised: list[Client] = []
        for holder in gpu.holders.values():
            if holder.hold is not None and holder.hold.drop_incoming is not None:
                waiter = gpu.waiters.get(holder.hold.drop_incoming)
                if waiter is not None and all(w is not waiter for w in promised):
                    promised.append(waiter)
        return promised

    def shares(self, gpu_index: int, now: float) -> dict[str, float]:
        gpu = self.gpus[gpu_index]
        return gpu.meter.shares(now, contending_pools(gpu))

    def quantum_remaining(self, gpu_index: int, now: float) -> float | None:
        gpu = self.gpus[gpu_index]
        if self.mode == "off" or not gpu.holders:
            return None
        first = next(iter(gpu.holders.values()))
        assert first.hold is not None
        tq = self.tq_for(gpu_index)
        start = first.hold.quantum_start
        if not gpu.waiters and first.hold_state is HoldState.HOLDING:
            start = current_quantum_start(first.hold, tq, now)  # renewed while alone
        return max(0.0, start + tq - now)
