"""The pools report: how each pool is doing, and why a pool that waits is stuck.

It answers the KAI guide's troubleshooting questions ("Preemption not working", "Workflows stuck
in pending") from the scheduler's own state, so that ``status`` (its ``pools`` entries) and
``kiwictl pools`` say the same thing. Read-only and sans-I/O like the core: it takes the
scheduler and the current time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nodeside.scheduler.core import PRIORITY_RANK, ClientRecord, GpuState, Scheduler
from nodeside.scheduler.pools import entitlements

GiB = 1024**3


@dataclass(frozen=True)
class PoolOnGpu:
    gpu: int
    share: float  # fraction of this GPU's time over the share window
    entitlement: float | None  # None while the pool does not contend for this GPU
    holding: int
    waiting: int
    stuck: str | None
    #: The pool waits for this GPU while its non-preemptible share is below its guarantee.
    below_guarantee: bool = False


@dataclass(frozen=True)
class PoolReport:
    name: str
    guarantee: float
    weight: float
    maximum: float  # -1: no maximum
    complete: bool  # guarantee, weight and maximum all configured
    share: float  # mean over the node's GPUs
    clients: int
    holding: int
    waiting: list[str]  # names of the waiting clients, next first
    stuck: str | None  # why the pool waits, when it waits for a reason worth telling
    gpus: list[PoolOnGpu] = field(default_factory=list)
    #: Among the pools with a client holding or waiting, node-wide; None when not contending.
    entitlement: float | None = None
    configured: bool = True
    missing: tuple[str, ...] = ()

    @property
    def below_guarantee(self) -> bool:
        """Waiting on some GPU while below its guarantee there: the panel marks the pool."""
        return any(g.below_guarantee for g in self.gpus)

    def as_status(self) -> dict[str, Any]:
        """The status document's entry (docs/interfaces.md section 5 keys, then ours)."""
        return {
            "name": self.name, "guarantee": self.guarantee, "weight": self.weight,
            "maximum": self.maximum, "share": round(self.share, 6),
            "entitlement": None if self.entitlement is None else round(self.entitlement, 6),
            "clients": self.clients, "waiting": len(self.waiting), "holding": self.holding,
            "configured": self.configured, "complete": self.complete,
            "missing": list(self.missing), "waiting_clients": self.waiting,
            "stuck": self.stuck, "below_guarantee": self.below_guarantee,
            "gpus": [{"index": g.gpu, "share": round(g.share, 4),
                      "entitlement": None if g.entitlement is None else round(g.entitlement, 4),
                      "holding": g.holding, "waiting": g.waiting, "stuck": g.stuck,
                      "below_guarantee": g.below_guarantee}
                     for g in self.gpus],
        }


def pool_reports(scheduler: Scheduler, now: float,
                 queues: Mapping[int, list[ClientRecord]] | None = None) -> list[PoolReport]:
    """One report per pool: the configured ones, then any other pool a client named.

    ``queues``: each GPU's ``Scheduler.queue``, when the caller has it already.
    """
    names = list(scheduler.config.pools)
    if not names:
        names.append(scheduler.pool("default").name)
    for client in scheduler.clients.values():
        if client.pool not in names:
            names.append(client.pool)
    if queues is None:
        queues = {index: scheduler.queue(index, now) for index in scheduler.gpus}
    contending = {c.pool for c in scheduler.clients.values() if c.state != "idle"}
    ent = entitlements(scheduler.pool(n) for n in sorted(contending))
    return [_report(scheduler, name, now, queues, ent.get(name)) for name in names]


def _report(scheduler: Scheduler, name: str, now: float, queues: Mapping[int, list[ClientRecord]],
            entitlement: float | None) -> PoolReport:
    pool = scheduler.pool(name)
    members = [c for c in scheduler.clients.values() if c.pool == name]
    per_gpu = [_on_gpu(scheduler, gpu, name, now) for gpu in scheduler.gpus.values()]
    waiting = [c for index in scheduler.gpus for c in queues[index] if c.pool == name]
    return PoolReport(
        name=name, guarantee=pool.guarantee, weight=pool.weight, maximum=pool.maximum,
        complete=pool.complete,
        share=sum(g.share for g in per_gpu) / len(per_gpu),
        clients=len(members), holding=sum(c.state == "holding" for c in members),
        waiting=[c.name for c in waiting],
        stuck=next((g.stuck if len(per_gpu) == 1 else f"GPU {g.gpu}: {g.stuck}"
                    for g in per_gpu if g.stuck), None),
        gpus=per_gpu, entitlement=entitlement,
        configured=name in scheduler.config.pools or not scheduler.config.pools,
        missing=pool.missing)


def _on_gpu(scheduler: Scheduler, gpu: GpuState, name: str, now: float) -> PoolOnGpu:
    index = gpu.spec.index
    contending = sorted({c.pool for c in (*gpu.holders.values(), *gpu.waiters.values())})
    ent = entitlements(scheduler.pool(n) for n in contending).get(name)
    head = min((c for c in gpu.waiters.values() if c.pool == name),
               key=lambda c: (PRIORITY_RANK[c.priority], c.request_order), default=None)
    # Below its guarantee where that gets the pool something: another pool uses the GPU, or a
    # preemptible holder would give way. A lone pool whose clients take turns is owed nothing.
    below = head is not None and not head.preemptible and (
        len(contending) > 1 or any(h.preemptible for h in gpu.holders.values())) and \
        gpu.meter.shares(now, [name], non_preemptible=True)[name] \
        < scheduler.pool(name).guarantee - 1e-9
    return PoolOnGpu(
        gpu=index, share=scheduler.shares(index, now).get(name, 0.0), entitlement=ent,
        holding=sum(c.pool == name for c in gpu.holders.values()),
        waiting=sum(c.pool == name for c in gpu.waiters.values()),
        stuck=None if head is None else stuck_reason(scheduler, gpu, head, now),
        below_guarantee=below)


def stuck_reason(scheduler: Scheduler, gpu: GpuState, head: ClientRecord, now: float) -> str | None:
    """Why ``head`` (its pool's next waiter on ``gpu``) waits, if not simply for its turn."""
    pool = scheduler.pool(head.pool)
    share = gpu.meter.shares(now, [pool.name])[pool.name]
    if pool.cap < 1.0 and share >= pool.cap - 1e-9:
        return (f"at its maximum: it used {share:.2f} of the GPU's time, its maximum is "
                f"{pool.maximum:g}; it waits until its share falls below")
    if scheduler.mode == "off" or not gpu.holders:
        return None
    if scheduler.mode == "auto":
        room = _room_note(scheduler, gpu, head)
        if room:
            return room
    used = gpu.meter.shares(now, [pool.name], non_preemptible=True)[pool.name]
    if used >= pool.guarantee - 1e-9:
        return None  # above its guarantee: it waits its turn by weight, nothing is wrong
    below = f"below its guarantee ({used:.2f} of {pool.guarantee:g})"
    if head.preemptible:
        return (f"{below}, but its waiting requests are LOW (preemptible), which never cut a "
                f"quantum short; use NORMAL or HIGH for work that must preempt")
    reason = scheduler.preemption_off_reason
    if reason is not None:
        return f"{below}, but {reason}"
    leaving = [h for h in gpu.holders.values() if h.hold and h.hold.drop_reason]
    if leaving:
        return None  # the GPU is being handed back
    if not any(h.preemptible for h in gpu.holders.values()):
        return (f"{below}, but nothing preemptible holds the GPU: it waits for the "
                f"holder's quantum to end")
    return None


def _room_note(scheduler: Scheduler, gpu: GpuState, head: ClientRecord) -> str | None:
    capacity = gpu.spec.memory_total
    if capacity is None:
        return "the GPU's memory is unknown (no NVML, no --gpu-memory): mode auto serializes"
    if head.working_set is None:
        return "its working set is unknown, so it needs the whole GPU"
    ledger = gpu.ledger
    if ledger.fits([*gpu.holders.values(), head]):
        return None
    used = sum(h.working_set or capacity for h in gpu.holders.values())
    free = max(0, capacity - ledger.reserve - used)
    return (f"does not fit beside the holders: needs {head.working_set / GiB:.1f} GiB, "
            f"{free / GiB:.1f} GiB free")
