"""Turns: every change of a hold, and what follows each event on a GPU.

A client asks for its GPU (``acquire``), gives it back or cancels its wait (``release``), reports
its working set, or leaves; the admin changes the mode; time passes. Each is taken here, and
then ``schedule`` says what follows on the GPU it touched: grant while the GPU is free (or the
next one fits, in mode auto), drop a LOW holder for a request owed its guarantee, end quanta that
ran out while someone eligible waits, revoke a holder past its grace, and (mode auto,
``interactive.turns``) say which holder side by side has its turn (taking_turns.py).

Who goes next is the policy's (``NodeState.choice``: choosing.py, interactive.py) and what fits
is the room's (room.py); the policy's ``light_first``, where it has one, may cut a quantum short
or ask a holder to step aside. Every change of a hold is made by ``Moves`` (moves.py), which
only this object holds.
"""

from __future__ import annotations

import math
from typing import Final, final

from nodeside import protocol as p
from nodeside.scheduler import fair_eviction
from nodeside.scheduler.actions import (
    Action,
    Drop,
    Grant,
    Refuse,
    Released,
    Revoke,
    SchedulerError,
)
from nodeside.scheduler.choosing import within_pool
from nodeside.scheduler.gpu_state import ClientRecord, GpuState, Hold, HoldState
from nodeside.scheduler.ledger import counted, need, outgoing_bytes
from nodeside.scheduler.moves import Moves
from nodeside.scheduler.node import NodeState
from nodeside.scheduler.residency import ResidencyRules, check_claim
from nodeside.scheduler.room import Room, leaving, staying
from nodeside.scheduler.taking_turns import TakingTurns
from nodeside.scheduler.view import Kept

_EPS: Final = 1e-9
#: The request order of a holder competing as if it asked again: after every real request.
TAIL_ORDER: Final = 1 << 62


@final
class Turns:
    """The hold events, and the scheduling rules that follow every event."""

    def __init__(self, state: NodeState, room: Room, taking: TakingTurns,
                 residency: ResidencyRules) -> None:
        self.state = state
        self.room = room
        self.taking = taking
        self.residency = residency
        self._moves = Moves(state, room)

    # -- a client's requests --------------------------------------------------------------

    def acquire(self, client: ClientRecord, now: float) -> list[Action]:
        state = self.state
        if client.hold_state is not HoldState.IDLE:
            # Asking again while holding is answered with the grant; while waiting, nothing.
            return [Grant(client.id, client.gpu, state.quantum(client.gpu))] \
                if client.state == "holding" else []
        gpu = state.gpus[client.gpu]
        if not gpu.waiters:
            self._renew_lone_quanta(gpu, now)
        client.move(HoldState.WAITING)
        client.request_order = state.next_order()
        client.requested_at = now
        gpu.waiters.add(client)
        return self.schedule(gpu, now)

    def release(self, client: ClientRecord, now: float, evict_first: bool,
                evicting: bool = False) -> list[Action]:
        """Give the GPU back, or cancel a wait (``Scheduler.release`` says what
        ``evict_first`` and ``evicting`` do)."""
        gpu = self.state.gpus[client.gpu]
        if evicting and client.memory and client.state == "holding":
            # The hold ends now; the memory is still on its way out and counts until the
            # reports and ``evicted`` bring it down.
            self.residency.released_evicting(client, now)
            self._moves.end_hold(client, now)
            return [Released(client.id, evict=True), *self.schedule(gpu, now)]
        if client.hold_state is HoldState.WAITING:
            gpu.waiters.remove(client)
            client.move(HoldState.IDLE)
            client.requested_at = None
            if client.room_asked:  # others were asked to evict for this wait
                fair_eviction.wait_ended(client, now, self.state.config.evict_interval, True)
            return [Released(client.id, evict=False), *self.schedule(gpu, now)]
        if client.hold_state is HoldState.IDLE:
            return [Released(client.id, evict=False)]
        hold = client.hold
        assert hold is not None
        moves = self._moves
        if client.hold_state is HoldState.DROPPING:
            evict = hold.drop_evict
            if evict_first and evict:
                # Already asked to leave (the drop crossed this release on the wire): the drain
                # goes on under that drop, and its grace is not extended.
                left = max(0.0, (hold.drop_sent_at or now) + self.state.grace - now)
                assert hold.drop_reason is not None
                return [Drop(client.id, gpu.spec.index, hold.drop_reason, True, left)]
        else:
            incoming = self.state.choice.pick(gpu, now)
            evict = moves.evict_on_leave(gpu, client, now, incoming)
            if evict_first and evict:
                return [*moves.drop(gpu, client, p.REASON_RELEASE, now, incoming, evict=True),
                        *self.schedule(gpu, now)]
        moves.end_hold(client, now)
        return [Released(client.id, evict=evict), *self.schedule(gpu, now)]

    def report_working_set(self, client: ClientRecord, nbytes: int, evictable: int | None,
                           now: float, resident: int | None = None,
                           host: int | None = None, shadow: int | None = None
                           ) -> list[Action]:
        if nbytes < 0:
            raise SchedulerError(p.E_INVALID, "working set must not be negative")
        gpu = self.state.gpus[client.gpu]
        if client.memory:  # refused before anything changes
            check_claim(gpu, resident, "working_set.resident")
        client.working_set = nbytes
        client.evictable = evictable
        reported = self.residency.report(client, resident, host, shadow, now) \
            if client.memory else []
        return [*reported, *self._relieve_overcommit(gpu, client, now),
                *self.schedule(gpu, now)]

    def free(self, client: ClientRecord, now: float) -> None:
        """``client`` is leaving the node: whatever it held or waited for is free, at once
        (the caller schedules its GPU once the client is gone)."""
        if client.hold_state is HoldState.WAITING:
            self.state.gpus[client.gpu].waiters.remove(client)
            client.move(HoldState.IDLE)
        elif client.hold_state is not HoldState.IDLE:
            self._moves.end_hold(client, now)
        if client.memory:
            self.residency.forget(client)

    def drop(self, gpu: GpuState, holder: ClientRecord, reason: str, now: float,
             incoming: ClientRecord | None, evict: bool | None = None) -> list[Action]:
        """Ask ``holder`` to give ``gpu`` back now, for ``incoming``."""
        return self._moves.drop(gpu, holder, reason, now, incoming, evict)

    # -- the admin's mode -----------------------------------------------------------------

    def mode_changed(self, previous: str, now: float) -> list[Action]:
        """The mode is now ``state.mode``, and was ``previous``: what follows on every GPU."""
        state = self.state
        mode = state.mode
        actions: list[Action] = []
        if mode != "off" and previous == "off":
            # Running side by side ends now: every holder gets a fresh quantum measured from
            # the switch, so none is dropped the instant the scheduler comes on.
            for gpu in state.gpus.values():
                for holder in gpu.holders.values():
                    assert holder.hold is not None
                    holder.hold.quantum_start = now
        if mode == "on":
            for gpu in state.gpus.values():
                keeper, *others = gpu.holders.values() if gpu.holders else (None,)
                for holder in others:
                    if holder.hold_state is HoldState.HOLDING:
                        actions.extend(self._moves.drop(gpu, holder, p.REASON_MODE, now,
                                                        incoming=keeper))
        elif mode == "auto":
            for gpu in state.gpus.values():
                first = next(iter(gpu.holders.values()), None)
                actions.extend(self._relieve_overcommit(gpu, first, now, p.REASON_MODE))
        else:
            for gpu in state.gpus.values():
                self._moves.withdraw_drops(gpu)
        return actions + self.schedule_all(now)

    # -- what follows ---------------------------------------------------------------------

    def schedule_all(self, now: float) -> list[Action]:
        actions: list[Action] = []
        for gpu in self.state.gpus.values():
            actions.extend(self.schedule(gpu, now))
        return actions

    def schedule(self, gpu: GpuState, now: float) -> list[Action]:
        state = self.state
        state.events += 1  # every event schedules: what the next deadline depends on moved
        waiters, holders = gpu.waiters, gpu.holders
        mode = state.mode
        # No holder, none to revoke: a release's schedule (half of every handoff) skips the call.
        actions: list[Action] = self._revoke_overdue(gpu, now) if holders else []
        memory = gpu.memory_clients  # empty unless a client speaks the memory feature
        if memory:
            actions.extend(self.residency.due(gpu, now))
        if mode == "off":
            for waiter in list(gpu.waiters.values()):
                actions.append(self._moves.grant(gpu, waiter, now))
            actions.extend(self.taking.take_turns(gpu, now))  # nobody takes turns: all work
            return actions
        # Grant while the GPU is free (mode on) or the next one fits (mode auto). Head-of-line:
        # the first waiter that does not fit, or that the policy holds back, stops the others,
        # so a big request never starves behind a stream of small ones.
        while waiters and not (holders and mode == "on"):
            candidate = (gpu.promised is not None and self._keep_promise(gpu, now)) \
                or state.choice.pick(gpu, now)
            if candidate is None or (holders and (
                    not self.room.fits_beside(gpu, [candidate])
                    or self._held_back(gpu, candidate, now))):
                break
            if memory:
                short = gpu.ledger.shortfall(candidate)
                # A client whose restore waits for room chunk by chunk counts what is on its
                # way out as room: its way in overlaps the other's way out.
                if short > self.residency.coming(gpu, candidate):
                    asked, refused = self.residency.make_room(gpu, candidate, short, now)
                    actions.extend(asked)
                    if refused is None and short > self.residency.coming(gpu, candidate):
                        # Granted once the room is there; meanwhile, grants that need no
                        # room go on.
                        actions.extend(self._beside_room_wait(gpu, candidate, now))
                        break
                    if refused is not None and candidate.memory:
                        actions.append(self._refuse(gpu, candidate, refused))
                        continue
                    # A client without the feature cannot hear a refusal (the `error` event
                    # with code `room` is the feature's): it is granted into what room there
                    # is, as before the feature, rather than left waiting for good.
            actions.append(self._moves.grant(gpu, candidate, now))
        # Each extended only with what there is: on most events there is nothing.
        if waiters and state.preemption:  # nobody waiting, or preemption off: no call at all
            dropped = self._preempt(gpu, now)
            if dropped:
                actions.extend(dropped)
        if holders:
            ended = self._end_quanta(gpu, now)
            if ended:
                actions.extend(ended)
            turned = self.taking.take_turns(gpu, now)
            if turned:
                actions.extend(turned)
        return actions

    def _beside_room_wait(self, gpu: GpuState, parked: ClientRecord, now: float) -> list[Action]:
        """``parked`` waits for idle clients to make room: a waiter for room never blocks the
        queue. Those behind it whose grant needs no room go on meanwhile, in the order they
        would be served: in mode on while nobody holds; in mode auto each whose working set
        is known and fits beside the holders. Each must fit beside what is resident now, and
        beside ``parked`` once the evictions under way are done: the room being made is not
        taken from it."""
        state = self.state
        actions: list[Action] = []
        # What it needs beyond the room already on its way out: what the others may not take.
        coming = gpu.ledger.outgoing_total
        wanted = need(parked) - counted(parked) if parked.memory else (parked.working_set or 0)
        reserved = max(0, wanted - coming)
        mode = state.mode
        choice = state.choice
        for waiter in choice.order(gpu, now):
            if gpu.holders and mode == "on":
                break
            if waiter is parked or choice.over_maximum(gpu, waiter.pool, now):
                continue
            if outgoing_bytes(waiter):
                # Its memory is the room on its way out: its grant would take it back, and
                # the parked waiter would starve while its cells come and go.
                continue
            if gpu.holders and (waiter.working_set is None
                                or not self.room.fits_beside(gpu, [waiter])
                                or self._held_back(gpu, waiter, now)):
                continue
            if mode == "auto" and waiter.working_set is None:
                continue  # it needs the whole GPU: it would take the room being made
            # What its grant would bring onto the GPU: none, and it goes on whatever the GPU
            # holds now (the room being made is for what others hold too much of).
            adds = max(0, need(waiter) - counted(waiter)) if waiter.memory \
                else (waiter.working_set or 0)
            if adds and gpu.ledger.shortfall(waiter, reserved):
                continue
            actions.append(self._moves.grant(gpu, waiter, now))
        return actions

    def _refuse(self, gpu: GpuState, client: ClientRecord, why: str) -> Refuse:
        """The room ``client`` waits for cannot be made: it is idle again, and told why."""
        gpu.waiters.remove(client)
        client.move(HoldState.IDLE)
        client.requested_at = None
        client.waiting_for = None
        fair_eviction.wait_ended(client, 0.0, 0.0, False)
        self.state.counts["refusals"] += 1
        return Refuse(client.id, gpu.spec.index, why)

    def _held_back(self, gpu: GpuState, client: ClientRecord, now: float) -> bool:
        light_first = self.state.choice.light_first
        return light_first is not None and light_first.holds_back(gpu, client, now)

    def _keep_promise(self, gpu: GpuState, now: float) -> ClientRecord | None:
        promised, gpu.promised = gpu.promised, None
        client = gpu.waiters.get(promised) if promised is not None else None
        choice = self.state.choice
        if client is None or choice.over_maximum(gpu, client.pool, now):
            return None
        # A request owed its guarantee that arrived during the handoff still goes first.
        if not choice.below_guarantee(gpu, client, now) and any(
                choice.below_guarantee(gpu, head, now)
                for head in gpu.waiters.heads().values()):
            return None
        return client

    def _preempt(self, gpu: GpuState, now: float) -> list[Action]:
        """Drops that make room for waiters owed their guarantee. ``schedule`` calls it only
        with waiters, preemption on and mode not off: no shares to measure otherwise."""
        # Asked on every event while anyone waits: no list at all while nobody preemptible
        # holds (the usual case), then one pass.
        for holder in gpu.holders.values():
            if holder.hold_state is HoldState.HOLDING and holder.preemptible:
                break
        else:
            return []
        victims = [h for h in gpu.holders.values()
                   if h.hold_state is HoldState.HOLDING and h.preemptible]
        choice = self.state.choice
        shares = gpu.meter.shares(now, [w.pool for w in gpu.waiters.values()])
        claimants = sorted((w for w in gpu.waiters.values()
                            if choice.below_guarantee(gpu, w, now)
                            and not choice.over_maximum(gpu, w.pool, now, shares)),
                           key=within_pool)
        room = self.room
        actions: list[Action] = []
        for claimant in claimants:
            # Holders already leaving count as gone: a claimant whose room is already being
            # made must not cost a second preemptible holder its quantum.
            gone = leaving(gpu)
            if room.room_after(gpu, claimant, gone):
                continue
            chosen: list[ClientRecord] = []
            while victims and not room.room_after(gpu, claimant, [*gone, *chosen]):
                chosen.append(victims.pop())  # the newest grant first: it has run the least
            if not room.room_after(gpu, claimant, [*gone, *chosen]):
                break  # not even every preemptible holder together would make room
            for victim in chosen:
                self.state.counts["preemptions"] += 1
                actions.extend(self._moves.drop(gpu, victim, p.REASON_PREEMPT, now,
                                                incoming=claimant))
        return actions

    def quantum_length(self, gpu: GpuState, holder: ClientRecord, now: float) -> float:
        """The TQ, or less where the policy cuts the quantum short for the next holder."""
        state = self.state
        tq = state.tq_of(gpu)
        light_first = state.choice.light_first
        if light_first is None or state.mode != "on" or not gpu.waiters:
            return tq
        winner = state.choice.pick(gpu, now, as_tail(holder))
        if winner is None or winner.id == holder.id:
            return tq
        return light_first.quantum(gpu, holder, winner, tq, now)

    def _end_quanta(self, gpu: GpuState, now: float) -> list[Action]:
        state = self.state
        choice = state.choice
        tq = state.tq_of(gpu)
        light_first = choice.light_first  # without one, every quantum is the TQ
        if light_first is None:
            # Asked on every event: with every quantum the TQ, nothing to do (and no list to
            # make) until one of them has run out, which a handoff's fresh grant has not.
            for holder in gpu.holders.values():
                hold = holder.hold
                assert hold is not None
                if holder.hold_state is HoldState.HOLDING and \
                        not now < hold.quantum_start + tq - _EPS:
                    break
            else:
                return []
        actions: list[Action] = []
        aside = light_first if light_first is not None and state.mode == "auto" else None
        # Asked once for every holder: a drop below changes no waiter's place.
        waiter = choice.pick(gpu, now) if aside is not None and gpu.waiters else None
        for holder in staying(gpu):
            hold = holder.hold
            assert hold is not None
            if aside is not None:
                light = aside.steps_aside_for(gpu, holder, waiter, tq, now)
                if light is not None:
                    actions.extend(self._step_aside(gpu, holder, light, now))
                    continue
            length = self.quantum_length(gpu, holder, now) if light_first is not None else tq
            if now < hold.quantum_start + length - _EPS:
                continue
            # The holder competes as if it asked again now, at the tail; if it would win
            # anyway it keeps the GPU and hears nothing.
            if state.mode == "auto":
                blocked = choice.pick(gpu, now)
                if blocked is None or self.room.room_after(gpu, blocked, leaving(gpu)):
                    # Nobody is blocked, or those already leaving make the room: no need to
                    # end this holder's turn as well.
                    hold.quantum_start = self._renewed(gpu, hold, tq, now)
                    continue
                actions.extend(self._moves.drop(gpu, holder, p.REASON_ROOM, now,
                                                incoming=blocked))
                continue
            tail = as_tail(holder, state.next_order())
            winner = choice.pick(gpu, now, tail)
            if winner is None and choice.over_maximum(gpu, holder.pool, now):
                actions.extend(self._moves.drop(gpu, holder, p.REASON_MAXIMUM, now,
                                                incoming=None))
                continue
            if winner is None or winner is tail:
                if winner is tail and choice.observes:
                    choice.observe(Kept(gpu, holder, now))
                hold.quantum_start = self._renewed(gpu, hold, tq, now)
                continue
            actions.extend(self._moves.drop(gpu, holder, p.REASON_QUANTUM, now, incoming=winner))
        return actions

    def _step_aside(self, gpu: GpuState, holder: ClientRecord, light: ClientRecord,
                    now: float) -> list[Action]:
        """Mode auto, ``policy: interactive``: ``holder`` leaves the GPU's time to ``light``
        (light_first.py). Beside a light holder its memory stays: they fit, nothing needs the
        room. For a light waiter, the drop is for it and moves memory only if it needs the
        room."""
        self.state.counts["steps_aside"] += 1
        if light.hold_state is HoldState.WAITING:
            return self._moves.drop(gpu, holder, p.REASON_QUANTUM, now, incoming=light)
        return self._moves.drop(gpu, holder, p.REASON_QUANTUM, now, incoming=None, evict=False)

    def _relieve_overcommit(self, gpu: GpuState, keep: ClientRecord | None, now: float,
                            reason: str = p.REASON_ROOM) -> list[Action]:
        """Mode auto: the holders no longer fit together; ask some to leave until they do.

        Running on past the GPU's memory is the thrashing Kiwi exists to prevent. ``keep``
        stays (the one in the middle of allocating, or the first holder); the others leave and
        must move their memory out, since the room is what is missing.
        """
        if self.state.mode != "auto" or keep is None or keep.state != "holding":
            return []
        actions: list[Action] = []
        for holder in self.room.overcommitted(gpu, keep):
            actions.extend(self._moves.drop(gpu, holder, reason, now, incoming=None, evict=True))
        return actions

    def _revoke_overdue(self, gpu: GpuState, now: float) -> list[Action]:
        for holder in gpu.holders.values():
            if holder.hold_state is HoldState.DROPPING:
                break
        else:
            return []  # nobody asked to drop (every handoff): no list of them to make
        actions: list[Action] = []
        for holder in leaving(gpu):
            hold = holder.hold
            assert hold is not None and hold.drop_sent_at is not None
            if now < hold.drop_sent_at + self.state.grace - _EPS:
                continue
            self.state.counts["revocations"] += 1
            self._moves.end_hold(holder, now)
            actions.append(Revoke(holder.id, gpu.spec.index, p.REASON_GRACE,
                                  ignored_for=now - hold.drop_sent_at))
        return actions

    def _renew_lone_quanta(self, gpu: GpuState, now: float) -> None:
        """Someone starts waiting: bring each holder's quantum up to date first.

        A holder nobody waited for had its quantum renewed at each end, silently and with no
        timer (the shell ticks only at ``next_deadline``, and none is due then). Counting the
        renewals now puts the newcomer behind the end of the *current* quantum, as in the
        seed's timeline, instead of dropping a holder whose first quantum ran out long ago.
        """
        tq = self.state.tq_of(gpu)
        for holder in staying(gpu):
            assert holder.hold is not None
            holder.hold.quantum_start = current_quantum_start(holder.hold, tq, now)

    @staticmethod
    def _renewed(gpu: GpuState, hold: Hold, tq: float, now: float) -> float:
        """The start of a holder's next quantum when it keeps the GPU at the end of one.

        Alone, its quanta follow each other on the grid set by its grant, wherever a tick
        happens to land (another GPU's deadline ticks this one too). Behind waiters it won
        against, the next quantum starts now.
        """
        return current_quantum_start(hold, tq, now) if not gpu.waiters else now


def current_quantum_start(hold: Hold, tq: float, now: float) -> float:
    """When the quantum running at ``now`` began, counting the silent renewals of a holder
    that nobody waited for: one every ``tq`` since its quantum started."""
    elapsed = now - hold.quantum_start
    if elapsed < tq - _EPS:
        return hold.quantum_start
    return hold.quantum_start + math.floor((elapsed + _EPS) / tq) * tq


def as_tail(holder: ClientRecord, order: int = TAIL_ORDER) -> ClientRecord:
    """A stand-in for ``holder`` asking again now: same pool and priority, at the tail (the
    core's contest at a quantum's end; benchmarks ask the policy the same question)."""
    return ClientRecord(id=holder.id, name=holder.name, gpu=holder.gpu, pool=holder.pool,
                  priority=holder.priority, working_set=holder.working_set,
                  request_order=order)
