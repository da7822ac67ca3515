"""The light request that goes ahead of a pool's rule, for ``policy: interactive``.

A pool whose demand is below its guarantee is owed it nearly always (the fleet benchmark's
simulation pool: guarantee 0.5, demand 0.2 to 0.4 of a GPU), and owed-first alone makes it a
strict priority over the other pools' short cells. So where a pool's rule (a guarantee owed, a
pool behind) picks a request, a fresh request of another pool that used at most CUT_RATIO of
its GPU time may go first, for one quantum of at most JUMP_QUANTUM (``pricing.quantum``); once
between two of that pool's grants on the GPU, so that pool loses at most that much per turn of
its own: its rule is delayed by a bounded amount, not broken.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from nodeside.scheduler.attained import CUT_RATIO, AttainedService
from nodeside.scheduler.gpu_state import PRIORITY_RANK, ClientRecord, GpuState

#: Seconds a light request that went ahead of a pool's rule (a guarantee owed, a pool behind its
#: entitlement) may hold before the request it went ahead of is served.
JUMP_QUANTUM = 5.0


class Ranking(Protocol):
    """The policy's order, which this rule bends once (``InteractivePolicy``'s)."""

    def heads(self, gpu: GpuState, now: float) -> dict[str, ClientRecord]:
        """Each pool's next waiter in the policy's own order."""
        ...

    def before(self, tail: ClientRecord, head: ClientRecord, now: float) -> bool:
        """Does ``tail`` go before ``head`` within their pool?"""
        ...

    def by_rules(self, gpu: GpuState, heads: Mapping[str, ClientRecord],
                 now: float) -> tuple[ClientRecord | None, bool, list[ClientRecord]]:
        """The winner among ``heads``, whether a pool's rule chose it, and the eligible."""
        ...


class LightRequests:
    """Which pools a light request went ahead of, and who holds for having done so."""

    def __init__(self, ranking: Ranking, service: AttainedService) -> None:
        self.ranking = ranking
        self.service = service
        #: (GPU index, pool) a light request went ahead of, until that pool's next grant there:
        #: at most once between two of a pool's grants.
        self._jumped: set[tuple[int, str]] = set()
        #: Holders that went ahead of another pool's request: their quantum is JUMP_QUANTUM.
        self._jumpers: set[str] = set()
        #: GPU index -> the holder that last gave it back for a drop: it still contends for the
        #: grant that follows, which it asks again for once it is done giving back.
        self._left: dict[int, ClientRecord] = {}

    def went_ahead(self, holder_id: str) -> bool:
        """Does ``holder_id`` hold for having gone ahead of another pool's request?"""
        return holder_id in self._jumpers

    def granted(self, gpu: GpuState, client: ClientRecord, now: float) -> None:
        """``client`` is granted ``gpu`` (before its hold counts: still fresh)."""
        over = self._gone_ahead_of(gpu, client, now)
        index = gpu.spec.index
        self._jumped.discard((index, client.pool))
        self._jumpers.discard(client.id)
        if over is not None:
            self._jumped.add((index, over))
            self._jumpers.add(client.id)

    def hold_ends(self, client: ClientRecord) -> None:
        hold = client.hold
        if hold is not None and hold.drop_incoming is not None:
            self._left[client.gpu] = client

    def forget(self, client_id: str) -> None:
        self._jumpers.discard(client_id)
        for index in [i for i, c in self._left.items() if c.id == client_id]:
            del self._left[index]

    def over(self, gpu: GpuState, best: ClientRecord, eligible: list[ClientRecord],
             now: float) -> ClientRecord | None:
        """The request that goes ahead of ``best``, which a pool's rule chose, if any: a fresh
        request of another pool (it has not held yet), of no lower priority, that used at most
        CUT_RATIO of ``best``'s GPU time; none if one went ahead of ``best``'s pool since that
        pool's last grant on the GPU."""
        if (gpu.spec.index, best.pool) in self._jumped:
            return None
        service = self.service
        limit = CUT_RATIO * service.attained(best.id, now)
        light = [c for c in eligible if c.pool != best.pool and service.fresh(c)
                 and PRIORITY_RANK[c.priority] <= PRIORITY_RANK[best.priority]
                 and service.attained(c.id, now) <= limit]
        return min(light, key=lambda c: (service.attained(c.id, now), c.request_order),
                   default=None)

    def going_ahead(self, gpu: GpuState, now: float) -> ClientRecord | None:
        """The waiter that would go ahead of a pool's rule if the GPU were free now, if any."""
        ranking = self.ranking
        best, by_rule, eligible = ranking.by_rules(gpu, ranking.heads(gpu, now), now)
        if best is None or not by_rule:
            return None
        return self.over(gpu, best, eligible, now)

    def _gone_ahead_of(self, gpu: GpuState, client: ClientRecord, now: float) -> str | None:
        """The pool whose request ``client``'s grant (now) went ahead of as a light request,
        if it did: ``pick``'s contest again, with the holder that just gave the GPU back for a
        drop still in it (it asks again once it is done giving back)."""
        left = self._left.pop(gpu.spec.index, None)
        # Counted, not ``pools() - {client.pool}``: this runs on every grant.
        pools = gpu.waiters.pool_count()
        others = pools > 1 or (pools == 1 and not gpu.waiters.pool_waits(client.pool))
        if not others and (left is None or left.pool == client.pool):
            return None  # no other pool contends: the common grant, decided at once
        if not self.service.fresh(client):
            return None
        ranking = self.ranking
        heads = ranking.heads(gpu, now)
        # ``left`` is still on the node: ``forget`` takes a client that leaves out of ``_left``.
        if left is not None and left.id != client.id and left.id not in gpu.waiters:
            mine = heads.get(left.pool)
            if mine is None or ranking.before(left, mine, now):
                heads[left.pool] = left
        heads[client.pool] = client
        best, by_rule, eligible = ranking.by_rules(gpu, heads, now)
        if best is None or best is client or not by_rule:
            return None
        return best.pool if self.over(gpu, best, eligible, now) is client else None
