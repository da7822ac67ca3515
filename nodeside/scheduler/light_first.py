"""The GPU's time to the light first: what the core asks of ``policy: interactive``'s rules.

``InteractivePolicy`` (interactive.py) composes this; the core (turns.py, taking_turns.py,
queries.py) consults a policy's ``light_first`` where it has one, and round robin has none. Three
ways a light client gets the GPU's time sooner than its turn by request order would give it:

- **a quantum cut short** (mode on): a holder's quantum ends early for a waiter that used far
  less GPU time, priced by the memory the switch moves (``pricing.quantum``);
- **stepping aside** (mode auto): below;
- **taking turns** (mode auto, ``interactive.turns``): holders side by side take turns at the
  GPU's time, the one whose request has worked least first (``request_work``; the rules are
  taking_turns.py's).

The light request that goes once ahead of a pool's rule (light.py) is part of the policy's own
order (``pick``); this component holds it too, as the quantum of a holder that went ahead is
priced apart.

Stepping aside. In mode auto, holders whose working sets fit share the GPU, each at its share
of the GPU's time. That is fair to two training runs and hard on a person's short cell: beside
two of them it goes at a third of its speed (the fleet benchmark's "side by side: sharing the
GPU"). So under ``policy: interactive`` the GPU's time goes to the light, as in mode on, while
the memory stays side by side, as in mode auto:

- light beside heavy: a client of no lower priority than another (a LOW request never cuts a
  quantum short) that used at most CUT_RATIO of its GPU time (``attained``);
- a light holder's turn: the first TQ of its hold;
- a holder steps aside (a drop, reason ``quantum``) for a light holder in its turn, or for the
  light waiter the policy would grant next, once its quantum priced as in mode on
  (``pricing.quantum``: ``first_quantum`` at least, longer where memory must move) is over. Its
  memory stays where it is unless that waiter needs the room;
- a request heavy beside a light holder in its turn is held back (not granted beside it), for
  at most one TQ of its wait. One granted because it waited that long is not asked to step aside
  again for a TQ: however many light requests come, a heavy client waits at most one TQ for
  them and then holds for one. Like a request that does not fit, a held-back one stops the
  waiters behind it; they are no worse off than in mode on, where a request that used less goes
  first, and the policy's bound on being passed over (``pass_bound``) holds for them too.

A holder that steps aside asks again at once, as after any drop, and its request goes on
(``attained``): it keeps what it used, and comes back beside the others when the light turns
are over.
"""

from __future__ import annotations

from typing import Final

from nodeside.scheduler import pricing
from nodeside.scheduler.attained import CUT_RATIO, AttainedService
from nodeside.scheduler.gpu_state import PRIORITY_RANK, ClientRecord, GpuState, HoldState
from nodeside.scheduler.light import LightRequests
from nodeside.scheduler.view import PolicyView

_EPS: Final = 1e-9


class LightFirst:
    """A quantum cut short for the light, holders stepping aside for them, and turns by the work
    done; ``service`` says what each client used."""

    def __init__(self, view: PolicyView, service: AttainedService, light: LightRequests) -> None:
        self.view = view
        self.service = service
        self.light = light
        #: Client id -> when it was granted for having been held back a whole TQ: it is not
        #: asked to step aside again until a TQ later.
        self._let_through: dict[str, float] = {}

    # -- mode on: a quantum cut short ------------------------------------------------------

    def quantum(self, gpu: GpuState, holder: ClientRecord, winner: ClientRecord, tq: float,
                now: float) -> float:
        """How long ``holder``'s quantum is, ``winner`` being who would go next."""
        return pricing.quantum(self.view, self.service, self.light, gpu, holder, winner, tq, now)

    # -- mode auto: taking turns -----------------------------------------------------------

    def turn_length(self) -> float:
        """Seconds of a turn when pausable holders side by side take turns; 0: they do not."""
        return self.view.settings.interactive.turns

    def request_work(self, client_id: str, now: float) -> float:
        """GPU seconds the client's request in progress has worked: who has the next turn."""
        return self.service.request_work(client_id, now)

    # -- mode auto: stepping aside ---------------------------------------------------------

    def light_beside(self, light: ClientRecord, heavy: ClientRecord, now: float) -> bool:
        if PRIORITY_RANK[light.priority] > PRIORITY_RANK[heavy.priority]:
            return False
        service = self.service
        used = service.attained(heavy.id, now)
        # Two that used nothing yet are equals, not light and heavy.
        return used > 0.0 and service.attained(light.id, now) <= CUT_RATIO * used

    def in_turn(self, gpu: GpuState, tq: float, now: float) -> list[ClientRecord]:
        """Holders in their turn: in the first TQ of their hold, and not asked to leave."""
        return [h for h in gpu.holders.values() if h.hold_state is HoldState.HOLDING
                and h.hold is not None and now - h.hold.granted_at < tq - _EPS]

    def aside_may_come(self, gpu: GpuState, now: float) -> bool:
        """May a holder yet step aside, or a held-back request be granted, as GPU time is used
        with no event to say so? (The core then looks again after a first quantum.) Only while
        someone waits, or while holders share the GPU and one of them is in its turn."""
        if gpu.waiters:
            return True
        tq = self.view.tq_for(gpu.spec.index)
        return len(gpu.holders) > 1 and bool(self.in_turn(gpu, tq, now))

    def holds_back(self, gpu: GpuState, client: ClientRecord, now: float) -> bool:
        """Mode auto: is ``client``'s request, which fits, held back from being granted beside
        the holders: heavy beside a light holder in its turn, and waiting for less than a TQ?"""
        if self.view.mode != "auto":
            return False
        tq = self.view.tq_for(gpu.spec.index)
        return not self._waited_a_turn(client, tq, now) and self._heavy(gpu, client, tq, now)

    def granted(self, gpu: GpuState, client: ClientRecord, now: float) -> None:
        """``client`` was granted. In mode auto, if it is heavy beside a holder in its turn, it
        was let through for having waited a TQ: it is not asked to step aside for a TQ."""
        if self.view.mode != "auto":
            return
        tq = self.view.tq_for(gpu.spec.index)
        if self._heavy(gpu, client, tq, now):
            self._let_through[client.id] = now

    def steps_aside_for(self, gpu: GpuState, holder: ClientRecord, waiter: ClientRecord | None,
                        tq: float, now: float) -> ClientRecord | None:
        """The light client ``holder`` steps aside for now, if any: a light holder in its turn
        or ``waiter`` (the policy's next), once ``holder``'s quantum for it is over."""
        hold = holder.hold
        assert hold is not None
        let = self._let_through.get(holder.id)
        if let is not None and now - let < tq - _EPS:
            return None
        lights = [h for h in self.in_turn(gpu, tq, now) if h is not holder]
        if waiter is not None:
            lights.append(waiter)
        for light in lights:
            if self.light_beside(light, holder, now) and \
                    now >= hold.quantum_start + self.quantum(gpu, holder, light, tq, now) - _EPS:
                return light
        return None

    def forget(self, client_id: str) -> None:
        self._let_through.pop(client_id, None)

    def _heavy(self, gpu: GpuState, client: ClientRecord, tq: float, now: float) -> bool:
        return any(self.light_beside(h, client, now) for h in self.in_turn(gpu, tq, now)
                   if h is not client)

    @staticmethod
    def _waited_a_turn(client: ClientRecord, tq: float, now: float) -> bool:
        asked = client.requested_at
        return asked is not None and now - asked >= tq - _EPS
