"""Choosing the next holder: the seam where a scheduling policy plugs in.

The core asks a policy three things: who goes next on a GPU (``pick``), in which order the
waiters can expect to be served (``order``, for queue positions), and the two pool rules that
also drive preemption and quanta (``below_guarantee``, ``over_maximum``). ``PoolsPolicy`` is the
default, after the KAI scheduler: the contending pool furthest below its entitlement, never a
pool at its maximum; within a pool HIGH before NORMAL before LOW, then request order. A request
of a pool below its guarantee goes before any split by weight.

Another policy subclasses ``PoolsPolicy`` and is listed under its config name in
``policies.POLICIES`` (``policy: <name>`` in the config file). The hooks at the end of
``PoolsPolicy`` (what each grant, kept turn and ended hold did; how long a quantum is; why the
next holder is next) do nothing here: round robin needs no memory of what clients used.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from nodeside.config import POLICY_ROUND_ROBIN
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

    name = POLICY_ROUND_ROBIN
    #: Whether ``quantum`` may be shorter than the TQ (a deadline that moves with time).
    cuts_quanta = False

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
            # A loop, not ``(name, only), = heads.items()``: compiled, unpacking goes through
            # Python's generic iterators, the loop through the dict's own.
            for name, only in heads.items():
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

    def position(self, gpu: GpuState, client: Client, now: float) -> int:
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
        shares = self.scheduler.shares(gpu.spec.index, now)
        ent = entitlements(self.scheduler.pool(name) for name in contending_pools(gpu))
        step = self.scheduler.tq_for(gpu.spec.index) / max(gpu.meter.window, _EPS)

        def urgency(pool: str, j: int) -> float:
            # One expression for order and position alike, so both round the same way.
            return ent.get(pool, 0.0) - (shares.get(pool, 0.0) + j * step)

        return urgency

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
        if not self.scheduler.capped:
            return False
        cap = self.scheduler.pool(pool).cap
        if cap >= 1.0:
            return False
        if shares is None or pool not in shares:
            shares = gpu.meter.shares(now, [pool])
        return shares.get(pool, 0.0) >= cap - _EPS


    # -- hooks for policies that remember what clients used (see interactive.py) -----------

    def quantum(self, gpu: GpuState, holder: Client, winner: Client, tq: float,
                now: float) -> float:
        """How long ``holder``'s quantum is, ``winner`` being who would go next."""
        return tq

    # -- mode auto: whether a holder steps aside for a light one (see aside.py) -------------

    def holds_back(self, gpu: GpuState, client: Client, now: float) -> bool:
        """Mode auto: is ``client``, which fits, kept from being granted beside the holders?"""
        return False

    def steps_aside_for(self, gpu: GpuState, holder: Client, waiter: Client | None, tq: float,
                        now: float) -> Client | None:
        """The client ``holder`` is asked to step aside for now, if any (``waiter``: the one
        ``pick`` would grant next)."""
        return None

    def aside_may_come(self, gpu: GpuState, now: float) -> bool:
        """Mode auto: may a holder yet step aside, or a held-back request be granted, as GPU
        time is used with no event to say so? (The core then looks again after a first
        quantum.)"""
        return False

    # -- mode auto: holders taking turns (see taking_turns.py) ------------------------------

    def turn_length(self) -> float:
        """Seconds of a turn when pausable holders side by side take turns; 0: they do not."""
        return 0.0

    def request_work(self, client_id: str, now: float) -> float:
        """GPU seconds the client's request in progress has worked: who has the next turn."""
        return 0.0

    def on_pause(self, client: Client, now: float) -> None:
        """``client`` holds on, paused while another has its turn."""

    def on_resume(self, client: Client, now: float) -> None:
        """``client``'s turn: it works again."""

    def on_grant(self, gpu: GpuState, client: Client, now: float) -> None:
        """``client`` was granted ``gpu`` (already out of the waiters)."""

    def on_keep(self, gpu: GpuState, holder: Client, now: float) -> None:
        """``holder``'s quantum ended with waiters, and it won again at the tail."""

    def on_hold_end(self, client: Client, now: float) -> None:
        """``client``'s hold ends now (its ``hold`` still says how)."""

    def forget(self, client_id: str) -> None:
        """The client is gone."""

    def reason(self, gpu: GpuState, nxt: Client, now: float) -> str:
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

