"""Mode auto under ``interactive.turns``: holders side by side take turns at the GPU's time.

In mode auto the holders whose working sets fit run side by side, and the GPU time-slices
between their processes every few milliseconds. That costs work (two processes of large matrix
products on an H100 got 0.901 of one's work done together, ``benchmarks/gpu_corun.py``) and
knows nobody: a person's half-second cell beside two training runs gets a third of the GPU.
With ``turns`` set, Kiwi divides that time itself, in turns of ``turns`` seconds, while every
holder's memory stays where it is. A turn ends with a ``Pause`` to the holder leaving and a
``Resume`` to the one coming, one line each; the shim stops its process's launches on the
first and lets them go on at the second (about 0.1 ms on the CPU's side, ``shim_turns``).

The rules, per GPU, among its holders that can pause (``ClientRecord.pausable``: the shim can, a
plain Python client cannot) and are not leaving:

- **One works at a time**; the others are paused, and hold on to the GPU and its memory.
- **Least attained first.** The turn goes to the holder whose request in progress has worked
  least on the GPU (``request_work``: its own cell, not its notebook's past; the time it was
  paused does not count). A holder just granted has done nothing yet and takes the GPU at once,
  so a short cell runs alone beside a training run instead of at a fraction of its speed. When
  a turn ends, the one that has done least goes next, the holder whose turn ended included;
  equals alternate, longest paused first.
- **Never starving.** A holder paused for a whole TQ is owed the next turn (the longest paused
  first), and nobody cuts an owed turn short. However many fresh requests come, a holder
  waits at most a TQ and the turns owed before its own.
- **Everything else stays as in mode auto**: who is granted (memory, pools, priorities,
  stepping aside), quanta and drops. A lone holder always works, and holders that cannot pause
  work beside whoever's turn it is, time-sliced by the driver as before.

The share meter charges only the holders working, so a pool's share is the GPU time its turns
took. The fleet benchmark (``python -m benchmarks.fleet --turns``) measures what this buys.
"""

from __future__ import annotations

from typing import Final, final

from nodeside.scheduler.actions import Action, Pause, Resume
from nodeside.scheduler.gpu_state import ClientRecord, GpuState, Hold, HoldState
from nodeside.scheduler.light_first import LightFirst
from nodeside.scheduler.node import NodeState
from nodeside.scheduler.view import Paused, Resumed

_EPS: Final = 1e-9


@final
class TakingTurns:
    """Who works among the holders side by side, and the pauses and resumes that say so.
    ``Turns`` (turns.py) asks after every event on a GPU; queries.py asks when a turn ends."""

    def __init__(self, state: NodeState) -> None:
        self.state = state

    def turn_length(self) -> float:
        """Seconds of a turn where holders take turns now; 0 where they do not."""
        if self.state.mode != "auto":
            return 0.0
        light_first = self.state.choice.light_first
        return light_first.turn_length() if light_first is not None else 0.0

    def take_turns(self, gpu: GpuState, now: float) -> list[Action]:
        """Pause and resume ``gpu``'s holders so that the right one works (see above)."""
        turn = self.turn_length()
        if turn <= 0.0 and not gpu.paused:
            return []  # every handoff without turns: nothing to look at
        takers = _takers(gpu)
        if turn <= 0.0 or len(takers) <= 1:
            # Nobody to take turns with (or turns are off now): every holder works.
            return [self._resume(gpu, h, now, owed=False) for h in takers if h.paused]
        light_first = self.state.choice.light_first
        assert light_first is not None  # turns are taken only where the policy has them
        runner, owed = self._next_turn(gpu, takers, turn, light_first, now)
        actions: list[Action] = [self._pause(gpu, h, now) for h in takers
                                 if h is not runner and not h.paused]
        hold = runner.hold
        assert hold is not None
        if runner.paused:
            actions.append(self._resume(gpu, runner, now, owed))
        elif hold.turn_start is not None and now >= hold.turn_start + turn - _EPS:
            hold.turn_start = now  # it goes on: a new turn, heard of by nobody
            hold.owed_turn = owed
        return actions

    def _next_turn(self, gpu: GpuState, takers: list[ClientRecord], turn: float,
                   light_first: LightFirst, now: float) -> tuple[ClientRecord, bool]:
        """Who works from now, and whether that turn is an owed one."""
        tq = self.state.tq_for(gpu.spec.index)
        working = [h for h in takers if not h.paused]
        # The holder in its turn: the one that started working first (others working are
        # fresh grants, or were all working when turns came on).
        incumbent = min(working, key=_turn_started) if working else None
        over = incumbent is None or now >= _turn_started(incumbent) + turn - _EPS
        if incumbent is not None and not over and _hold(incumbent).owed_turn:
            return incumbent, True
        owed = [h for h in takers if h.paused and now - _paused_since(h) >= tq - _EPS]
        if owed and over:
            return min(owed, key=_paused_since), True
        work = {h.id: light_first.request_work(h.id, now) for h in takers}
        if incumbent is not None and not over:
            # Mid-turn, only a fresh grant that has done less takes over. A paused holder waits
            # for the turn's end, however close the race: equals alternate by turns, not at
            # every event, and an owed turn is never put off by a mid-turn switch.
            rivals = [h for h in working if h is not incumbent
                      and work[h.id] < work[incumbent.id] - _EPS]
            if not rivals:
                return incumbent, False
            return min(rivals, key=lambda h: (work[h.id], _waiting_since(h, now))), False
        least = min(work.values())
        equals = [h for h in takers if work[h.id] <= least + _EPS]
        # Among equals the longest paused goes first, so equals alternate turn by turn.
        return min(equals, key=lambda h: _waiting_since(h, now)), False

    def _pause(self, gpu: GpuState, holder: ClientRecord, now: float) -> Pause:
        hold = _hold(holder)
        hold.turn_start = None
        hold.paused_since = now
        hold.owed_turn = False
        gpu.paused += 1
        gpu.meter.close(holder.id, now)  # a paused holder uses none of the GPU's time
        choice = self.state.choice
        if choice.observes:
            choice.observe(Paused(gpu, holder, now))
        return Pause(holder.id, gpu.spec.index)

    def _resume(self, gpu: GpuState, holder: ClientRecord, now: float, owed: bool) -> Resume:
        hold = _hold(holder)
        hold.turn_start = now
        hold.paused_since = None
        hold.owed_turn = owed
        gpu.paused -= 1
        gpu.meter.open(holder.id, holder.pool, now, holder.preemptible)
        choice = self.state.choice
        if choice.observes:
            choice.observe(Resumed(gpu, holder, now))
        self.state.counts["turns"] += 1
        return Resume(holder.id, gpu.spec.index)

    def turn_deadline(self, gpu: GpuState) -> float | None:
        """When the turn on ``gpu`` ends, if anyone is paused waiting for it."""
        turn = self.turn_length()
        if turn <= 0.0 or not gpu.paused:
            return None
        takers = _takers(gpu)
        if not any(h.paused for h in takers):
            return None  # only holders leaving are paused: no turn to end
        starts = [_turn_started(h) for h in takers if not h.paused]
        return min(starts) + turn if starts else None


def _takers(gpu: GpuState) -> list[ClientRecord]:
    """The holders that take turns: those that can pause, and are not leaving."""
    return [h for h in gpu.holders.values() if h.pausable and h.hold_state is HoldState.HOLDING]


def _hold(client: ClientRecord) -> Hold:
    hold = client.hold
    assert hold is not None
    return hold


def _turn_started(client: ClientRecord) -> float:
    start = _hold(client).turn_start
    assert start is not None
    return start


def _paused_since(client: ClientRecord) -> float:
    since = _hold(client).paused_since
    assert since is not None
    return since


def _waiting_since(client: ClientRecord, now: float) -> tuple[float, int]:
    """For equals: the longest paused first, then a working one, then the earlier request."""
    since = _hold(client).paused_since
    return (since if since is not None else now), client.request_order
