"""Turns: what follows each event on a GPU. Grants, quanta ending, preemption, revocation.

``Scheduler`` (core.py) takes the events; after each one it calls ``_schedule`` for the GPU it
touched, and that is this file: grant while the GPU is free (or the next one fits, in mode auto),
drop a LOW holder for a request owed its guarantee, end quanta that ran out while someone
eligible waits, revoke a holder past its grace, and (mode auto, ``interactive.turns``) say which
holder side by side has its turn (taking_turns.py). The moves these rules make (grant, drop, end
a hold) and the state they read are ``Moves`` (moves.py).
"""

from __future__ import annotations

import math

from nodeside import protocol as p
from nodeside.scheduler import room
from nodeside.scheduler.actions import Action, Revoke
from nodeside.scheduler.choosing import within_pool
from nodeside.scheduler.state import Client, GpuState, Hold, HoldState
from nodeside.scheduler.taking_turns import TakingTurns

_EPS = 1e-9
#: The request order of a holder competing as if it asked again: after every real request.
TAIL_ORDER = 1 << 62


class Turns(TakingTurns):
    """The scheduling rules shared by every event; ``Scheduler`` holds the state they use."""

    def _schedule_all(self, now: float) -> list[Action]:
        actions: list[Action] = []
        for gpu in self.gpus.values():
            actions.extend(self._schedule(gpu, now))
        return actions

    def _schedule(self, gpu: GpuState, now: float) -> list[Action]:
        self._events += 1  # every event schedules: what the next deadline depends on moved
        waiters, holders = gpu.waiters, gpu.holders
        # No holder, none to revoke: a release's schedule (half of every handoff) skips the call.
        actions: list[Action] = self._revoke_overdue(gpu, now) if holders else []
        if self.mode == "off":
            for waiter in list(gpu.waiters.values()):
                actions.append(self._grant(gpu, waiter, now))
            actions.extend(self._take_turns(gpu, now))  # nobody takes turns: all work
            return actions
        # Grant while the GPU is free (mode on) or the next one fits (mode auto). Head-of-line:
        # the first waiter that does not fit, or that the policy holds back, stops the others,
        # so a big request never starves behind a stream of small ones.
        while waiters and not (holders and self.mode == "on"):
            candidate = (gpu.promised is not None and self._keep_promise(gpu, now)) \
                or self.choice.pick(gpu, now)
            if candidate is None or (holders and (
                    not room.fits_beside(gpu, [candidate], self._reserve)
                    or self.choice.holds_back(gpu, candidate, now))):
                break
            actions.append(self._grant(gpu, candidate, now))
        if waiters and self.preemption:  # nobody waiting, or preemption off: no call at all
            actions.extend(self._preempt(gpu, now))
        if holders:
            actions.extend(self._end_quanta(gpu, now))
            actions.extend(self._take_turns(gpu, now))
        return actions

    def _keep_promise(self, gpu: GpuState, now: float) -> Client | None:
        promised, gpu.promised = gpu.promised, None
        client = gpu.waiters.get(promised) if promised is not None else None
        if client is None or self.choice.over_maximum(gpu, client.pool, now):
            return None
        # A request owed its guarantee that arrived during the handoff still goes first.
        if not self.choice.below_guarantee(gpu, client, now) and any(
                self.choice.below_guarantee(gpu, head, now)
                for head in gpu.waiters.heads().values()):
            return None
        return client

    def _room_after(self, gpu: GpuState, claimant: Client, gone: list[Client]) -> bool:
        return room.room_after(gpu, claimant, gone, serial=self.mode == "on",
                               reserve=self._reserve)

    def _preempt(self, gpu: GpuState, now: float) -> list[Action]:
        """Drops that make room for waiters owed their guarantee. ``_schedule`` calls it only
        with waiters, preemption on and mode not off: no shares to measure otherwise."""
        victims = [h for h in room.staying(gpu) if h.preemptible]
        if not victims:
            return []
        shares = gpu.meter.shares(now, [w.pool for w in gpu.waiters.values()])
        claimants = sorted((w for w in gpu.waiters.values()
                            if self.choice.below_guarantee(gpu, w, now)
                            and not self.choice.over_maximum(gpu, w.pool, now, shares)),
                           key=within_pool)
        actions: list[Action] = []
        for claimant in claimants:
            # Holders already leaving count as gone: a claimant whose room is already being
            # made must not cost a second preemptible holder its quantum.
            leaving = room.leaving(gpu)
            if self._room_after(gpu, claimant, leaving):
                continue
            chosen: list[Client] = []
            while victims and not self._room_after(gpu, claimant, [*leaving, *chosen]):
                chosen.append(victims.pop())  # the newest grant first: it has run the least
            if not self._room_after(gpu, claimant, [*leaving, *chosen]):
                break  # not even every preemptible holder together would make room
            for victim in chosen:
                self.counts["preemptions"] += 1
                actions.extend(self._drop(gpu, victim, p.REASON_PREEMPT, now, incoming=claimant))
        return actions

    def _quantum_length(self, gpu: GpuState, holder: Client, now: float) -> float:
        """The TQ, or less where the policy cuts the quantum short for the next holder."""
        tq = self.tq_for(gpu.spec.index)
        if not self.choice.cuts_quanta or self.mode != "on" or not gpu.waiters:
            return tq
        winner = self.choice.pick(gpu, now, as_tail(holder))
        if winner is None or winner.id == holder.id:
            return tq
        return self.choice.quantum(gpu, holder, winner, tq, now)

    def _end_quanta(self, gpu: GpuState, now: float) -> list[Action]:
        actions: list[Action] = []
        tq = self.tq_for(gpu.spec.index)
        cuts = self.choice.cuts_quanta  # if not, every quantum is the TQ
        aside = cuts and self.mode == "auto"
        # Asked once for every holder: a drop below changes no waiter's place.
        waiter = self.choice.pick(gpu, now) if aside and gpu.waiters else None
        for holder in room.staying(gpu):
            hold = holder.hold
            assert hold is not None
            if aside:
                light = self.choice.steps_aside_for(gpu, holder, waiter, tq, now)
                if light is not None:
                    actions.extend(self._step_aside(gpu, holder, light, now))
                    continue
            length = self._quantum_length(gpu, holder, now) if cuts else tq
            if now < hold.quantum_start + length - _EPS:
                continue
            # The holder competes as if it asked again now, at the tail; if it would win
            # anyway it keeps the GPU and hears nothing.
            if self.mode == "auto":
                blocked = self.choice.pick(gpu, now)
                if blocked is None or self._room_after(gpu, blocked, room.leaving(gpu)):
                    # Nobody is blocked, or those already leaving make the room: no need to
                    # end this holder's turn as well.
                    hold.quantum_start = self._renewed(gpu, hold, tq, now)
                    continue
                actions.extend(self._drop(gpu, holder, p.REASON_ROOM, now, incoming=blocked))
                continue
            tail = as_tail(holder, next(self._order))
            winner = self.choice.pick(gpu, now, tail)
            if winner is None and self.choice.over_maximum(gpu, holder.pool, now):
                actions.extend(self._drop(gpu, holder, p.REASON_MAXIMUM, now, incoming=None))
                continue
            if winner is None or winner is tail:
                if winner is tail:
                    self.choice.on_keep(gpu, holder, now)
                hold.quantum_start = self._renewed(gpu, hold, tq, now)
                continue
            actions.extend(self._drop(gpu, holder, p.REASON_QUANTUM, now, incoming=winner))
        return actions

    def _step_aside(self, gpu: GpuState, holder: Client, light: Client,
                    now: float) -> list[Action]:
        """Mode auto, ``policy: interactive``: ``holder`` leaves the GPU's time to ``light``
        (aside.py). Beside a light holder its memory stays: they fit, nothing needs the room.
        For a light waiter, the drop is for it and moves memory only if it needs the room."""
        self.counts["steps_aside"] += 1
        if light.hold_state is HoldState.WAITING:
            return self._drop(gpu, holder, p.REASON_QUANTUM, now, incoming=light)
        return self._drop(gpu, holder, p.REASON_QUANTUM, now, incoming=None, evict=False)

    def _relieve_overcommit(self, gpu: GpuState, keep: Client | None, now: float,
                            reason: str = p.REASON_ROOM) -> list[Action]:
        """Mode auto: the holders no longer fit together; ask some to leave until they do.

        Running on past the GPU's memory is the thrashing Kiwi exists to prevent. ``keep``
        stays (the one in the middle of allocating, or the first holder); the others leave and
        must move their memory out, since the room is what is missing.
        """
        if self.mode != "auto" or keep is None or keep.state != "holding":
            return []
        actions: list[Action] = []
        for holder in room.overcommitted(gpu, keep, self._reserve):
            actions.extend(self._drop(gpu, holder, reason, now, incoming=None, evict=True))
        return actions

    def _revoke_overdue(self, gpu: GpuState, now: float) -> list[Action]:
        actions: list[Action] = []
        for holder in room.leaving(gpu):
            hold = holder.hold
            assert hold is not None and hold.drop_sent_at is not None
            if now < hold.drop_sent_at + self.config.grace - _EPS:
                continue
            self.counts["revocations"] += 1
            self._end_hold(holder, now)
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
        tq = self.tq_for(gpu.spec.index)
        for holder in room.staying(gpu):
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


def as_tail(holder: Client, order: int = TAIL_ORDER) -> Client:
    """A stand-in for ``holder`` asking again now: same pool and priority, at the tail (the
    core's contest at a quantum's end; benchmarks ask the policy the same question)."""
    return Client(id=holder.id, name=holder.name, gpu=holder.gpu, pool=holder.pool,
                  priority=holder.priority, working_set=holder.working_set,
                  request_order=order)
