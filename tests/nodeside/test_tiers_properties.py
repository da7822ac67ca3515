"""Hypothesis explores the core with clients that speak the ``tiers`` feature.

Random clients on one GPU with room for some of them, under a random host budget, ask, give
back evicting, end their evictions with random host figures, report random host, pinned and
disk figures, end the spills they were asked for (or fail them), and send hints, while time
passes. Whatever they report, after every step:

* the pin budgets told to the clients on the GPU, with the host copies already there, stay
  within the host budget (as far as the host copies themselves leave any room);
* while host use exceeds the budget, the spills asked cover the excess, or nobody is left who
  could be asked (idle, evicted, in host memory, nothing under way, no failure standing);
* a hint never grants, drops, revokes or asks anyone to evict; it asks for the GPU tier only
  when the client's memory fits there beside the holders and what idle clients keep.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nodeside.config import SchedulerConfig
from nodeside.model import EVICTING, RESIDENT, MemoryFigures, Registration
from nodeside.scheduler.core import Drop, Evict, Fetch, GpuSpec, Grant, Revoke, Scheduler
from nodeside.scheduler.ledger import need

GiB = 1 << 30
CAPACITY = 10 * GiB

specs = st.lists(st.sampled_from([2, 3, 4, 6]), min_size=2, max_size=5)
steps = st.lists(st.tuples(st.sampled_from(["acquire", "evicting", "evicted", "report",
                                            "spilled", "failed", "intent", "front", "wait"]),
                           st.integers(0, 4), st.integers(0, 8), st.floats(0.1, 400.0)),
                 max_size=40)


def host_copies(s: Scheduler) -> int:
    return sum(c.host_bytes for c in s.clients.values() if c.memory and c.residency is not RESIDENT)


def check(s: Scheduler, budget: int, now: float) -> None:
    tiered = [c for c in s.clients.values() if c.tiering is not None]
    on_gpu = sum(c.tiering.pin_budget or 0 for c in tiered  # type: ignore[union-attr]
                 if c.residency is RESIDENT)
    assert on_gpu <= max(0, budget - host_copies(s))
    rules = s._tiers
    excess = rules.excess()
    if excess > 0:
        spilling = sum(c.host_bytes for c in tiered
                       if c.tiering.moving == "spill")  # type: ignore[union-attr]
        assert spilling >= excess or not rules._spillable(now)


@settings(max_examples=150, deadline=None)
@given(specs, steps, st.sampled_from([2, 4, 8, 16]))
def test_host_use_is_planned_within_the_budget_whatever_the_clients_report(
        sizes: list[int], plan: list[tuple[str, int, int, float]], budget_gib: int) -> None:
    budget = budget_gib * GiB
    config = SchedulerConfig(tq=30.0, mode="on", memory_reserve=0, checkpoint_after=0,
                             host_budget=budget, spill_after=300.0, evict_timeout=5.0)
    s = Scheduler(config, [GpuSpec(0, memory_total=CAPACITY)], now=0.0)
    ids = []
    for i, gib in enumerate(sizes):
        c = s.register(0.0, Registration(name=f"c{i}", working_set=gib * GiB, evict="vmm"))
        s.track_memory(c.id, MemoryFigures(resident=0, host=0))
        s.track_tiers(c.id)
        ids.append(c.id)
    now = 0.0
    for what, who, gib, dt in plan:
        now += dt
        deadline = s.next_deadline(now)
        if deadline is not None and deadline <= now:
            s.tick(now)  # the daemon's timer fired on the way (a backoff ended, a move stalled)
        c = ids[who % len(ids)]
        client = s.clients[c]
        nbytes = gib * GiB
        if what == "acquire" and client.state == "idle":
            if any(isinstance(a, Grant) and a.client == c for a in s.acquire(now, c)):
                s.report_working_set(now, c, client.working_set or 0,
                                     MemoryFigures(resident=min(nbytes, CAPACITY), host=0))
        elif what == "evicting" and client.state == "holding":
            s.release(now, c, evicting=True)
        elif what == "evicted" and client.state == "idle" and client.residency in (
                EVICTING, RESIDENT):
            s.evicted(now, c, MemoryFigures(resident=0, host=nbytes), moved=nbytes)
        elif what == "report":
            s.report_working_set(now, c, client.working_set or 0, MemoryFigures(
                host=nbytes, pinned=nbytes, disk=nbytes // 2))
        elif what in ("spilled", "failed") and client.tiering is not None and \
                client.tiering.moving is not None:
            if what == "spilled":
                s.tier_moved(now, c, "disk", host=0, disk=client.host_bytes)
            else:
                s.tier_moved(now, c, "host", failed="disk full")
        elif what in ("intent", "front"):
            fits_before = _fits(s, c)
            actions = s.intent(now, c, "execute" if what == "intent" else "front")
            assert not [a for a in actions if isinstance(a, (Grant, Drop, Revoke, Evict))]
            if Fetch(c, 0, "gpu") in actions:
                assert fits_before
        else:
            s.tick(now)
        check(s, budget, now)


def _fits(s: Scheduler, client_id: str) -> bool:
    client = s.clients[client_id]
    ledger = s.gpus[0].ledger
    wanted = max(need(client), client.host_bytes)
    return ledger.holders_need(client) + ledger.idle_except(client) + wanted <= CAPACITY
