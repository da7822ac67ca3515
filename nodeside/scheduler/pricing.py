"""The quantum's pricing, for ``policy: interactive``: when a holder's quantum is cut short.

Never switching at a loss: a holder's quantum is cut short only for a client that used at most
CUT_RATIO of the holder's recent GPU time, only after ``first_quantum`` or COST_FACTOR times the
time moving both working sets would take, whichever is longer, and only when the wait that saves
is longer than moving the memory there and back. Working sets are the ones clients report; an
unknown one counts as the whole GPU, as in mode auto. A light request that went ahead of a
pool's rule (``light``) holds for JUMP_QUANTUM at most.
"""

from __future__ import annotations

from nodeside.scheduler.attained import CUT_RATIO, AttainedService
from nodeside.scheduler.gpu_state import PRIORITY_RANK, ClientRecord, GpuState
from nodeside.scheduler.light import JUMP_QUANTUM, LightRequests
from nodeside.scheduler.view import PolicyView

#: A cut-short quantum lasts at least this many times the handoff's memory traffic, so that at
#: most a third of the GPU's time goes to moving memory, however often clients alternate.
COST_FACTOR = 2.0


def quantum(view: PolicyView, service: AttainedService, light: LightRequests, gpu: GpuState,
            holder: ClientRecord, winner: ClientRecord, tq: float, now: float) -> float:
    """How long ``holder``'s quantum is, with ``winner`` the client that would go next:
    ``service`` says what each used, ``light`` whether the holder went ahead of a pool's rule."""
    if PRIORITY_RANK[winner.priority] > PRIORITY_RANK[holder.priority]:
        return tq  # a LOW request never cuts a quantum short, a light one's included
    if light.went_ahead(holder.id):
        return jump_quantum(tq, switch_cost(view, gpu, holder, winner))
    if service.attained(winner.id, now) > CUT_RATIO * service.attained(holder.id, now):
        return tq
    cost = switch_cost(view, gpu, holder, winner)
    early = max(view.settings.interactive.first_quantum, COST_FACTOR * cost)
    if tq - early <= 2 * cost:
        return tq  # the wait saved is worth less than moving the memory there and back
    return early


def jump_quantum(tq: float, cost: float) -> float:
    """The quantum of a light request that went ahead of a pool's rule, whose handoff costs
    ``cost`` seconds of memory moves: JUMP_QUANTUM, or the TQ if shorter, or COST_FACTOR times
    the moves if longer."""
    return min(tq, max(JUMP_QUANTUM, COST_FACTOR * cost))


def switch_cost(view: PolicyView, gpu: GpuState, leaving: ClientRecord,
                coming: ClientRecord) -> float:
    """Seconds to move ``leaving``'s working set out and ``coming``'s in, if they must."""
    settings = view.settings
    capacity = gpu.spec.memory_total
    bandwidth = settings.interactive.link_bandwidth
    if capacity is None:
        sizes = [leaving.working_set, coming.working_set]
        if any(s is None for s in sizes):
            return 0.0  # nothing known to price: the first quantum alone applies
        return sum(s or 0 for s in sizes) / bandwidth
    ledger = gpu.ledger
    room = capacity - ledger.reserve
    need = [capacity if c.working_set is None else c.working_set for c in (leaving, coming)]
    if not ledger.excess(sum(need)):
        return 0.0
    return sum(min(n, room) for n in need) / bandwidth
