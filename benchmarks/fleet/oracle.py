"""A clairvoyant reference for the fleet benchmark: the interactive policy told each cell's
length, to measure how far any real policy could get under the product's rules (issue 16).

``policy: interactive`` ranks waiters by the GPU time they used, because a scheduler cannot
know how long a cell will run. This benchmark can: the replay knows every burst. The oracle is
``InteractivePolicy`` with that one thing changed, so every rule around the order stays as the
product keeps it: maximums are hard, a guarantee owed goes first (with the light request that
may go once ahead of it, for at most ``JUMP_QUANTUM``), HIGH before NORMAL before LOW within a
pool, LOW holders are preempted as today, and the starvation bound (``pass_bound``) stays: a
waiter passed over that often is served in request order. What changes:

* the order is shortest remaining work first: wherever the interactive policy reads a client's
  attained service (its pools' lanes, between pools within ``SHARE_TOLERANCE``, which request is
  light), the oracle reads the GPU seconds left of the client's cell (``RemainingWork``);
* a holder's quantum is cut short exactly when the next holder's remaining work plus the memory
  moves of the cut (the handoff there and back, priced as the product prices them: the real
  working sets and link, ``pricing.switch_cost``) is less than the holder's remaining work,
  SRPT with switching costs; otherwise it runs to the TQ, where the holder competes again at the
  tail, by remaining work. A LOW request still never cuts a quantum short, unless ``low_cuts``
  (the variant that prices that rule).

The product never imports this. It subclasses the interactive policy, which mypyc's compiled
core does not allow (its classes take no interpreted subclasses), so it runs on the pure Python
core: ``pure_workers`` starts processes with ``KIWI_PURE_PYTHON=1`` for the fleet's runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from multiprocessing import get_context
from typing import TYPE_CHECKING

import nodeside
from nodeside.compiled import PURE_ENV
from nodeside.config import POLICY_INTERACTIVE
from nodeside.scheduler.attained import AttainedService
from nodeside.scheduler.core import PRIORITY_RANK, ClientRecord, GpuState, Scheduler
from nodeside.scheduler.interactive import InteractivePolicy
from nodeside.scheduler.light import LightRequests
from nodeside.scheduler.light_first import LightFirst
from nodeside.scheduler.pricing import jump_quantum, switch_cost
from nodeside.scheduler.view import PolicyView

if TYPE_CHECKING:
    from nodeside.testing import Replay

#: (client id, now) -> GPU seconds left of the client's cell in progress.
Remaining = Callable[[str, float], float]

#: The fleet's ``policy`` names for the oracle, and whether a LOW request may cut a quantum.
ORACLES = {"clairvoyant": False, "clairvoyant-low-cuts": True}


class RemainingWork(AttainedService):
    """The measure the oracle orders by: the true remaining work, asked where the interactive
    policy asks for attained service (``attained``). Its bookkeeping (which request is fresh,
    which holds are open) stays the attained service's, as the light request rule reads it."""

    def __init__(self, view: PolicyView, remaining: Remaining) -> None:
        super().__init__(view)
        self.remaining = remaining

    def attained(self, client_id: str, now: float) -> float:
        return self.remaining(client_id, now)


class ClairvoyantPolicy(InteractivePolicy):
    """Shortest remaining work first, with switching costs, within the product's rules."""

    def __init__(self, scheduler: Scheduler, remaining: Remaining, *,
                 low_cuts: bool = False) -> None:
        view = scheduler.view
        super().__init__(view, RemainingWork(view, remaining))
        self.light_first = ClairvoyantCuts(view, self.service, self.light, remaining,
                                           low_cuts=low_cuts)
        self.remaining = remaining
        self.low_cuts = low_cuts


class ClairvoyantCuts(LightFirst):
    """The interactive policy's rules for the light, with the quantum priced by remaining
    work (stepping aside, in mode auto, asks this quantum too)."""

    def __init__(self, view: PolicyView, service: AttainedService, light: LightRequests,
                 remaining: Remaining, *, low_cuts: bool) -> None:
        super().__init__(view, service, light)
        self.remaining = remaining
        self.low_cuts = low_cuts

    def quantum(self, gpu: GpuState, holder: ClientRecord, winner: ClientRecord, tq: float,
                now: float) -> float:
        if not self.low_cuts and PRIORITY_RANK[winner.priority] > PRIORITY_RANK[holder.priority]:
            return tq  # a LOW request never cuts a quantum short
        handoff = switch_cost(self.view, gpu, holder, winner)
        # The cut moves memory twice: to the winner now, back to the holder once it is done.
        if self.remaining(winner.id, now) + 2 * handoff < self.remaining(holder.id, now):
            return 0.0  # over now
        if self.light.went_ahead(holder.id):  # the bound on a light request's jump, as today
            return jump_quantum(tq, handoff)
        return tq


def remaining_work(replay: Replay) -> Remaining:
    """The replay's own account of each worker's burst: what is left of it at ``now``."""
    def remaining(client_id: str, now: float) -> float:
        worker = replay.workers.get(client_id)
        return 0.0 if worker is None else worker.left(now)
    return remaining


def install(replay: Replay, *, low_cuts: bool = False,
            remaining: Remaining | None = None) -> ClairvoyantPolicy:
    """Put the oracle in place of a replay's interactive policy, before the replay runs; told
    ``remaining`` instead of the replay's true remaining work, it is a reference on estimates
    (``hints``)."""
    scheduler = replay.scheduler
    if scheduler.config.policy != POLICY_INTERACTIVE:
        raise ValueError("the clairvoyant policy replaces policy: interactive (its settings "
                         f"price the quantum), not {scheduler.config.policy!r}")
    if nodeside.core().startswith("compiled"):
        raise RuntimeError("the clairvoyant policy subclasses the interactive policy, which the "
                           f"compiled core does not allow: run it with {PURE_ENV}=1 "
                           "(benchmarks.fleet.oracle.pure_workers does)")
    policy = ClairvoyantPolicy(scheduler, remaining or remaining_work(replay), low_cuts=low_cuts)
    scheduler.choice = policy
    return policy


@contextmanager
def pure_workers(jobs: int | None = None) -> Iterator[ProcessPoolExecutor]:
    """Worker processes on the pure Python core, whichever core this process runs.

    The core is chosen once per process, when nodeside is first imported, from the
    environment: so the workers are spawned (not forked from this process's modules) while
    ``KIWI_PURE_PYTHON`` is set, and it is put back as it was afterwards."""
    before = os.environ.get(PURE_ENV)
    os.environ[PURE_ENV] = "1"
    try:
        with ProcessPoolExecutor(max_workers=jobs or os.cpu_count() or 1,
                                 mp_context=get_context("spawn")) as pool:
            yield pool
    finally:
        if before is None:
            del os.environ[PURE_ENV]
        else:
            os.environ[PURE_ENV] = before
