"""The interactive policy (``policy: interactive``): least attained service, within the pools'
and priorities' rules.

``choosing.PoolsPolicy`` is round robin: request order, a full TQ each turn. This subclass
orders by the GPU time each client used instead. The request in progress counts in full (its
holds so far, across drops: a cell that goes on after a drop keeps what it used); earlier
requests count half after ``half_life`` seconds. Of two clients of the same pool and priority
the one that used less goes first, so a person's short cell goes ahead of a training run.
Three rules keep that safe (docs/policy.md; tests/policy/test_interactive_policy.py):

- never starving: a waiter passed over ``pass_bound`` times by later requests of its pool and
  priority is served in request order from then on, so nobody is passed over more than that;
- pools and priorities first: maximums, guarantees and preemption are ``PoolsPolicy``'s; between
  pools, least attained service decides only while their shortfalls from their entitlements
  differ by at most SHARE_TOLERANCE; a LOW request never cuts a quantum short. Where a pool's
  rule (a guarantee owed, a pool behind) picks a request, a fresh request of another pool
  that used at most CUT_RATIO of its GPU time may go first once, for at most JUMP_QUANTUM,
  between two of that pool's grants: the pool's rule is delayed by a bounded amount, not
  broken (``_light_over``);
- never switching at a loss: a holder's quantum is cut short only for a client that used at
  most CUT_RATIO of the holder's recent GPU time, only after ``first_quantum`` or COST_FACTOR
  times the time moving both working sets would take, whichever is longer, and only when the
  wait that saves is longer than moving the memory there and back. Working sets are the ones
  clients report; an unknown one counts as the whole GPU, as in mode auto.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from nodeside import protocol as p
from nodeside.config import POLICY_INTERACTIVE, InteractiveSettings
from nodeside.scheduler.choosing import PoolsPolicy, contending_pools
from nodeside.scheduler.pools import entitlements
from nodeside.scheduler.state import PRIORITY_RANK, Client, GpuState

if TYPE_CHECKING:
    from nodeside.scheduler.core import Scheduler

#: A cut-short quantum lasts at least this many times the handoff's memory traffic, so that at
#: most a third of the GPU's time goes to moving memory, however often clients alternate.
COST_FACTOR = 2.0
#: A waiter cuts a quantum short only if it used at most this fraction of the holder's recent
#: GPU time: two training runs never ping-pong by early cuts, they alternate by quanta.
CUT_RATIO = 0.5
#: Seconds between a hold that ended by a drop and the client's next request within which the
#: request goes on (the client asks again at once to continue its work); later, it is a new one.
GOES_ON_WITHIN = 1.0
#: How far below its entitlement (a fraction of the GPU's time, over the share window) a pool
#: may fall before the pools' order overrides least attained service between pools.
SHARE_TOLERANCE = 0.05
#: Seconds a light request that went ahead of a pool's rule (a guarantee owed, a pool behind its
#: entitlement) may hold before the request it went ahead of is served.
JUMP_QUANTUM = 5.0


class InteractivePolicy(PoolsPolicy):
    name = POLICY_INTERACTIVE
    cuts_quanta = True

    def __init__(self, scheduler: Scheduler) -> None:
        super().__init__(scheduler)
        #: Client id -> (decayed GPU seconds of ended requests, when that was computed).
        self._used: dict[str, tuple[float, float]] = {}
        #: Client id -> GPU seconds of the request in progress (its holds so far, across drops).
        self._request: dict[str, float] = {}
        self._holding_since: dict[str, float] = {}
        #: Client id -> when its last hold ended by a drop, its request left open (``_settle``).
        self._dropped_at: dict[str, float] = {}
        #: Client id -> times passed over by a later request of its pool and priority, this wait.
        self.passed: dict[str, int] = {}
        #: (GPU index, pool) a light request went ahead of, until that pool's next grant there:
        #: at most once between two of a pool's grants.
        self._jumped: set[tuple[int, str]] = set()
        #: Holders that went ahead of another pool's request: their quantum is JUMP_QUANTUM.
        self._jumpers: set[str] = set()
        #: GPU index -> the holder that last gave it back for a drop: it still contends for the
        #: grant that follows, which it asks again for once it is done giving back.
        self._left: dict[int, Client] = {}

    @property
    def settings(self) -> InteractiveSettings:
        return self.scheduler.config.interactive  # read each time: SIGHUP may change it

    # -- what a client used ---------------------------------------------------------------

    def attained(self, client_id: str, now: float) -> float:
        """GPU seconds used: the request in progress in full, its open hold included, and the
        earlier ones each counting half after ``half_life`` seconds."""
        self._settle(client_id)
        value = self._history(client_id, now)
        since = self._holding_since.get(client_id)
        value += self._request.get(client_id, 0.0)
        return value + (now - since if since is not None else 0.0)

    def request_seconds(self, client_id: str) -> float:
        """GPU seconds of the request in progress held before drops (its open hold aside)."""
        self._settle(client_id)
        return self._request.get(client_id, 0.0)

    def _history(self, client_id: str, now: float) -> float:
        value, at = self._used.get(client_id, (0.0, now))
        return value * 0.5 ** (max(0.0, now - at) / self.settings.half_life)

    def _settle(self, client_id: str) -> None:
        """A hold that ended by a drop leaves its request open: the client asks again at once
        to go on. If instead it asked again only later (its cell had ended while the drop was
        out: the release answered the drop and the work both), that request was over when
        the hold ended, and its GPU time is history from then on."""
        ended = self._dropped_at.get(client_id)
        if ended is None:
            return
        client = self.scheduler.clients.get(client_id)
        asked = client.requested_at if client is not None else None
        if asked is None and client is not None and client.hold is not None:
            asked = client.hold.granted_at
        if asked is None or asked - ended <= GOES_ON_WITHIN:
            return  # not asked again yet, or asked at once: it goes on
        del self._dropped_at[client_id]
        self._used[client_id] = (self._history(client_id, ended)
                                 + self._request.pop(client_id, 0.0), ended)

    def on_grant(self, gpu: GpuState, client: Client, now: float) -> None:
        self._settle(client.id)
        self._dropped_at.pop(client.id, None)
        over = self._gone_ahead_of(gpu, client, now)  # before its hold counts: still fresh
        index = gpu.spec.index
        self._jumped.discard((index, client.pool))
        self._jumpers.discard(client.id)
        if over is not None:
            self._jumped.add((index, over))
            self._jumpers.add(client.id)
        self._holding_since[client.id] = now
        self.passed.pop(client.id, None)
        for waiter in self._lane(gpu, client):
            if waiter.request_order < client.request_order:
                self.passed[waiter.id] = self.passed.get(waiter.id, 0) + 1

    def on_keep(self, gpu: GpuState, holder: Client, now: float) -> None:
        """The holder won again at its quantum's end: everyone waiting in its lane was passed."""
        for waiter in self._lane(gpu, holder):
            self.passed[waiter.id] = self.passed.get(waiter.id, 0) + 1

    def on_hold_end(self, client: Client, now: float) -> None:
        """A hold ends. Given back when asked (a drop, a revocation), the request goes on; given
        back of the client's own accord (a cell ended), the next request starts afresh."""
        since = self._holding_since.pop(client.id, None)
        held = now - since if since is not None else 0.0
        self._request[client.id] = self._request.get(client.id, 0.0) + held
        hold = client.hold
        if hold is not None and hold.drop_incoming is not None:
            self._left[client.gpu] = client
        if hold is None or hold.drop_reason in (None, p.REASON_RELEASE):
            self._dropped_at.pop(client.id, None)
            self._used[client.id] = (self.attained(client.id, now), now)
            self._request.pop(client.id, None)
        else:
            self._dropped_at[client.id] = now

    def forget(self, client_id: str) -> None:
        self._used.pop(client_id, None)
        self._holding_since.pop(client_id, None)
        self._request.pop(client_id, None)
        self._dropped_at.pop(client_id, None)
        self.passed.pop(client_id, None)
        self._jumpers.discard(client_id)
        for index in [i for i, c in self._left.items() if c.id == client_id]:
            del self._left[index]

    # -- the order ------------------------------------------------------------------------

    def starved(self, client: Client) -> bool:
        return self.passed.get(client.id, 0) >= self.settings.pass_bound

    def _key(self, client: Client, now: float) -> tuple[int, bool, float, int]:
        starved = self.starved(client)
        used = 0.0 if starved else self.attained(client.id, now)
        return _rank(client)[0], not starved, used, client.request_order

    def heads(self, gpu: GpuState, now: float) -> dict[str, Client]:
        heads: dict[str, Client] = {}
        for pool, first in gpu.waiters.heads().items():
            lane = [c for c in gpu.waiters.in_order(pool) if c.priority == first.priority]
            heads[pool] = min(lane, key=lambda c: self._key(c, now))
        return heads

    def in_order(self, gpu: GpuState, pool: str, now: float) -> list[Client]:
        return sorted(gpu.waiters.in_order(pool), key=lambda c: self._key(c, now))

    def before(self, tail: Client, head: Client, now: float) -> bool:
        return self._key(tail, now) < self._key(head, now)

    def pick(self, gpu: GpuState, now: float, tail: Client | None = None) -> Client | None:
        """As ``PoolsPolicy.pick`` (maximums, guarantees), with ``heads`` and ``before``
        ordering each pool by least attained service, ``_by_rules`` between pools, and a light
        request going ahead of a pool's rule once (``_light_over``)."""
        heads = self.heads(gpu, now)
        if tail is not None:
            best = heads.get(tail.pool)
            if best is None or self.before(tail, best, now):
                heads[tail.pool] = tail
        best, by_rule, eligible = self._by_rules(gpu, heads, now)
        if best is None or not by_rule:
            return best
        return self._light_over(gpu, best, eligible, now) or best

    def _by_rules(self, gpu: GpuState, heads: Mapping[str, Client],
                  now: float) -> tuple[Client | None, bool, list[Client]]:
        """The pools' heads not at their maximum, the winner among them, and whether a pool's
        rule chose it: a request owed its guarantee first; then a pool more than
        SHARE_TOLERANCE further below its entitlement than the pool least behind, the furthest
        first; then least attained service. Weights are honoured over the share window,
        within the tolerance, rather than at every handoff: a short cell of a pool slightly
        ahead need not wait for the other pool's long one. (Shortfalls are compared with each
        other, not with zero: while the GPU idles at times, every pool is below its
        entitlement.)"""
        if not heads:
            return None, False, []
        shares = gpu.meter.shares(now, heads)
        eligible = [c for name, c in heads.items()
                    if not self.over_maximum(gpu, name, now, shares)]
        if len(eligible) <= 1:
            return next(iter(eligible), None), False, eligible
        ent = entitlements(self.scheduler.pool(name) for name in contending_pools(gpu))
        shortfall = {c.pool: ent.get(c.pool, 0.0) - shares.get(c.pool, 0.0) for c in eligible}
        least = min(shortfall.values())

        def urgency(c: Client) -> tuple[bool, float, bool, float, int]:
            short = shortfall[c.pool] - least
            behind = short if short > SHARE_TOLERANCE else 0.0
            starved = self.starved(c)
            used = 0.0 if starved else self.attained(c.id, now)
            return self.below_guarantee(gpu, c, now), behind, starved, -used, -c.request_order
        best = max(eligible, key=urgency)
        owed, behind = urgency(best)[:2]
        return best, bool(owed or behind), eligible

    def _light_over(self, gpu: GpuState, best: Client, eligible: list[Client],
                    now: float) -> Client | None:
        """The request that goes ahead of ``best``, which a pool's rule chose, if any.

        A pool whose demand is below its guarantee is owed it nearly always (the fleet
        benchmark's simulation pool: guarantee 0.5, demand 0.2 to 0.4 of a GPU), and owed-first
        alone makes it a strict priority over the other pools' short cells. So a fresh request
        of another pool (it has not held yet), of no lower priority, that used at most
        CUT_RATIO of ``best``'s GPU time goes first, for one quantum of at most JUMP_QUANTUM
        (``quantum``); once between two of ``best``'s pool's grants on the GPU (``on_grant``),
        so that pool loses at most that much per turn of its own."""
        if (gpu.spec.index, best.pool) in self._jumped:
            return None
        limit = CUT_RATIO * self.attained(best.id, now)
        light = [c for c in eligible if c.pool != best.pool and self._fresh(c)
                 and PRIORITY_RANK[c.priority] <= PRIORITY_RANK[best.priority]
                 and self.attained(c.id, now) <= limit]
        return min(light, key=lambda c: (self.attained(c.id, now), c.request_order),
                   default=None)

    def _gone_ahead_of(self, gpu: GpuState, client: Client, now: float) -> str | None:
        """The pool whose request ``client``'s grant (now) went ahead of as a light request,
        if it did: ``pick``'s contest again, with the holder that just gave the GPU back for a
        drop still in it (it asks again once it is done giving back)."""
        left = self._left.pop(gpu.spec.index, None)
        others = gpu.waiters.pools() - {client.pool}
        if not others and (left is None or left.pool == client.pool):
            return None  # no other pool contends: the common grant, decided at once
        if not self._fresh(client):
            return None
        heads = self.heads(gpu, now)
        if left is not None and left.id != client.id and left.id in self.scheduler.clients \
                and left.id not in gpu.waiters:
            mine = heads.get(left.pool)
            if mine is None or self.before(left, mine, now):
                heads[left.pool] = left
        heads[client.pool] = client
        best, by_rule, eligible = self._by_rules(gpu, heads, now)
        if best is None or best is client or not by_rule:
            return None
        return best.pool if self._light_over(gpu, best, eligible, now) is client else None

    def _fresh(self, client: Client) -> bool:
        """Has ``client``'s request not held the GPU yet (no hold open, none before a drop)?"""
        self._settle(client.id)
        return client.id not in self._holding_since and client.id not in self._request

    def order(self, gpu: GpuState, now: float) -> list[Client]:
        """The expected order: each pool by least attained service, the pools interleaved by
        ``PoolsPolicy``'s prediction (least attained service between pools is not predicted:
        positions are a forecast, the grant order is ``pick``'s)."""
        pools = gpu.waiters.pools()
        if len(pools) <= 1:
            return [c for pool in pools for c in self.in_order(gpu, pool, now)]
        urgency = self._urgency(gpu, now)
        ranked = [(-urgency(pool, j), j, c.request_order, c)
                  for pool in pools for j, c in enumerate(self.in_order(gpu, pool, now))]
        ranked.sort(key=lambda entry: entry[:3])
        order = [entry[3] for entry in ranked]
        light = self._going_ahead(gpu, now)
        if light is not None:  # it goes next: shown first, like the grant that will follow
            order.remove(light)
            order.insert(0, light)
        return order

    def _going_ahead(self, gpu: GpuState, now: float) -> Client | None:
        """The waiter that would go ahead of a pool's rule if the GPU were free now, if any."""
        best, by_rule, eligible = self._by_rules(gpu, self.heads(gpu, now), now)
        if best is None or not by_rule:
            return None
        return self._light_over(gpu, best, eligible, now)

    def position(self, gpu: GpuState, client: Client, now: float) -> int:
        return [c.id for c in self.order(gpu, now)].index(client.id) + 1

    def _lane(self, gpu: GpuState, client: Client) -> list[Client]:
        return [w for w in gpu.waiters.in_order(client.pool)
                if w.priority == client.priority and w.id != client.id]

    # -- the quantum ----------------------------------------------------------------------

    def quantum(self, gpu: GpuState, holder: Client, winner: Client, tq: float,
                now: float) -> float:
        """How long ``holder``'s quantum is, with ``winner`` the client that would go next."""
        if PRIORITY_RANK[winner.priority] > PRIORITY_RANK[holder.priority]:
            return tq  # a LOW request never cuts a quantum short, a light one's included
        if holder.id in self._jumpers:
            return min(tq, max(JUMP_QUANTUM, COST_FACTOR * self.switch_cost(gpu, holder, winner)))
        if self.attained(winner.id, now) > CUT_RATIO * self.attained(holder.id, now):
            return tq
        cost = self.switch_cost(gpu, holder, winner)
        early = max(self.settings.first_quantum, COST_FACTOR * cost)
        if tq - early <= 2 * cost:
            return tq  # the wait saved is worth less than moving the memory there and back
        return early

    def switch_cost(self, gpu: GpuState, leaving: Client, coming: Client) -> float:
        """Seconds to move ``leaving``'s working set out and ``coming``'s in, if they must."""
        capacity = gpu.spec.memory_total
        if capacity is None:
            sizes = [leaving.working_set, coming.working_set]
            if any(s is None for s in sizes):
                return 0.0  # nothing known to price: the first quantum alone applies
            return sum(s or 0 for s in sizes) / self.settings.link_bandwidth
        room = capacity - self.scheduler.config.memory_reserve
        need = [capacity if c.working_set is None else c.working_set for c in (leaving, coming)]
        if sum(need) <= room:
            return 0.0
        return sum(min(n, room) for n in need) / self.settings.link_bandwidth

    def reason(self, gpu: GpuState, nxt: Client, now: float) -> str:
        """Why ``nxt`` goes next, for the status document: the first rule that decided."""
        promised = {h.hold.drop_incoming for h in gpu.holders.values() if h.hold}
        if nxt.id in promised or gpu.promised == nxt.id:
            return "the holder was asked to leave for it"
        if self._going_ahead(gpu, now) is nxt:
            owed = [c.pool for c in gpu.waiters.heads().values() if c.pool != nxt.pool]
            return (f"a light request: goes once ahead of pool {', '.join(sorted(owed))}'s "
                    f"turn, for at most {JUMP_QUANTUM:g} s")
        if self.below_guarantee(gpu, nxt, now):
            return f"pool {nxt.pool} is below its guarantee"
        if self.starved(nxt):
            return (f"passed over {self.passed.get(nxt.id, 0)} times: served in request "
                    "order now")
        others = [c for c in gpu.waiters.values() if c.id != nxt.id]
        used = self.attained(nxt.id, now)
        if not others:
            return f"the only request waiting ({used:.0f} s of GPU time recently)"
        least = min(self.attained(c.id, now) for c in others)
        if used <= least:
            return (f"least GPU time recently: {used:.0f} s, others waiting {least:.0f} s or "
                    f"more (half-life {self.settings.half_life:g} s)")
        return f"pool {nxt.pool} is furthest below its entitlement"


def _rank(client: Client) -> tuple[int, int]:
    return PRIORITY_RANK[client.priority], client.request_order
