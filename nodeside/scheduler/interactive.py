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
  differ by at most SHARE_TOLERANCE; a LOW request never cuts a quantum short;
- never switching at a loss: a holder's quantum is cut short only for a client that used at
  most CUT_RATIO of the holder's recent GPU time, only after ``first_quantum`` or COST_FACTOR
  times the time moving both working sets would take, whichever is longer, and only when the
  wait that saves is longer than moving the memory there and back. Working sets are the ones
  clients report; an unknown one counts as the whole GPU, as in mode auto.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
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

    def choose(self, heads: list[Client], owed: Callable[[Client], bool],
               shortfall: Mapping[str, float], now: float) -> Client:
        """Between pools' heads: a request owed its guarantee first; then a pool more than
        SHARE_TOLERANCE further below its entitlement than the pool least behind, the furthest
        first; then least attained service. Weights are honoured over the share window, within
        the tolerance, rather than at every handoff: a short cell of a pool slightly ahead need
        not wait for the other pool's long one. (Shortfalls are compared with each other, not
        with zero: while the GPU idles at times, every pool is below its entitlement.)"""
        least = min(shortfall[c.pool] for c in heads)

        def urgency(c: Client) -> tuple[bool, float, bool, float, int]:
            short = shortfall[c.pool] - least
            behind = short if short > SHARE_TOLERANCE else 0.0
            starved = self.starved(c)
            used = 0.0 if starved else self.attained(c.id, now)
            return owed(c), behind, starved, -used, -c.request_order
        return max(heads, key=urgency)

    def pick(self, gpu: GpuState, now: float, tail: Client | None = None) -> Client | None:
        """As ``PoolsPolicy.pick`` (maximums, guarantees), with ``heads``, ``before`` and
        ``choose`` ordering by least attained service."""
        heads = self.heads(gpu, now)
        if tail is not None:
            best = heads.get(tail.pool)
            if best is None or self.before(tail, best, now):
                heads[tail.pool] = tail
        if not heads:
            return None
        shares = gpu.meter.shares(now, heads)
        eligible = [c for name, c in heads.items()
                    if not self.over_maximum(gpu, name, now, shares)]
        if len(eligible) <= 1:
            return next(iter(eligible), None)
        ent = entitlements(self.scheduler.pool(name) for name in contending_pools(gpu))
        return self.choose(eligible, lambda c: self.below_guarantee(gpu, c, now),
                           {c.pool: ent.get(c.pool, 0.0) - shares.get(c.pool, 0.0)
                            for c in eligible}, now)

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
        return [entry[3] for entry in ranked]

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
            return tq
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
