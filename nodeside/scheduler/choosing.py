"""Choosing the next holder: the seam where a scheduling policy plugs in.

The core asks a policy who goes next on a GPU (``pick``), in which order the waiters can expect
to be served (``order`` and ``position``, for queue positions), the two pool rules that also
drive preemption and quanta (``below_guarantee``, ``over_maximum``), and why the next one is
next (``reason``, for the status). ``PoolsPolicy`` is the default, round robin after the KAI
scheduler: the contending pool furthest below its entitlement, never a pool at its maximum;
within a pool HIGH before NORMAL before LOW, then request order. A request of a pool below its
guarantee goes before any split by weight.

A policy reads the node through a ``PolicyView`` only (view.py), and learns what happened
through ``observe`` if it ``observes``: round robin remembers nothing, so the core makes no
event for it. A policy that gives the GPU's time to light clients first has a ``light_first``
(light_first.py: cutting quanta short, stepping aside, taking turns), which the core consults;
round robin has none. Another policy subclasses ``PoolsPolicy`` and is listed under its config
name in ``policies.POLICIES`` (``policy: <name>`` in the config file).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

from nodeside.model import POLICY_ROUND_ROBIN
from nodeside.scheduler.gpu_state import PRIORITY_RANK, ClientRecord, GpuState
from nodeside.scheduler.light_first import LightFirst
from nodeside.scheduler.pools import entitlements
from nodeside.scheduler.view import Event, PolicyView

_EPS: Final = 1e-9


def within_pool(client: ClientRecord) -> tuple[int, int]:
    """A pool's own order: priority, then request order."""
    return PRIORITY_RANK[client.priority], client.request_order


class PoolsPolicy:
    """Pools by entitlement, then priority, then request order."""

    name = POLICY_ROUND_ROBIN
    #: Whether the policy learns from what happens (``observe``). Round robin does not: the core
    #: makes no event for it, and a handoff costs none.
    observes = False
    #: The rules giving the GPU's time to light clients first, where the policy has them.
    light_first: LightFirst | None = None

    def __init__(self, view: PolicyView) -> None:
        self.view = view

    def pick(self, gpu: GpuState, now: float,
             tail: ClientRecord | None = None) -> ClientRecord | None:
        """The next client to serve on ``gpu``, or None (nobody waits, or only capped pools).

        ``tail`` is a holder whose quantum ended, competing as if it had just asked again.
        """
        if tail is None:
            only = gpu.waiters.sole_head()
            if only is not None:  # one pool waits (the hot path): no shares to measure
                return None if self.over_maximum(gpu, only.pool, now) else only
        heads = gpu.waiters.heads()
        if tail is not None:
            best = heads.get(tail.pool)
            if best is None or within_pool(tail) < within_pool(best):
                heads[tail.pool] = tail
        if len(heads) == 1:  # one pool, with a holder at the tail: no shares to measure
            # A loop, not ``(name, only), = heads.items()``: compiled, unpacking goes through
            # Python's generic iterators, the loop through the dict's own.
            for name, first in heads.items():
                return None if self.over_maximum(gpu, name, now) else first
        if not heads:
            return None
        shares = gpu.meter.shares(now, heads)
        heads = {name: c for name, c in heads.items()
                 if not self.over_maximum(gpu, name, now, shares)}
        if len(heads) <= 1:
            return next(iter(heads.values()), None)
        ent = entitlements(self.view.pool(name) for name in contending_pools(gpu))

        def urgency(c: ClientRecord) -> tuple[bool, float, int]:
            # Guarantees come first: a non-preemptible request of a pool below its guarantee
            # goes before any split by weight.
            owed = self.below_guarantee(gpu, c, now)
            return owed, ent.get(c.pool, 0.0) - shares.get(c.pool, 0.0), -c.request_order

        return max(heads.values(), key=urgency)

    def order(self, gpu: GpuState, now: float) -> list[ClientRecord]:
        """The waiters in the order they can expect to be served (a prediction, next first).

        One pool: its own order. Several: each pool's j-th waiter (in its pool's order) is
        placed by how far its pool would be below its entitlement once its j earlier waiters
        had a quantum each (``urgency``), most urgent first; ties go to the smaller j, then
        the earlier request. That is how the shares move as the queue drains; and since a
        pool's urgency only falls with j, each pool keeps its own order.
        """
        pools = gpu.waiters.pools()
        if len(pools) <= 1:
            return [c for pool in pools for c in gpu.waiters.in_order(pool)]
        urgency = self._urgency(gpu, now)
        ranked = [(-urgency(pool, j), j, c.request_order, c)
                  for pool in pools for j, c in enumerate(gpu.waiters.in_order(pool))]
        ranked.sort(key=lambda entry: entry[:3])
        return [entry[3] for entry in ranked]

    def position(self, gpu: GpuState, client: ClientRecord, now: float) -> int:
        """``client``'s 1-based place in ``order``, without building it.

        One pool: its place in the pool, O(1) while waiters leave from the head. Several: for
        each other pool, a binary search for how many of its waiters rank ahead (urgency falls
        with j), O(pools x log waiters).
        """
        mine = gpu.waiters.index_in_pool(client)
        if gpu.waiters.pool_count() == 1:
            return mine + 1
        pools = gpu.waiters.pools()
        urgency = self._urgency(gpu, now)
        key = urgency(client.pool, mine)
        ahead = mine
        for pool in pools - {client.pool}:
            size = gpu.waiters.pool_size(pool)

            def at_most(j: int, pool: str = pool) -> bool:
                return urgency(pool, j) <= key

            def below(j: int, pool: str = pool) -> bool:
                return urgency(pool, j) < key

            more, tied_end = _first(size, at_most), _first(size, below)
            # Ties in urgency: the smaller j first, then the earlier request.
            ahead += more + max(0, min(tied_end, mine) - more)
            if more <= mine < tied_end and \
                    gpu.waiters.nth_in_pool(pool, mine).request_order < client.request_order:
                ahead += 1
        return ahead + 1

    def _urgency(self, gpu: GpuState, now: float) -> Callable[[str, int], float]:
        shares = self.view.shares(gpu.spec.index, now)
        ent = entitlements(self.view.pool(name) for name in contending_pools(gpu))
        step = self.view.tq_for(gpu.spec.index) / max(gpu.meter.window, _EPS)

        def urgency(pool: str, j: int) -> float:
            # One expression for order and position alike, so both round the same way.
            return ent.get(pool, 0.0) - (shares.get(pool, 0.0) + j * step)

        return urgency

    def below_guarantee(self, gpu: GpuState, client: ClientRecord, now: float) -> bool:
        """Is ``client`` a non-preemptible request of a pool below its guarantee?

        As in KAI, the guarantee covers a pool's non-preemptible work: its LOW holds do not
        count towards it, so a pool running only preemptible work is still owed its guarantee.
        """
        if client.preemptible:
            return False
        used = gpu.meter.shares(now, [client.pool], non_preemptible=True)[client.pool]
        return used < self.view.pool(client.pool).guarantee - _EPS

    def over_maximum(self, gpu: GpuState, pool: str, now: float,
                     shares: Mapping[str, float] | None = None) -> bool:
        if not self.view.capped:
            return False
        cap = self.view.pool(pool).cap
        if cap >= 1.0:
            return False
        if shares is None or pool not in shares:
            shares = gpu.meter.shares(now, [pool])
        return shares.get(pool, 0.0) >= cap - _EPS

    def observe(self, event: Event) -> None:
        """Something happened (view.py's events); told only to a policy that ``observes``."""

    def reason(self, gpu: GpuState, nxt: ClientRecord, now: float) -> str:
        """Why ``nxt`` is the next holder, in words for the status document."""
        if len(gpu.waiters.pools()) > 1:
            return f"round robin: pool {nxt.pool} is furthest below its entitlement"
        return "round robin: first in request order"


def _first(size: int, reached: Callable[[int], bool]) -> int:
    """The first j in [0, size) where ``reached`` (monotone: false, then true), else size."""
    low, high = 0, size
    while low < high:
        middle = (low + high) // 2
        if reached(middle):
            high = middle
        else:
            low = middle + 1
    return low


def contending_pools(gpu: GpuState) -> list[str]:
    """The pools holding or waiting for ``gpu``, sorted: the ones entitlements divide among."""
    names = {c.pool for c in gpu.holders.values()} | gpu.waiters.pools()
    return sorted(names)

