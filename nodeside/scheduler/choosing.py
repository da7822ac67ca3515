"""Choosing the next holder: the seam where a scheduling policy plugs in.

The core asks a policy three things: who goes next on a GPU (``pick``), in which order the
waiters can expect to be served (``order``, for queue positions), and the two pool rules that
also drive preemption and quanta (``below_guarantee``, ``over_maximum``). ``PoolsPolicy`` is the
default, after the KAI scheduler: the contending pool furthest below its entitlement, never a
pool at its maximum; within a pool HIGH before NORMAL before LOW, then request order. A request
of a pool below its guarantee goes before any split by weight.

Another policy subclasses ``PoolsPolicy`` and registers under its config name in ``POLICIES``
(``policy: <name>`` in the config file).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from nodeside.scheduler.pools import entitlements
from nodeside.scheduler.state import PRIORITY_RANK, Client, GpuState

if TYPE_CHECKING:
    from nodeside.scheduler.core import Scheduler

_EPS = 1e-9


def within_pool(client: Client) -> tuple[int, int]:
    """A pool's own order: priority, then request order."""
    return PRIORITY_RANK[client.priority], client.request_order


class PoolsPolicy:
    """Pools by entitlement, then priority, then request order."""

    name = "pools"

    def __init__(self, scheduler: Scheduler) -> None:
        # Read-only use: the pools, the TQs and the GPUs' meters.
        self.scheduler = scheduler

    def pick(self, gpu: GpuState, now: float, tail: Client | None = None) -> Client | None:
        """The next client to serve on ``gpu``, or None (nobody waits, or only capped pools).

        ``tail`` is a holder whose quantum ended, competing as if it had just asked again.
        """
        heads = gpu.waiters.heads()
        if tail is not None:
            best = heads.get(tail.pool)
            if best is None or within_pool(tail) < within_pool(best):
                heads[tail.pool] = tail
        if len(heads) == 1:  # the common case, and the hot path: no shares to measure
            (name, only), = heads.items()
            return None if self.over_maximum(gpu, name, now) else only
        if not heads:
            return None
        shares = gpu.meter.shares(now, heads)
        heads = {name: c for name, c in heads.items()
                 if not self.over_maximum(gpu, name, now, shares)}
        if len(heads) <= 1:
            return next(iter(heads.values()), None)
        ent = entitlements(self.scheduler.pool(name) for name in contending_pools(gpu))

        def urgency(c: Client) -> tuple[bool, float, int]:
            # Guarantees come first: a non-preemptible request of a pool below its guarantee
            # goes before any split by weight.
            owed = self.below_guarantee(gpu, c, now)
            return owed, ent.get(c.pool, 0.0) - shares.get(c.pool, 0.0), -c.request_order

        return max(heads.values(), key=urgency)

    def order(self, gpu: GpuState, now: float) -> list[Client]:
        """The waiters in the order they can expect to be served (a prediction, next first).

        One pool: its own order. Several: replay the pool choice, charging each pick one
        quantum of its pool's share, which is how the shares will move as the queue drains.
        """
        by_pool = {pool: gpu.waiters.in_order(pool) for pool in gpu.waiters.pools()}
        if len(by_pool) <= 1:
            return [c for queue in by_pool.values() for c in queue]
        shares = self.scheduler.shares(gpu.spec.index, now)
        ent = entitlements(self.scheduler.pool(name) for name in contending_pools(gpu))
        step = self.scheduler.tq_for(gpu.spec.index) / max(gpu.meter.window, _EPS)
        order: list[Client] = []
        while by_pool:
            name = max(by_pool, key=lambda n: (ent.get(n, 0.0) - shares.get(n, 0.0),
                                                -by_pool[n][0].request_order))
            order.append(by_pool[name].pop(0))
            shares[name] = shares.get(name, 0.0) + step
            if not by_pool[name]:
                del by_pool[name]
        return order

    def below_guarantee(self, gpu: GpuState, client: Client, now: float) -> bool:
        """Is ``client`` a non-preemptible request of a pool below its guarantee?

        As in KAI, the guarantee covers a pool's non-preemptible work: its LOW holds do not
        count towards it, so a pool running only preemptible work is still owed its guarantee.
        """
        if client.preemptible:
            return False
        used = gpu.meter.shares(now, [client.pool], non_preemptible=True)[client.pool]
        return used < self.scheduler.pool(client.pool).guarantee - _EPS

    def over_maximum(self, gpu: GpuState, pool: str, now: float,
                     shares: Mapping[str, float] | None = None) -> bool:
        cap = self.scheduler.pool(pool).cap
        if cap >= 1.0:
            return False
        if shares is None or pool not in shares:
            shares = gpu.meter.shares(now, [pool])
        return shares.get(pool, 0.0) >= cap - _EPS


def contending_pools(gpu: GpuState) -> list[str]:
    """The pools holding or waiting for ``gpu``, sorted: the ones entitlements divide among."""
    names = {c.pool for c in gpu.holders.values()} | gpu.waiters.pools()
    return sorted(names)


#: Policies by their config name (``policy:`` in the config file).
POLICIES: dict[str, type[PoolsPolicy]] = {PoolsPolicy.name: PoolsPolicy}
