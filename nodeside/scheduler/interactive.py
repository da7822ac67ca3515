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
  broken (``light``);
- never switching at a loss: a holder's quantum is cut short only for a client that used at
  most CUT_RATIO of the holder's recent GPU time, only after ``first_quantum`` or COST_FACTOR
  times the time moving both working sets would take, whichever is longer, and only when the
  wait that saves is longer than moving the memory there and back. Working sets are the ones
  clients report; an unknown one counts as the whole GPU, as in mode auto.

The policy composes its parts, each a module of its own: what a client used (``attained``),
the light request that goes ahead of a pool's rule (``light``), and ``light_first``, the
component the core consults for the GPU's time to the light (a quantum cut short, priced by
``pricing``; stepping aside in mode auto; taking turns). The order within and between pools, and
why the next holder is next, are here; what happens comes in as events (``observe``).
"""

from __future__ import annotations

from collections.abc import Mapping

from nodeside.config import InteractiveSettings
from nodeside.model import POLICY_INTERACTIVE
from nodeside.scheduler.attained import CUT_RATIO, GOES_ON_WITHIN, AttainedService
from nodeside.scheduler.choosing import PoolsPolicy, contending_pools
from nodeside.scheduler.gpu_state import PRIORITY_RANK, ClientRecord, GpuState
from nodeside.scheduler.light import JUMP_QUANTUM, LightRequests, Ranking
from nodeside.scheduler.light_first import LightFirst
from nodeside.scheduler.pools import entitlements
from nodeside.scheduler.pricing import COST_FACTOR
from nodeside.scheduler.view import (
    Event,
    Gone,
    Granted,
    HoldEnded,
    Kept,
    Paused,
    PolicyView,
    Resumed,
)

# The rules' constants live with their rules; named here too, as tests and benchmarks read them.
__all__ = ["COST_FACTOR", "CUT_RATIO", "GOES_ON_WITHIN", "JUMP_QUANTUM", "SHARE_TOLERANCE",
           "InteractivePolicy"]

#: How far below its entitlement (a fraction of the GPU's time, over the share window) a pool
#: may fall before the pools' order overrides least attained service between pools.
SHARE_TOLERANCE = 0.05


class InteractivePolicy(PoolsPolicy, Ranking):
    name = POLICY_INTERACTIVE
    observes = True

    def __init__(self, view: PolicyView, service: AttainedService | None = None) -> None:
        """``service``: what the order measures clients by; what they used, unless told."""
        super().__init__(view)
        self.service = service if service is not None else AttainedService(view)
        self.light = LightRequests(self, self.service)
        self.light_first = LightFirst(view, self.service, self.light)
        #: Client id -> times passed over by a later request of its pool and priority, this wait.
        self.passed: dict[str, int] = {}

    @property
    def settings(self) -> InteractiveSettings:
        return self.view.settings.interactive  # read each time: SIGHUP may change it

    # -- what a client used (attained.py) -------------------------------------------------

    def attained(self, client_id: str, now: float) -> float:
        return self.service.attained(client_id, now)

    def request_seconds(self, client_id: str) -> float:
        return self.service.request_seconds(client_id)

    def request_work(self, client_id: str, now: float) -> float:
        return self.service.request_work(client_id, now)

    # -- what happened --------------------------------------------------------------------

    def observe(self, event: Event) -> None:
        client, now = event.client, event.now
        if isinstance(event, Granted):
            self._granted(event.gpu, client, now)
        elif isinstance(event, HoldEnded):
            self.light.hold_ends(client)
            self.service.hold_ends(client, now)
        elif isinstance(event, Paused):
            self.service.pause(client.id, now)
        elif isinstance(event, Resumed):
            self.service.resume(client.id, now)
        elif isinstance(event, Kept):
            # The holder won again at its quantum's end: everyone waiting in its lane was passed.
            for waiter in self._lane(event.gpu, client):
                self.passed[waiter.id] = self.passed.get(waiter.id, 0) + 1
        elif isinstance(event, Gone):
            self.service.forget(client.id)
            self.passed.pop(client.id, None)
            self.light.forget(client.id)
            self._light_first().forget(client.id)

    def _granted(self, gpu: GpuState, client: ClientRecord, now: float) -> None:
        self.service.granting(client.id)
        self.light.granted(gpu, client, now)  # before its hold counts: still fresh
        self.service.hold_starts(client.id, now)
        self._light_first().granted(gpu, client, now)
        self.passed.pop(client.id, None)
        for waiter in self._lane(gpu, client):
            if waiter.request_order < client.request_order:
                self.passed[waiter.id] = self.passed.get(waiter.id, 0) + 1

    def _light_first(self) -> LightFirst:
        rules = self.light_first
        assert rules is not None
        return rules

    # -- the order ------------------------------------------------------------------------

    def starved(self, client: ClientRecord) -> bool:
        return self.passed.get(client.id, 0) >= self.settings.pass_bound

    def _key(self, client: ClientRecord, now: float) -> tuple[int, bool, float, int]:
        starved = self.starved(client)
        used = 0.0 if starved else self.service.attained(client.id, now)
        return _rank(client)[0], not starved, used, client.request_order

    def heads(self, gpu: GpuState, now: float) -> dict[str, ClientRecord]:
        heads: dict[str, ClientRecord] = {}
        for pool, first in gpu.waiters.heads().items():
            lane = [c for c in gpu.waiters.in_order(pool) if c.priority == first.priority]
            heads[pool] = min(lane, key=lambda c: self._key(c, now))
        return heads

    def in_order(self, gpu: GpuState, pool: str, now: float) -> list[ClientRecord]:
        return sorted(gpu.waiters.in_order(pool), key=lambda c: self._key(c, now))

    def before(self, tail: ClientRecord, head: ClientRecord, now: float) -> bool:
        return self._key(tail, now) < self._key(head, now)

    def pick(self, gpu: GpuState, now: float,
             tail: ClientRecord | None = None) -> ClientRecord | None:
        """As ``PoolsPolicy.pick`` (maximums, guarantees), with ``heads`` and ``before``
        ordering each pool by least attained service, ``by_rules`` between pools, and a light
        request going ahead of a pool's rule once (``light``)."""
        heads = self.heads(gpu, now)
        if tail is not None:
            best = heads.get(tail.pool)
            if best is None or self.before(tail, best, now):
                heads[tail.pool] = tail
        best, by_rule, eligible = self.by_rules(gpu, heads, now)
        if best is None or not by_rule:
            return best
        return self.light.over(gpu, best, eligible, now) or best

    def by_rules(self, gpu: GpuState, heads: Mapping[str, ClientRecord],
                 now: float) -> tuple[ClientRecord | None, bool, list[ClientRecord]]:
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
        ent = entitlements(self.view.pool(name) for name in contending_pools(gpu))
        shortfall = {c.pool: ent.get(c.pool, 0.0) - shares.get(c.pool, 0.0) for c in eligible}
        least = min(shortfall.values())

        def urgency(c: ClientRecord) -> tuple[bool, float, bool, float, int]:
            short = shortfall[c.pool] - least
            behind = short if short > SHARE_TOLERANCE else 0.0
            starved = self.starved(c)
            used = 0.0 if starved else self.service.attained(c.id, now)
            return self.below_guarantee(gpu, c, now), behind, starved, -used, -c.request_order
        # Each head ranked once, the winner's rank kept (``max``'s first-of-equals winner).
        best = eligible[0]
        top = urgency(best)
        for c in eligible[1:]:
            rank = urgency(c)
            if rank > top:
                best, top = c, rank
        return best, bool(top[0] or top[1]), eligible

    def order(self, gpu: GpuState, now: float) -> list[ClientRecord]:
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
        light = self.light.going_ahead(gpu, now)
        if light is not None:  # it goes next: shown first, like the grant that will follow
            order.remove(light)
            order.insert(0, light)
        return order

    def position(self, gpu: GpuState, client: ClientRecord, now: float) -> int:
        return [c.id for c in self.order(gpu, now)].index(client.id) + 1

    def _lane(self, gpu: GpuState, client: ClientRecord) -> list[ClientRecord]:
        return [w for w in gpu.waiters.in_order(client.pool)
                if w.priority == client.priority and w.id != client.id]

    def reason(self, gpu: GpuState, nxt: ClientRecord, now: float) -> str:
        """Why ``nxt`` goes next, for the status document: the first rule that decided."""
        promised = {h.hold.drop_incoming for h in gpu.holders.values() if h.hold}
        if nxt.id in promised or gpu.promised == nxt.id:
            return "the holder was asked to leave for it"
        if self.light.going_ahead(gpu, now) is nxt:
            owed = [c.pool for c in gpu.waiters.heads().values() if c.pool != nxt.pool]
            return (f"a light request: goes once ahead of pool {', '.join(sorted(owed))}'s "
                    f"turn, for at most {JUMP_QUANTUM:g} s")
        if self._light_first().holds_back(gpu, nxt, now):
            tq = self.view.tq_for(gpu.spec.index)
            return (f"held back while a light request beside it has its turn: {tq:g} s at "
                    "most")
        if self.below_guarantee(gpu, nxt, now):
            return f"pool {nxt.pool} is below its guarantee"
        if self.starved(nxt):
            return (f"passed over {self.passed.get(nxt.id, 0)} times: served in request "
                    "order now")
        others = [c for c in gpu.waiters.values() if c.id != nxt.id]
        used = self.service.attained(nxt.id, now)
        if not others:
            return f"the only request waiting ({used:.0f} s of GPU time recently)"
        least = min(self.service.attained(c.id, now) for c in others)
        if used <= least:
            return (f"least GPU time recently: {used:.0f} s, others waiting {least:.0f} s or "
                    f"more (half-life {self.settings.half_life:g} s)")
        return f"pool {nxt.pool} is furthest below its entitlement"


def _rank(client: ClientRecord) -> tuple[int, int]:
    return PRIORITY_RANK[client.priority], client.request_order
