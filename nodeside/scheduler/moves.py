"""The moves: every change of a hold, and the books kept with it.

A grant, a drop, the end of a hold and the withdrawal of drops each change a client's hold
state (through ``ClientRecord.move``, which checks the transition table in clients.py) and keep the
books that go with it: the wait queue, the share meter, the events the policy learns from, the
counters and the promise a drop makes to the holder it makes room for. Only ``Turns`` (turns.py)
makes moves: it decides which one follows an event, and holds this object privately.
"""

from __future__ import annotations

from typing import final

from nodeside.scheduler import fair_eviction
from nodeside.scheduler.actions import Action, Drop, Grant
from nodeside.scheduler.gpu_state import ClientRecord, GpuState, Hold, HoldState
from nodeside.scheduler.node import NodeState
from nodeside.scheduler.residency import granted
from nodeside.scheduler.room import Room, leaving
from nodeside.scheduler.view import Granted, HoldEnded


@final
class Moves:
    """Grant, drop, end a hold, withdraw drops: each with its books."""

    def __init__(self, state: NodeState, room: Room) -> None:
        self.state = state
        self.room = room
        self.counts = state.counts

    def grant(self, gpu: GpuState, client: ClientRecord, now: float) -> Grant:
        client.move(HoldState.HOLDING)
        gpu.waiters.remove(client)
        client.hold = Hold(granted_at=now, quantum_start=now)
        gpu.holders[client.id] = client
        gpu.meter.open(client.id, client.pool, now, client.preemptible)
        gpu.history.opened(client, now)
        if client.memory:
            granted(client, now)
            gpu.ledger.book(client)  # it holds: its need counts now, not its idle bytes
        else:  # its use cannot be seen: only a memory client's grants are judged
            client.room_asked = 0
        # The policy still sees when it asked: a request that went on after a drop is told
        # from a new one by that, not by when it was granted (attained.py).
        choice = self.state.choice
        if choice.observes:
            choice.observe(Granted(gpu, client, now))
        client.requested_at = None
        self.counts["grants"] += 1
        return Grant(client.id, gpu.spec.index, self.state.quantum_of(gpu))

    def drop(self, gpu: GpuState, holder: ClientRecord, reason: str, now: float,
             incoming: ClientRecord | None, evict: bool | None = None) -> list[Action]:
        holder.move(HoldState.DROPPING)
        hold = holder.hold
        assert hold is not None
        hold.drop_reason = reason
        hold.drop_sent_at = now
        hold.drop_evict = self.evict_on_leave(gpu, holder, now, incoming) \
            if evict is None else evict
        hold.drop_incoming = incoming.id if incoming is not None else None
        self.counts["drops"] += 1
        return [Drop(holder.id, gpu.spec.index, reason, hold.drop_evict, self.state.grace)]

    def withdraw_drops(self, gpu: GpuState) -> None:
        """Mode off: nobody has to leave any more, so no drop may stay armed (and revoke)."""
        for holder in leaving(gpu):
            hold = holder.hold
            assert hold is not None
            holder.move(HoldState.HOLDING)
            hold.drop_reason = hold.drop_sent_at = hold.drop_incoming = None
            hold.drop_evict = False
        gpu.promised = None

    def end_hold(self, client: ClientRecord, now: float) -> None:
        client.move(HoldState.IDLE)
        gpu = self.state.gpus[client.gpu]
        hold = client.hold
        assert hold is not None
        choice = self.state.choice
        if choice.observes:
            choice.observe(HoldEnded(gpu, client, now))
        if hold.paused_since is not None:
            gpu.paused -= 1
        if hold.drop_incoming is not None:
            gpu.promised = hold.drop_incoming
        if client.id in gpu.holders:  # not pop(): compiled, a generic method call
            del gpu.holders[client.id]
        gpu.meter.close(client.id, now)
        gpu.history.closed(client.id, now)
        if client.memory:
            client.last_used = now
            fair_eviction.hold_ended(client, now, self.state.config.evict_interval)
            gpu.ledger.book(client)  # idle again: what it has counts against others' room
        held = now - hold.granted_at
        client.gpu_seconds += held
        gpu.pool_seconds[client.pool] = gpu.pool_seconds.get(client.pool, 0.0) + held
        client.hold = None

    def evict_on_leave(self, gpu: GpuState, leaver: ClientRecord, now: float,
                       incoming: ClientRecord | None = None) -> bool:
        """Must ``leaver`` move its memory out? Only when the next holder needs the room."""
        if incoming is None:
            incoming = self.state.choice.pick(gpu, now)
        return self.room.evict_needed(gpu, leaver, incoming)
