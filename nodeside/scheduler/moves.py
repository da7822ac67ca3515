"""The moves: every change of a hold, and the state the scheduling rules read.

A grant, a drop, the end of a hold and the withdrawal of drops each change a client's hold
state (through ``Client.move``, which checks the transition table in state.py) and keep the
books that go with it: the wait queue, the share meter, the policy's hooks, the counters and the
promise a drop makes to the holder it makes room for. ``Turns`` (turns.py) decides which move
follows an event; ``Scheduler`` (core.py) holds the state declared here.
"""

from __future__ import annotations

import itertools

from nodeside.config import SchedulerConfig
from nodeside.scheduler import room
from nodeside.scheduler.actions import Action, Drop, Grant
from nodeside.scheduler.choosing import PoolsPolicy
from nodeside.scheduler.pools import Pool, preemption_enabled
from nodeside.scheduler.state import Client, GpuState, Hold, HoldState


class Moves:
    """The state every rule uses and the moves every rule makes; ``Scheduler`` holds it."""

    config: SchedulerConfig
    mode: str
    tq: float
    gpus: dict[int, GpuState]
    _pools: dict[str, Pool]
    clients: dict[str, Client]
    counts: dict[str, int]
    choice: PoolsPolicy
    _order: itertools.count[int]
    _events: int

    def pool(self, name: str) -> Pool:
        pool = self._pools.get(name)
        if pool is None:
            pool = self._pools[name] = self.config.pool(name)
        return pool

    def tq_for(self, gpu: int) -> float:
        override = self.gpus[gpu].tq_override
        return self.tq if override is None else override

    def _quantum(self, gpu: int) -> float | None:
        return None if self.mode == "off" else self.tq_for(gpu)

    #: Read off the config once (``_read_config``), not on every event: may a holder be
    #: preempted, and does any pool have a maximum below the whole GPU? Most nodes have no
    #: maximum, and then no share needs measuring on a handoff's path.
    preemption: bool
    capped: bool

    def _read_config(self) -> None:
        self.preemption = preemption_enabled(self.config.pools)
        self.capped = any(pool.cap < 1.0 for pool in self.config.pools.values())

    @property
    def _reserve(self) -> int:
        return self.config.memory_reserve

    # -- the moves ------------------------------------------------------------------------

    def _grant(self, gpu: GpuState, client: Client, now: float) -> Grant:
        client.move(HoldState.HOLDING)
        gpu.waiters.remove(client)
        client.hold = Hold(granted_at=now, quantum_start=now)
        gpu.holders[client.id] = client
        gpu.meter.open(client.id, client.pool, now, client.preemptible)
        gpu.history.opened(client, now)
        # The policy still sees when it asked: a request that went on after a drop is told
        # from a new one by that, not by when it was granted (attained.py).
        self.choice.on_grant(gpu, client, now)
        client.requested_at = None
        self.counts["grants"] += 1
        return Grant(client.id, gpu.spec.index, self._quantum(gpu.spec.index))

    def _drop(self, gpu: GpuState, holder: Client, reason: str, now: float,
              incoming: Client | None, evict: bool | None = None) -> list[Action]:
        holder.move(HoldState.DROPPING)
        hold = holder.hold
        assert hold is not None
        hold.drop_reason = reason
        hold.drop_sent_at = now
        hold.drop_evict = self._evict_on_leave(gpu, holder, now, incoming) \
            if evict is None else evict
        hold.drop_incoming = incoming.id if incoming is not None else None
        self.counts["drops"] += 1
        return [Drop(holder.id, gpu.spec.index, reason, hold.drop_evict, self.config.grace)]

    def _withdraw_drops(self, gpu: GpuState) -> None:
        """Mode off: nobody has to leave any more, so no drop may stay armed (and revoke)."""
        for holder in room.leaving(gpu):
            hold = holder.hold
            assert hold is not None
            holder.move(HoldState.HOLDING)
            hold.drop_reason = hold.drop_sent_at = hold.drop_incoming = None
            hold.drop_evict = False
        gpu.promised = None

    def _end_hold(self, client: Client, now: float) -> None:
        client.move(HoldState.IDLE)
        gpu = self.gpus[client.gpu]
        hold = client.hold
        assert hold is not None
        self.choice.on_hold_end(client, now)
        if hold.paused_since is not None:
            gpu.paused -= 1
        if hold.drop_incoming is not None:
            gpu.promised = hold.drop_incoming
        gpu.holders.pop(client.id, None)
        gpu.meter.close(client.id, now)
        gpu.history.closed(client.id, now)
        held = now - hold.granted_at
        client.gpu_seconds += held
        gpu.pool_seconds[client.pool] = gpu.pool_seconds.get(client.pool, 0.0) + held
        client.hold = None

    def _evict_on_leave(self, gpu: GpuState, leaving: Client, now: float,
                        incoming: Client | None = None) -> bool:
        """Must ``leaving`` move its memory out? Only when the next holder needs the room."""
        if incoming is None:
            incoming = self.choice.pick(gpu, now)
        return room.evict_needed(gpu, leaving, incoming, self._reserve)
