"""Memory tiers in the sans-I/O core (feature ``tiers``), with an injected clock.

An idle evicted client is asked to spill its host copy to disk once it has been evicted for
``spill_after``, or sooner while the node's host use exceeds its budget (longest idle first); a
move that failed is shown and not asked again until the client's figures change. An intent
brings memory a tier closer: disk to host at once, host to GPU when it fits beside the holders,
else when room appears, and never by taking the GPU or asking anyone to evict. Pin budgets
share what the host budget leaves among the clients on the GPU, most recently used first.
"""

from __future__ import annotations

from nodeside.config import SchedulerConfig
from nodeside.model import EVICTED, RESIDENT, MemoryFigures, Registration
from nodeside.scheduler.clients import WaitingFor
from nodeside.scheduler.core import (
    Evict,
    Fetch,
    GpuSpec,
    Grant,
    PinBudget,
    Refuse,
    Scheduler,
    SchedulerError,
    Spill,
    TierMoved,
)
from nodeside.scheduler.status import build_status
from nodeside.scheduler.tiers import STAGING_RING, tier

GiB = 1 << 30
MiB = 1 << 20
AFTER = 600.0


def make(capacity: int | None = 10 * GiB, host_budget: int | None = None,
         spill_after: float = AFTER, pin_budget: int | None = None,
         tier_timeout: float = 300.0) -> Scheduler:
    config = SchedulerConfig(tq=30.0, mode="on", memory_reserve=0, checkpoint_after=0,
                             host_budget=host_budget, spill_after=spill_after,
                             pin_budget=pin_budget, tier_timeout=tier_timeout)
    return Scheduler(config, [GpuSpec(0, memory_total=capacity)], now=0.0)


def client(s: Scheduler, name: str, working_set: int, *, tiers: bool = True) -> str:
    c = s.register(0.0, Registration(name=name, working_set=working_set, evict="vmm"))
    s.track_memory(c.id, MemoryFigures(resident=0, host=0))
    if tiers:
        s.track_tiers(c.id)
    return c.id


def evicted_at(s: Scheduler, c: str, now: float, nbytes: int) -> list:
    """``c`` held the GPU, filled ``nbytes`` and was evicted to host memory at ``now``."""
    assert Grant(c, 0, 30.0) in s.acquire(now - 2.0, c)
    s.report_working_set(now - 2.0, c, nbytes, MemoryFigures(resident=nbytes, host=0))
    s.release(now - 1.0, c, evicting=True)
    return s.evicted(now, c, MemoryFigures(resident=0, host=nbytes))


def of(kind: type, actions: list) -> list:
    return [a for a in actions if isinstance(a, kind)]


def test_an_evicted_client_idle_for_spill_after_is_asked_to_spill() -> None:
    s = make()
    a = client(s, "nbA", 4 * GiB)
    evicted_at(s, a, 10.0, 4 * GiB)
    assert tier(s.clients[a]) == "host"
    assert s.next_deadline(11.0) == 10.0 + AFTER
    assert of(Spill, s.tick(10.0 + AFTER - 1.0)) == []
    assert of(Spill, s.tick(10.0 + AFTER)) == [Spill(a, 0, None, "idle")]
    assert tier(s.clients[a]) == "moving"
    assert of(Spill, s.tick(10.0 + AFTER + 5.0)) == []  # asked once, not on every tick
    # Progress, then the end: its memory is on disk, nothing of it in host memory.
    s.tier_figures(a, 2 * GiB, None)
    actions = s.tier_moved(700.0, a, "disk", host=0, disk=4 * GiB, moved=4 * GiB, seconds=3.0)
    assert TierMoved(a, 0, "disk", 4 * GiB, 3.0, None) in actions
    assert tier(s.clients[a]) == "disk" and s.clients[a].residency is EVICTED


def test_a_failed_spill_is_shown_and_not_asked_again_until_the_figures_change() -> None:
    s = make()
    a = client(s, "nbA", 4 * GiB)
    evicted_at(s, a, 10.0, 4 * GiB)
    assert of(Spill, s.tick(10.0 + AFTER)) == [Spill(a, 0, None, "idle")]
    s.tier_moved(611.0, a, "host", host=4 * GiB, disk=0, failed="disk full")
    tiering = s.clients[a].tiering
    assert tiering is not None and tiering.failed == "disk full"
    assert tier(s.clients[a]) == "host"
    assert of(Spill, s.tick(2000.0)) == []
    assert of(Spill, s.report_working_set(2001.0, a, 4 * GiB, MemoryFigures(
        resident=0, host=4 * GiB))) == []  # the same figures again: still not asked
    assert of(Spill, s.report_working_set(2002.0, a, 4 * GiB, MemoryFigures(
        resident=0, host=3 * GiB))) == [Spill(a, 0, None, "idle")]


def test_a_short_host_budget_spills_the_longest_idle_first_and_only_as_many_as_needed() -> None:
    s = make(capacity=20 * GiB, host_budget=7 * GiB, spill_after=0)
    a, b, c = (client(s, n, 4 * GiB) for n in ("nbA", "nbB", "nbC"))
    assert of(Spill, evicted_at(s, a, 10.0, 3 * GiB)) == []
    assert of(Spill, evicted_at(s, b, 20.0, 3 * GiB)) == []
    # 9 GiB in host memory, 2 over the budget: the longest idle (a) frees 3, enough.
    assert of(Spill, evicted_at(s, c, 30.0, 3 * GiB)) == [Spill(a, 0, None, "budget")]
    # spill_after 0: never for idling alone; only a's spill may run out of tier_timeout.
    assert s.next_deadline(31.0) == 30.0 + 300.0


def test_an_intent_brings_memory_from_disk_then_on_to_the_gpu_where_it_fits() -> None:
    s = make()
    a = client(s, "nbA", 4 * GiB)
    evicted_at(s, a, 10.0, 4 * GiB)
    s.tick(10.0 + AFTER)
    s.tier_moved(620.0, a, "disk", host=0, disk=4 * GiB)
    assert s.intent(700.0, a, "execute") == [Fetch(a, 0, "host")]
    assert s.intent(700.5, a, "execute") == []  # on its way already
    actions = s.tier_moved(705.0, a, "host", host=4 * GiB, disk=0, moved=4 * GiB, seconds=2.0)
    assert of(Fetch, actions) == [Fetch(a, 0, "gpu")]


def test_a_front_intent_brings_memory_from_disk_only() -> None:
    s = make()
    a = client(s, "nbA", 4 * GiB)
    evicted_at(s, a, 10.0, 4 * GiB)
    assert s.intent(20.0, a, "front") == []  # in host memory: a notebook in view runs nothing
    s.tick(10.0 + AFTER)
    s.tier_moved(620.0, a, "disk", host=0, disk=4 * GiB)
    assert s.intent(700.0, a, "front") == [Fetch(a, 0, "host")]
    assert of(Fetch, s.tier_moved(705.0, a, "host", host=4 * GiB, disk=0)) == []


def test_an_intent_never_takes_room_and_waits_for_it() -> None:
    s = make(capacity=10 * GiB)
    a, b = client(s, "nbA", 6 * GiB), client(s, "nbB", 6 * GiB)
    evicted_at(s, a, 10.0, 6 * GiB)
    assert Grant(b, 0, 30.0) in s.acquire(20.0, b)
    s.report_working_set(20.0, b, 6 * GiB, MemoryFigures(resident=6 * GiB, host=0))
    # b holds 6 of 10 GiB: a's 6 do not fit beside; the hint asks nobody to evict.
    actions = s.intent(30.0, a, "execute")
    assert actions == [] and of(Evict, s.tick(31.0)) == []
    assert s.clients[b].state == "holding"
    # b goes away: the room appears, and the intent waiting is acted on.
    assert of(Fetch, s.unregister(40.0, b)) == [Fetch(a, 0, "gpu")]


def test_the_restore_of_a_client_on_disk_ends_only_when_nothing_is_left_on_disk() -> None:
    s = make()
    a = client(s, "nbA", 4 * GiB)
    evicted_at(s, a, 10.0, 4 * GiB)
    s.tick(10.0 + AFTER)
    s.tier_moved(620.0, a, "disk", host=0, disk=4 * GiB)
    s.acquire(700.0, a)
    s.report_working_set(701.0, a, 4 * GiB, MemoryFigures(resident=GiB, host=0, disk=3 * GiB))
    assert tier(s.clients[a]) == "moving"
    s.report_working_set(702.0, a, 4 * GiB, MemoryFigures(resident=4 * GiB, host=0, disk=0))
    assert tier(s.clients[a]) == "gpu"


def test_pin_budgets_share_the_host_budget_most_recently_used_first() -> None:
    s = make(capacity=40 * GiB, host_budget=10 * GiB)
    a, b, c = (client(s, n, 6 * GiB) for n in ("nbA", "nbB", "nbC"))
    for now, who in ((10.0, a), (20.0, b), (30.0, c)):
        s.acquire(now, who)
        s.report_working_set(now, who, 6 * GiB, MemoryFigures(resident=6 * GiB, host=0))
        s.release(now + 1.0, who)
    actions = s.tick(40.0)
    told = {x.client: x.nbytes for x in of(PinBudget, actions)}
    budgets = {k: s.clients[k].tiering.pin_budget for k in (a, b, c)}  # type: ignore[union-attr]
    # The most recent gets its whole working set and its staging ring pinned ahead.
    assert budgets == {c: 6 * GiB + STAGING_RING, b: 4 * GiB - STAGING_RING, a: 0}
    assert all(told.get(k, budgets[k]) == budgets[k] for k in budgets)
    assert sum(budgets.values()) <= 10 * GiB


def test_a_move_needs_the_tiers_feature_and_a_known_tier() -> None:
    s = make()
    a = client(s, "nbA", 4 * GiB, tiers=False)
    b = client(s, "nbB", 4 * GiB)
    for call in (lambda: s.tier_moved(1.0, a, "disk"), lambda: s.intent(1.0, a, "execute"),
                 lambda: s.tier_moved(1.0, b, "tape"), lambda: s.intent(1.0, b, "whim")):
        try:
            call()
        except SchedulerError:
            continue
        raise AssertionError("accepted")


def test_an_eviction_waits_for_spills_to_make_host_room_and_then_goes_out() -> None:
    s = make(capacity=10 * GiB, host_budget=8 * GiB, spill_after=0)
    a, b, c = (client(s, n, 6 * GiB) for n in ("nbA", "nbB", "nbC"))
    evicted_at(s, a, 10.0, 6 * GiB)  # 6 of 8 GiB of host memory taken
    assert of(Spill, s.tick(11.0)) == []
    s.acquire(20.0, b)
    s.report_working_set(20.0, b, 6 * GiB, MemoryFigures(resident=6 * GiB, host=0))
    s.release(21.0, b)
    # c needs b's 6 GiB moved out: 2 GiB of headroom, so a spills first and b waits to be asked.
    actions = s.acquire(30.0, c)
    assert of(Evict, actions) == [] and of(Spill, actions) == [Spill(a, 0, None, "budget")]
    assert s.clients[c].state == "waiting"
    actions = s.tier_moved(35.0, a, "disk", host=0, disk=6 * GiB)
    assert of(Evict, actions) == [Evict(b, 0, 6 * GiB, "nbC")]


def test_a_waiter_whose_evictions_wait_for_a_spill_says_so() -> None:
    s = make(capacity=10 * GiB, host_budget=8 * GiB, spill_after=0)
    a, b, c = (client(s, n, 6 * GiB) for n in ("nbA", "nbB", "nbC"))
    evicted_at(s, a, 10.0, 6 * GiB)
    s.acquire(20.0, b)
    s.report_working_set(20.0, b, 6 * GiB, MemoryFigures(resident=6 * GiB, host=0))
    s.release(21.0, b)
    s.acquire(30.0, c)
    assert s.clients[c].waiting_for == WaitingFor(a, "nbA", 6 * GiB, "spill")
    waiter = next(e for e in build_status(s, 31.0)["clients"] if e["id"] == c)
    assert waiter["waiting_for"] == {"client": a, "name": "nbA", "bytes": 6 * GiB,
                                     "action": "spill"}
    s.tier_moved(35.0, a, "disk", host=0, disk=6 * GiB)  # b is asked to evict now
    assert s.clients[c].waiting_for == WaitingFor(b, "nbB", 6 * GiB, "evict")


def test_an_eviction_the_host_budget_cannot_hold_is_refused_with_the_reason() -> None:
    s = make(capacity=10 * GiB, host_budget=4 * GiB, spill_after=0)
    b, c = client(s, "nbB", 6 * GiB), client(s, "nbC", 6 * GiB)
    s.acquire(20.0, b)
    s.report_working_set(20.0, b, 6 * GiB, MemoryFigures(resident=6 * GiB, host=0))
    s.release(21.0, b)
    refused = of(Refuse, s.acquire(30.0, c))
    assert len(refused) == 1 and "host budget (4.0 GiB) has 4.0 GiB left" in refused[0].message
    assert s.clients[b].residency is RESIDENT


def test_a_spill_without_progress_for_tier_timeout_is_given_up_and_shown() -> None:
    s = make(spill_after=AFTER, tier_timeout=60.0)
    a = client(s, "nbA", 4 * GiB)
    evicted_at(s, a, 10.0, 4 * GiB)
    assert of(Spill, s.tick(10.0 + AFTER)) == [Spill(a, 0, None, "idle")]
    assert s.next_deadline(10.0 + AFTER) == 10.0 + AFTER + 60.0
    # 128 MiB on disk at 640: the timeout runs from there.
    s.report_working_set(640.0, a, 4 * GiB, MemoryFigures(resident=0, host=4 * GiB - 128 * MiB,
                                                          disk=128 * MiB))
    assert of(TierMoved, s.tick(699.0)) == [] and tier(s.clients[a]) == "moving"
    given_up = of(TierMoved, s.tick(700.0))
    assert len(given_up) == 1 and given_up[0].failed is not None
    assert "made no progress for 60 s" in given_up[0].failed
    assert tier(s.clients[a]) == "host"
    entry = next(e for e in build_status(s, 700.0)["clients"] if e["id"] == a)
    assert "made no progress for 60 s and was given up" in entry["tier_failed"]


def test_a_move_given_up_is_not_asked_again_before_its_backoff_which_doubles() -> None:
    s = make(spill_after=AFTER, tier_timeout=60.0)
    a = client(s, "nbA", 4 * GiB)
    evicted_at(s, a, 10.0, 4 * GiB)
    s.tick(610.0)  # asked to spill; never reports
    assert of(TierMoved, s.tick(670.0))  # given up; backoff 60 s
    assert s.next_deadline(670.0) == 730.0
    assert of(Spill, s.tick(729.0)) == []
    assert of(Spill, s.tick(730.0)) == [Spill(a, 0, None, "idle")]
    assert of(TierMoved, s.tick(790.0))  # given up again; backoff 120 s
    assert of(Spill, s.tick(909.0)) == []
    assert of(Spill, s.tick(910.0)) == [Spill(a, 0, None, "idle")]


def test_a_spill_given_up_no_longer_holds_the_evictions_that_waited_for_it() -> None:
    s = make(capacity=10 * GiB, host_budget=8 * GiB, spill_after=0, tier_timeout=60.0)
    a, b, c = (client(s, n, 6 * GiB) for n in ("nbA", "nbB", "nbC"))
    evicted_at(s, a, 10.0, 6 * GiB)
    s.acquire(20.0, b)
    s.report_working_set(20.0, b, 6 * GiB, MemoryFigures(resident=6 * GiB, host=0))
    s.release(21.0, b)
    assert of(Spill, s.acquire(30.0, c)) == [Spill(a, 0, None, "budget")]
    assert s.clients[c].waiting_for is not None and s.clients[c].waiting_for.action == "spill"
    # a's disk hangs: nothing else can spill, so c is told the room cannot be made.
    refused = of(Refuse, s.tick(90.0))
    assert len(refused) == 1 and refused[0].client == c
    assert "nothing more to spill to disk" in refused[0].message
    assert s.clients[b].residency is RESIDENT


def test_a_tier_timeout_of_0_never_gives_a_move_up() -> None:
    s = make(spill_after=AFTER, tier_timeout=0)
    a = client(s, "nbA", 4 * GiB)
    evicted_at(s, a, 10.0, 4 * GiB)
    s.tick(610.0)
    assert s.next_deadline(610.0) is None
    assert of(TierMoved, s.tick(10**6)) == [] and tier(s.clients[a]) == "moving"


def test_an_eviction_into_shadows_already_pinned_is_never_refused_for_host_room() -> None:
    """Its host copy is the memory it pinned ahead: it takes nothing more of the budget, even
    while pins over the budget wait to be given back (the 8-kernel benchmark's refusal that
    "needs 0 B of host memory")."""
    s = make(capacity=10 * GiB, host_budget=4 * GiB, spill_after=0)
    b, c = client(s, "nbB", 6 * GiB), client(s, "nbC", 6 * GiB)
    s.acquire(20.0, b)
    s.report_working_set(20.0, b, 6 * GiB, MemoryFigures(resident=6 * GiB, host=0,
                                                         pinned=6 * GiB + STAGING_RING))
    s.release(21.0, b)
    actions = s.acquire(30.0, c)
    assert of(Refuse, actions) == [] and of(Evict, actions) == [Evict(b, 0, 6 * GiB, "nbC")]


def test_evictions_the_host_budget_holds_only_one_by_one_go_out_between_spills() -> None:
    """Three idle clients on the card, host room for two working sets and nothing evicted yet
    (so nothing to spill): two are asked now, the third once a spill made room; the waiter is
    never refused (the 4-kernel host-budget test's first turn was, again and again)."""
    s = make(capacity=10 * GiB, host_budget=4 * GiB, spill_after=0)
    idle = [client(s, f"nb{i}", 2 * GiB) for i in range(3)]
    for i, c in enumerate(idle):
        s.report_working_set(float(i), c, 2 * GiB, MemoryFigures(resident=2 * GiB, host=0))
    w = client(s, "nbW", 10 * GiB)
    actions = s.acquire(10.0, w)
    assert of(Refuse, actions) == []
    asked = [e.client for e in of(Evict, actions)]
    assert asked == idle[:2] and s.clients[w].state == "waiting"
    actions = []
    for c in asked:
        actions += s.evicted(11.0, c, MemoryFigures(resident=0, host=2 * GiB))
    spills = of(Spill, actions)
    assert len(spills) == 1 and of(Evict, actions) == []  # the third waits for the host room
    actions = s.tier_moved(12.0, spills[0].client, "disk", host=0, disk=2 * GiB)
    assert of(Evict, actions) == [Evict(idle[2], 0, 2 * GiB, "nbW")]
    s.evicted(13.0, idle[2], MemoryFigures(resident=0, host=2 * GiB))
    assert s.clients[w].state == "holding"
