"""Resident memory in the sans-I/O core (feature ``memory``), with an injected clock.

Every "does it fit" counts the memory idle clients keep on the GPU; a grant that does not fit
beside it asks idle clients to evict first (LOW first, then least recently used, never a
holder), goes out when their reports say the room is there, and a client that does not answer
is checkpointed where the daemon reaches it, else it stops counting where only its claim says
it holds the memory, and the waiter is refused with who holds it where NVML says so. Clients
that do not speak the feature are scheduled as before.
"""

from __future__ import annotations

from nodeside.config import SchedulerConfig
from nodeside.model import EVICTED, EVICTING, RESIDENT, RESTORING, MemoryFigures, Registration
from nodeside.scheduler.core import (
    Drop,
    Evict,
    Evicted,
    GpuSpec,
    Grant,
    Refuse,
    Released,
    Restored,
    Scheduler,
    Suspend,
    Suspended,
    Uncounted,
    WaitingFor,
)

GiB = 1 << 30
TIMEOUT = 10.0
AFTER = 600.0


def make(capacity: int | None = 10 * GiB, mode: str = "on") -> Scheduler:
    config = SchedulerConfig(tq=30.0, mode=mode, memory_reserve=0, evict_timeout=TIMEOUT,
                             checkpoint_after=AFTER)
    return Scheduler(config, [GpuSpec(0, memory_total=capacity)], now=0.0)


def client(s: Scheduler, name: str, working_set: int, *, priority: str = "NORMAL",
           checkpointable: bool = False, evict: str = "vmm") -> str:
    c = s.register(0.0, Registration(name=name, working_set=working_set, priority=priority,
                                     evict=evict))
    s.track_memory(c.id, MemoryFigures(resident=0, host=0), checkpointable=checkpointable)
    return c.id


def used(s: Scheduler, c: str, now: float, nbytes: int) -> None:
    """``c`` holds the GPU and fills its working set, then gives it back (stays resident)."""
    assert Grant(c, 0, 30.0) in s.acquire(now, c)
    s.report_working_set(now, c, nbytes, MemoryFigures(resident=nbytes, host=0))
    s.release(now + 1.0, c)


def of(kind: type, actions: list) -> list:
    return [a for a in actions if isinstance(a, kind)]


def test_an_idle_client_is_asked_to_evict_before_a_grant_that_does_not_fit() -> None:
    s = make()
    a, b = client(s, "nbA", 6 * GiB), client(s, "nbB", 6 * GiB)
    used(s, a, 1.0, 6 * GiB)
    assert s.clients[a].residency == RESIDENT and s.clients[a].resident_bytes == 6 * GiB
    actions = s.acquire(5.0, b)
    assert actions == [Evict(a, 0, 6 * GiB, "nbB")]
    assert s.clients[b].state == "waiting" and s.clients[a].residency == EVICTING
    assert s.clients[b].waiting_for == WaitingFor(a, "nbA", 6 * GiB, "evict")
    # Progress: 4 GiB out, 2 GiB still on the GPU: 2 + 6 fits in 10, the grant goes out now.
    assert s.report_working_set(5.5, a, 6 * GiB, MemoryFigures(resident=2 * GiB, host=4 * GiB)) == \
        [Grant(b, 0, 30.0)]
    assert s.clients[b].waiting_for is None
    s.evicted(6.0, a, MemoryFigures(resident=0, host=6 * GiB))
    assert s.clients[a].residency == EVICTED and s.clients[a].host_bytes == 6 * GiB


def test_no_idle_client_is_asked_when_the_room_is_there() -> None:
    s = make(capacity=16 * GiB)
    a, b = client(s, "nbA", 6 * GiB), client(s, "nbB", 6 * GiB)
    used(s, a, 1.0, 6 * GiB)
    assert s.acquire(5.0, b) == [Grant(b, 0, 30.0)]
    assert s.clients[a].residency == RESIDENT


def test_low_goes_first_then_the_least_recently_used_and_only_as_much_as_is_missing() -> None:
    s = make(capacity=12 * GiB)
    old = client(s, "old", 3 * GiB)
    low = client(s, "low", 3 * GiB, priority="LOW")
    recent = client(s, "recent", 3 * GiB)
    newcomer = client(s, "new", 6 * GiB)
    used(s, old, 1.0, 3 * GiB)
    used(s, recent, 5.0, 3 * GiB)
    used(s, low, 9.0, 3 * GiB)
    # 9 GiB resident, 6 wanted, 12 there: 3 GiB missing, one eviction is enough.
    assert s.acquire(20.0, newcomer) == [Evict(low, 0, 3 * GiB, "new")]
    s.evicted(21.0, low, MemoryFigures(resident=0, host=3 * GiB))
    # Now it fits: granted; nobody else was asked.
    assert s.clients[newcomer].state == "holding"
    assert s.clients[old].residency == RESIDENT and s.clients[recent].residency == RESIDENT


def test_the_least_recently_used_goes_first_among_equals() -> None:
    s = make(capacity=12 * GiB)
    old, recent, newcomer = (client(s, n, 3 * GiB) for n in ("old", "recent", "new"))
    used(s, recent, 1.0, 3 * GiB)
    used(s, old, 5.0, 3 * GiB)  # used after "recent": "recent" is now the least recent
    s.report_working_set(6.0, newcomer, 8 * GiB)
    assert of(Evict, s.acquire(7.0, newcomer)) == [Evict(recent, 0, 3 * GiB, "new")]


def test_a_holder_is_never_asked_to_evict() -> None:
    s = make(capacity=10 * GiB, mode="auto")
    a, b = client(s, "nbA", 6 * GiB), client(s, "nbB", 6 * GiB)
    assert Grant(a, 0, 30.0) in s.acquire(1.0, a)
    s.report_working_set(1.0, a, 6 * GiB, MemoryFigures(resident=6 * GiB, host=0))
    actions = s.acquire(2.0, b)
    assert not of(Evict, actions) and s.clients[b].state == "waiting"


def test_a_release_with_evicting_ends_the_hold_and_counts_the_memory_until_it_is_out() -> None:
    s = make()
    a, b = client(s, "nbA", 6 * GiB), client(s, "nbB", 6 * GiB)
    assert Grant(a, 0, 30.0) in s.acquire(1.0, a)
    s.report_working_set(1.0, a, 6 * GiB, MemoryFigures(resident=6 * GiB, host=0))
    assert s.acquire(2.0, b) == []
    drops = of(Drop, s.tick(31.0))
    assert drops and drops[0].evict
    actions = s.release(31.5, a, evicting=True)
    assert actions == [Released(a, evict=True)]
    assert s.clients[a].residency == EVICTING and s.clients[b].state == "waiting"
    assert s.report_working_set(31.7, a, 6 * GiB,
                                MemoryFigures(resident=1 * GiB, host=5 * GiB)) == \
        [Grant(b, 0, 30.0)]


def test_an_evicted_client_restores_on_its_grant_until_a_report_says_host_zero() -> None:
    s = make()
    a = client(s, "nbA", 6 * GiB)
    used(s, a, 1.0, 6 * GiB)
    s.evicted(3.0, a, MemoryFigures(resident=0, host=6 * GiB))
    assert Grant(a, 0, 30.0) in s.acquire(4.0, a)
    assert s.clients[a].residency == RESTORING
    s.report_working_set(4.5, a, 6 * GiB, MemoryFigures(resident=6 * GiB, host=0))
    assert s.clients[a].residency == RESIDENT


def test_a_silent_client_that_cannot_be_checkpointed_stops_counting_and_the_waiter_goes_on(
        ) -> None:
    """Only its claim says it holds the memory (no NVML here): once it makes no progress for
    evict_timeout, the claim no longer counts against others' room (issue 40, N1)."""
    s = make()
    a, b = client(s, "nbA", 6 * GiB), client(s, "nbB", 6 * GiB)
    used(s, a, 1.0, 6 * GiB)
    assert of(Evict, s.acquire(5.0, b))
    assert s.next_deadline(5.0) == 5.0 + TIMEOUT
    assert s.tick(5.0 + TIMEOUT - 0.1) == []
    actions = s.tick(5.0 + TIMEOUT)
    [uncounted] = of(Uncounted, actions)
    assert (uncounted.client, uncounted.nbytes) == (a, 6 * GiB)
    assert uncounted.why == f"did not begin to evict within {TIMEOUT:g} s (evict_timeout)"
    assert Grant(b, 0, 30.0) in actions and s.clients[a].evict_failed


def test_a_silent_client_whose_memory_nvml_shows_gets_the_waiter_refused() -> None:
    """The memory is on the card by NVML's count: the waiter is told who holds it, once."""
    s = make()
    a, b = client(s, "nbA", 6 * GiB), client(s, "nbB", 6 * GiB)
    used(s, a, 1.0, 6 * GiB)
    s.memory_seen(2.0, {a: 6 * GiB, b: 0})
    assert of(Evict, s.acquire(5.0, b))
    refused = of(Refuse, s.tick(5.0 + TIMEOUT))
    assert len(refused) == 1 and refused[0].client == b and "nbA" in refused[0].message
    assert s.clients[b].state == "idle" and s.clients[a].evict_failed
    # Saying its figures again does not make it evictable: the next waiter hears at once.
    s.report_working_set(20.0, a, 6 * GiB, MemoryFigures(resident=6 * GiB, host=0))
    assert s.clients[a].evict_failed
    assert [r.client for r in of(Refuse, s.acquire(21.0, b))] == [b]


def test_a_silent_client_the_daemon_reaches_is_checkpointed() -> None:
    s = make()
    a = client(s, "nbA", 6 * GiB, checkpointable=True)
    b = client(s, "nbB", 6 * GiB)
    used(s, a, 1.0, 6 * GiB)
    s.acquire(5.0, b)
    assert s.tick(5.0 + TIMEOUT) == [Suspend(a, 0, "timeout")]
    assert s.clients[b].waiting_for == WaitingFor(a, "nbA", 6 * GiB, "checkpoint")
    assert s.checkpointed(20.0, a) == [Suspended(a, 0, 6 * GiB), Grant(b, 0, 30.0)]
    assert s.clients[a].residency == EVICTED and s.clients[a].host_bytes == 6 * GiB


def test_a_way_out_that_makes_progress_is_never_cut_short_by_its_deadline() -> None:
    """Issue 39 item 0b: a slow way out (pageable shadows, a large working set) reports every
    256 MiB; the deadline runs from its last report, so it is never checkpointed from outside
    in the middle of its own move."""
    s = make()
    a = client(s, "nbA", 6 * GiB, checkpointable=True)
    b = client(s, "nbB", 6 * GiB)
    used(s, a, 1.0, 6 * GiB)
    assert of(Evict, s.acquire(5.0, b))
    moved_at = 5.0
    for resident in (5.75, 5.5, 5.25, 5.0, 4.75):  # 9 s between reports, 45 s in all
        moved_at += TIMEOUT - 1.0
        assert s.report_working_set(moved_at, a, 6 * GiB,
                                    MemoryFigures(resident=int(resident * GiB),
                                                  host=6 * GiB - int(resident * GiB))) == []
        assert s.next_deadline(moved_at) == moved_at + TIMEOUT
        assert s.tick(moved_at + TIMEOUT - 0.5) == []
    assert s.clients[a].residency == EVICTING and s.clients[a].evict_failed is None
    half_out = MemoryFigures(resident=4 * GiB, host=2 * GiB)
    assert s.report_working_set(moved_at + 1.0, a, 6 * GiB, half_out) == [Grant(b, 0, 30.0)]


def test_a_way_out_that_stalls_midway_is_given_up_not_checkpointed() -> None:
    """A process checkpointed in the middle of its own move stops inside the driver with half
    its memory moved: the checkpoint fallback is for clients that never began (between moves).
    Given up, its claim no longer counts (no NVML here): the waiter is granted."""
    s = make()
    a = client(s, "nbA", 6 * GiB, checkpointable=True)
    b = client(s, "nbB", 6 * GiB)
    used(s, a, 1.0, 6 * GiB)
    s.acquire(5.0, b)
    s.report_working_set(6.0, a, 6 * GiB, MemoryFigures(resident=5 * GiB, host=1 * GiB))
    assert s.tick(6.0 + TIMEOUT - 0.1) == []
    actions = s.tick(6.0 + TIMEOUT)
    assert not of(Suspend, actions)
    assert [u.client for u in of(Uncounted, actions)] == [a] and Grant(b, 0, 30.0) in actions
    assert s.clients[a].residency == RESIDENT
    assert s.clients[a].evict_failed == f"made no progress evicting for {TIMEOUT:g} s " \
                                        f"(evict_timeout)"


def test_reports_that_move_nothing_do_not_put_the_deadline_off() -> None:
    """A client that only says where its memory is, and moves none of it, cannot hold the room
    for ever: its deadline runs from the ask; having begun, it is given up, not checkpointed."""
    s = make()
    a = client(s, "nbA", 6 * GiB, checkpointable=True)
    b = client(s, "nbB", 6 * GiB)
    used(s, a, 1.0, 6 * GiB)
    s.acquire(5.0, b)
    for at in (7.0, 9.0, 11.0, 13.0):  # the first says its way out began; none moves a byte
        s.report_working_set(at, a, 6 * GiB, MemoryFigures(resident=6 * GiB, host=0))
    assert s.next_deadline(13.0) == 5.0 + TIMEOUT
    actions = s.tick(5.0 + TIMEOUT)
    assert not of(Suspend, actions) and Grant(b, 0, 30.0) in actions
    assert s.clients[a].evict_failed == f"made no progress evicting for {TIMEOUT:g} s " \
                                        f"(evict_timeout)"


def test_a_checkpoint_client_is_suspended_at_once_instead_of_asked() -> None:
    s = make()
    a = client(s, "nbA", 6 * GiB, checkpointable=True, evict="checkpoint")
    b = client(s, "nbB", 6 * GiB)
    used(s, a, 1.0, 6 * GiB)
    assert s.acquire(5.0, b) == [Suspend(a, 0, "room")]


def test_the_room_that_cannot_be_made_is_refused_at_once() -> None:
    s = make(mode="auto")
    a, b = client(s, "nbA", 4 * GiB), client(s, "nbB", 8 * GiB)
    assert Grant(a, 0, 30.0) in s.acquire(1.0, a)
    s.report_working_set(1.0, a, 4 * GiB, MemoryFigures(resident=4 * GiB, host=0))
    s.memory_seen(1.5, {a: 4 * GiB, b: 0})
    s.release(2.0, a)
    s.evicted(3.0, a, failed="pinned allocations")
    refused = of(Refuse, s.acquire(4.0, b))
    assert [r.client for r in refused] == [b] and "pinned allocations" in refused[0].message


def test_a_failed_eviction_only_claimed_stops_counting_and_the_waiter_is_granted() -> None:
    s = make(mode="auto")
    a, b = client(s, "nbA", 4 * GiB), client(s, "nbB", 8 * GiB)
    assert Grant(a, 0, 30.0) in s.acquire(1.0, a)
    s.report_working_set(1.0, a, 4 * GiB, MemoryFigures(resident=4 * GiB, host=0))
    s.release(2.0, a)
    assert s.evicted(3.0, a, failed="pinned allocations") == \
        [Uncounted(a, 0, 4 * GiB, "pinned allocations")]
    actions = s.acquire(4.0, b)
    assert Grant(b, 0, 30.0) in actions and not of(Refuse, actions)


def test_a_client_without_the_feature_is_granted_into_the_room_there_is_not_refused() -> None:
    """It would never hear a refusal (an event of the feature's) and wait for good."""
    s = make(mode="auto")
    a = client(s, "nbA", 4 * GiB)
    b = s.register(0.0, Registration(name="b", working_set=8 * GiB)).id
    assert Grant(a, 0, 30.0) in s.acquire(1.0, a)
    s.report_working_set(1.0, a, 4 * GiB, MemoryFigures(resident=4 * GiB, host=0))
    s.release(2.0, a)
    s.evicted(3.0, a, failed="pinned allocations")
    actions = s.acquire(4.0, b)
    assert Grant(b, 0, 30.0) in actions and not of(Refuse, actions)


def test_an_evicted_idle_client_is_checkpointed_after_checkpoint_after() -> None:
    s = make()
    a = client(s, "nbA", 6 * GiB, checkpointable=True)
    used(s, a, 1.0, 6 * GiB)
    s.evicted(3.0, a, MemoryFigures(resident=0, host=6 * GiB))
    assert s.next_deadline(3.0) == 3.0 + AFTER
    assert s.tick(3.0 + AFTER) == [Suspend(a, 0, "idle")]
    assert s.tick(4.0 + AFTER) == []


def test_nvml_counts_where_it_sees_more() -> None:
    s = make()
    a, b = client(s, "nbA", 2 * GiB), client(s, "nbB", 6 * GiB)
    used(s, a, 1.0, 2 * GiB)
    s.memory_seen(2.0, {a: 5 * GiB})
    assert s.clients[a].memory_source == "nvml"
    assert of(Evict, s.acquire(3.0, b)) == [Evict(a, 0, 5 * GiB, "nbB")]


def test_clients_without_the_feature_are_scheduled_as_before() -> None:
    s = make()
    a = s.register(0.0, Registration(name="a", working_set=6 * GiB)).id
    b = s.register(0.0, Registration(name="b", working_set=6 * GiB)).id
    assert Grant(a, 0, 30.0) in s.acquire(1.0, a)
    s.release(2.0, a)
    assert s.acquire(3.0, b) == [Grant(b, 0, 30.0)]
    assert not s.gpus[0].memory_clients


def test_the_core_reports_an_eviction_that_ended_with_what_it_moved() -> None:
    s = make()
    a, b = client(s, "nbA", 6 * GiB), client(s, "nbB", 6 * GiB)
    used(s, a, 1.0, 6 * GiB)
    assert of(Evict, s.acquire(5.0, b))
    actions = s.evicted(6.0, a, MemoryFigures(resident=0, host=6 * GiB), seconds=0.9, moved=6 * GiB)
    assert of(Evicted, actions) == [Evicted(a, 0, 0.9, 6 * GiB)]
    assert s.counts["evicted_bytes"] == 6 * GiB
    # One that failed moved nothing and reports no eviction.
    assert of(Evicted, s.evicted(7.0, b, failed="out of host memory")) == []


def test_the_core_reports_a_restore_that_ended_with_its_seconds_since_the_grant() -> None:
    s = make()
    a, b = client(s, "nbA", 6 * GiB), client(s, "nbB", 6 * GiB)
    used(s, a, 1.0, 6 * GiB)
    s.acquire(5.0, b)
    s.evicted(6.0, a, MemoryFigures(resident=0, host=6 * GiB))
    s.release(7.0, b)
    assert Grant(a, 0, 30.0) in s.acquire(8.0, a)
    halfway = MemoryFigures(resident=3 * GiB, host=3 * GiB)
    assert of(Restored, s.report_working_set(8.5, a, 6 * GiB, halfway)) == []
    restored = s.report_working_set(9.5, a, 6 * GiB, MemoryFigures(resident=6 * GiB, host=0))
    assert of(Restored, restored) == [Restored(a, 0, 1.5)]
    assert s.clients[a].residency == RESIDENT


def test_the_core_reports_a_checkpoint_that_ended_with_the_bytes_it_moved() -> None:
    s = make()
    a, b = client(s, "nbA", 6 * GiB, checkpointable=True, evict="checkpoint"), \
        client(s, "nbB", 6 * GiB)
    used(s, a, 1.0, 6 * GiB)
    assert of(Suspend, s.acquire(5.0, b))
    assert of(Suspended, s.checkpointed(6.0, a)) == [Suspended(a, 0, 6 * GiB)]
    assert s.clients[a].residency == EVICTED
