"""Memory claims are evidence, and a waiter for room never blocks the queue (issue 40: N4b, N1,
N1c, N5), in the sans-I/O core with an injected clock.

A client's ``resident`` is a claim: where NVML vouches for the client's process its figure
counts instead, both ways; a claim larger than the GPU is refused; a claim only the client makes
stops counting once the client could not evict and nobody checkpointed it, until its next
grant. A waiter for room leaves the queue open to grants that need none, and its wait ends once.
Evictions are fair: one client is asked at most once per ``evict_interval``, a LOW waiter moves
a NORMAL kernel out at most once a TQ, and a waiter whose last room went unused waits longer
before it may ask again.
"""

from __future__ import annotations

import pytest
from test_core_residency import client as kernel
from test_core_residency import of, used

from nodeside import protocol as p
from nodeside.config import SchedulerConfig
from nodeside.model import EVICTING, RESIDENT, MemoryFigures, Registration
from nodeside.scheduler.core import (
    Evict,
    GpuSpec,
    Grant,
    Refuse,
    Scheduler,
    SchedulerError,
    Suspend,
    Suspended,
    Uncounted,
)

GiB = 1 << 30
TIMEOUT = 10.0
TQ = 30.0
INTERVAL = 2.0


def make(capacity: int = 16 * GiB, mode: str = "on", interval: float = INTERVAL) -> Scheduler:
    config = SchedulerConfig(tq=TQ, mode=mode, memory_reserve=0, evict_timeout=TIMEOUT,
                             checkpoint_after=0, evict_interval=interval)
    return Scheduler(config, [GpuSpec(0, memory_total=capacity)], now=0.0)


def plain(s: Scheduler, name: str, working_set: int | None = None) -> str:
    """A client without the ``memory`` feature (the Python client)."""
    return s.register(0.0, Registration(name=name, working_set=working_set)).id


# -- N4b: a waiter for room never blocks the queue --------------------------------------------

def test_a_plain_client_behind_a_waiter_for_room_is_granted_meanwhile() -> None:
    s = make()
    liar, waiter, other = kernel(s, "liar", 12 * GiB), kernel(s, "nb", 6 * GiB), plain(s, "root")
    used(s, liar, 1.0, 12 * GiB)
    assert of(Evict, s.acquire(2.0, waiter)) == [Evict(liar, 0, 12 * GiB, "nb")]
    assert s.acquire(2.5, other) == [Grant(other, 0, TQ)]
    assert s.clients[waiter].state == "waiting"


def test_in_mode_auto_each_waiter_that_fits_now_and_beside_the_room_being_made_goes_on(
        ) -> None:
    s = make(mode="auto")
    holder = plain(s, "holder", 4 * GiB)
    liar, waiter = kernel(s, "liar", 8 * GiB), kernel(s, "nb", 6 * GiB)
    small, medium = kernel(s, "small", 2 * GiB), kernel(s, "medium", 5 * GiB)
    used(s, liar, 1.0, 8 * GiB)
    assert s.acquire(1.5, holder) == [Grant(holder, 0, TQ)]
    # 4 held + 8 resident + 6 wanted: 2 GiB short, the liar is asked for its 8.
    assert of(Evict, s.acquire(2.0, waiter)) == [Evict(liar, 0, 8 * GiB, "nb")]
    # 4 + 8 + 2 fit now, and 4 + 2 + 6 once the liar is out: it goes on.
    assert s.acquire(2.1, small) == [Grant(small, 0, TQ)]
    # 4 + 2 + 8 + 5 do not fit now: it waits.
    assert s.acquire(2.2, medium) == []
    assert s.clients[waiter].state == "waiting"


def test_the_kernel_on_its_way_out_for_a_waiter_is_not_granted_beside_it() -> None:
    """The evicted kernel's own next cell needs no room while its memory still counts, but its
    grant would take back the room it is making: it waits behind the waiter, or the waiter
    would starve while the other's cells come and go (each grant stops the eviction)."""
    s = make(capacity=10 * GiB)
    a, b = kernel(s, "nbA", 6 * GiB), kernel(s, "nbB", 6 * GiB)
    used(s, a, 1.0, 6 * GiB)
    assert of(Evict, s.acquire(2.0, b)) == [Evict(a, 0, 6 * GiB, "nbB")]
    assert s.clients[a].residency == EVICTING
    assert s.acquire(2.5, a) == []  # its next cell waits, behind the waiter
    assert (s.clients[a].state, s.clients[b].state) == ("waiting", "waiting")


def test_a_waiter_that_would_take_the_room_being_made_waits() -> None:
    s = make(mode="auto")
    holder = plain(s, "holder", 4 * GiB)
    liar, waiter = kernel(s, "liar", 8 * GiB), kernel(s, "nb", 10 * GiB)
    other = kernel(s, "other", 3 * GiB)
    used(s, liar, 1.0, 8 * GiB)
    s.acquire(1.5, holder)
    assert of(Evict, s.acquire(2.0, waiter)) == [Evict(liar, 0, 8 * GiB, "nb")]
    # 4 + 8 + 3 fit now, but 4 + 3 + 10 would not once the liar is out: the room is the
    # waiter's.
    assert s.acquire(2.1, other) == []


def test_a_waiter_without_a_known_working_set_does_not_take_the_room_in_mode_auto() -> None:
    s = make(mode="auto")
    liar, waiter, other = kernel(s, "liar", 12 * GiB), kernel(s, "nb", 6 * GiB), plain(s, "x")
    used(s, liar, 1.0, 12 * GiB)
    s.acquire(2.0, waiter)
    assert s.acquire(2.5, other) == []


def test_the_wait_for_one_eviction_ends_once_and_re_reports_do_not_arm_another() -> None:
    s = make()
    liar, waiter, second = (kernel(s, n, 6 * GiB) for n in ("liar", "nb", "nb2"))
    used(s, liar, 1.0, 12 * GiB)
    s.acquire(2.0, waiter)
    # The liar says its figures again and again: no progress, the deadline stands.
    for t in (4.0, 8.0, 11.9):
        s.report_working_set(t, liar, 12 * GiB, MemoryFigures(resident=12 * GiB, host=0))
    actions = s.tick(2.0 + TIMEOUT)
    assert of(Uncounted, actions) and Grant(waiter, 0, TQ) in actions
    s.report_working_set(13.0, liar, 12 * GiB, MemoryFigures(resident=12 * GiB, host=0))
    s.release(14.0, waiter)
    # The next waiter is not held for the liar again: it is granted at once, nobody asked.
    assert s.acquire(15.0, second) == [Grant(second, 0, TQ)]


def test_an_eviction_that_makes_progress_is_not_given_up_on() -> None:
    s = make()
    mover, waiter = kernel(s, "mover", 12 * GiB), kernel(s, "nb", 12 * GiB)
    used(s, mover, 1.0, 12 * GiB)
    s.acquire(2.0, waiter)
    left = 12 * GiB
    for t in (9.0, 16.0, 23.0):  # 1 GiB every 7 s: slow, but on its way
        left -= GiB
        moving = MemoryFigures(resident=left, host=12 * GiB - left)
        assert not of(Uncounted, s.report_working_set(t, mover, 12 * GiB, moving))
        assert not of(Uncounted, s.tick(t + TIMEOUT - 0.1))
    assert s.clients[mover].residency == EVICTING
    assert of(Uncounted, s.tick(23.0 + TIMEOUT))


def test_a_byte_at_a_time_is_no_progress() -> None:
    s = make()
    mover, waiter = kernel(s, "mover", 12 * GiB), kernel(s, "nb", 12 * GiB)
    used(s, mover, 1.0, 12 * GiB)
    s.acquire(2.0, waiter)
    s.report_working_set(9.0, mover, 12 * GiB, MemoryFigures(resident=12 * GiB - 4096, host=4096))
    assert of(Uncounted, s.tick(2.0 + TIMEOUT))


# -- N1: claims are evidence ------------------------------------------------------------------

def test_nvml_corrects_an_over_claim() -> None:
    s = make()
    liar, waiter = kernel(s, "liar", 12 * GiB), kernel(s, "nb", 6 * GiB)
    used(s, liar, 1.0, 12 * GiB)
    s.memory_seen(1.5, {liar: 0, waiter: 0})
    assert s.acquire(2.0, waiter) == [Grant(waiter, 0, TQ)]
    assert s.clients[liar].memory_source == "nvml"


def test_nvml_corrects_an_under_claim() -> None:
    s = make()
    quiet, waiter = kernel(s, "quiet", GiB), kernel(s, "nb", 6 * GiB)
    used(s, quiet, 1.0, GiB)
    s.memory_seen(1.5, {quiet: 12 * GiB, waiter: 0})
    assert of(Evict, s.acquire(2.0, waiter)) == [Evict(quiet, 0, 12 * GiB, "nb")]


def test_a_resident_claim_larger_than_the_gpu_is_refused() -> None:
    s = make()
    liar = kernel(s, "liar", GiB)
    used(s, liar, 1.0, GiB)
    with pytest.raises(SchedulerError) as refused:
        s.report_working_set(2.0, liar, GiB, MemoryFigures(resident=1 << 50, host=0))
    assert refused.value.code == p.E_INVALID and "more than GPU 0 has" in str(refused.value)
    assert s.clients[liar].resident_bytes == GiB


def test_a_failed_eviction_the_daemon_reaches_is_checkpointed() -> None:
    s = make()
    holder = kernel(s, "holder", 12 * GiB, checkpointable=True)
    waiter = kernel(s, "nb", 6 * GiB)
    used(s, holder, 1.0, 12 * GiB)
    s.acquire(2.0, waiter)
    assert of(Suspend, s.evicted(3.0, holder, failed="no host memory")) == \
        [Suspend(holder, 0, "failed")]
    assert of(Grant, s.checkpointed(5.0, holder)) == [Grant(waiter, 0, TQ)]


def test_a_process_that_holds_no_gpu_memory_counts_as_none_until_it_holds_again() -> None:
    s = make()
    liar = kernel(s, "liar", 12 * GiB, checkpointable=True)
    waiter, second = kernel(s, "nb", 6 * GiB), kernel(s, "nb2", 6 * GiB)
    used(s, liar, 1.0, 12 * GiB)
    s.acquire(2.0, waiter)
    assert s.tick(2.0 + TIMEOUT) == [Suspend(liar, 0, "timeout")]
    actions = s.checkpointed(13.0, liar, "the driver knows no CUDA process 42",
                             memory_free=True)
    assert actions == [Grant(waiter, 0, TQ)]
    s.report_working_set(14.0, liar, 12 * GiB, MemoryFigures(resident=12 * GiB, host=0))
    s.release(15.0, waiter)
    assert s.acquire(16.0, second) == [Grant(second, 0, TQ)]


def test_an_uncounted_client_waits_for_room_for_its_next_work() -> None:
    s = make()
    liar, waiter = kernel(s, "liar", 12 * GiB), kernel(s, "nb", 6 * GiB)
    used(s, liar, 1.0, 12 * GiB)
    s.acquire(2.0, waiter)
    s.tick(2.0 + TIMEOUT)
    s.report_working_set(13.0, waiter, 6 * GiB, MemoryFigures(resident=6 * GiB, host=0))
    s.release(14.0, waiter)
    # Its own 12 GiB claim and the waiter's 6 do not fit in 16: it waits for the room.
    assert of(Evict, s.acquire(15.0, liar)) == [Evict(waiter, 0, 6 * GiB, "liar")]
    assert s.clients[liar].state == "waiting"


# -- N1c: what NVML still shows after "evicted" counts -----------------------------------------

def test_an_evicted_client_that_nvml_still_shows_is_counted_and_checkpointed() -> None:
    s = make(capacity=8 * GiB)
    keeper = kernel(s, "keeper", 6 * GiB, checkpointable=True)
    waiter = kernel(s, "nb", 4 * GiB)
    used(s, keeper, 1.0, 6 * GiB)
    s.evicted(2.0, keeper, MemoryFigures(resident=0, host=6 * GiB))
    s.memory_seen(3.0, {keeper: 6 * GiB, waiter: 0})
    assert s.acquire(4.0, waiter) == [Suspend(keeper, 0, "room")]
    assert s.checkpointed(5.0, keeper) == [Suspended(keeper, 0, 6 * GiB), Grant(waiter, 0, TQ)]


def test_an_evicted_client_that_nvml_still_shows_gets_the_waiter_refused_when_unreachable(
        ) -> None:
    s = make(capacity=8 * GiB)
    keeper, waiter = kernel(s, "keeper", 6 * GiB), kernel(s, "nb", 4 * GiB)
    used(s, keeper, 1.0, 6 * GiB)
    s.evicted(2.0, keeper, MemoryFigures(resident=0, host=6 * GiB))
    s.memory_seen(3.0, {keeper: 6 * GiB, waiter: 0})
    [refused] = of(Refuse, s.acquire(4.0, waiter))
    assert refused.client == waiter and "keeper (6.0 GiB" in refused.message


# -- N5: fair eviction -----------------------------------------------------------------------

def test_one_client_is_asked_to_evict_at_most_once_per_evict_interval() -> None:
    s = make(capacity=12 * GiB, interval=5.0)
    victim, a, b = (kernel(s, n, 8 * GiB) for n in ("victim", "a", "b"))
    used(s, victim, 1.0, 8 * GiB)
    assert of(Evict, s.acquire(2.0, a)) == [Evict(victim, 0, 8 * GiB, "a")]
    s.evicted(2.5, victim, MemoryFigures(resident=0, host=8 * GiB))
    s.report_working_set(3.0, a, 8 * GiB, MemoryFigures(resident=8 * GiB, host=0))
    s.release(3.0, a)
    s.evicted(3.1, a, MemoryFigures(resident=0, host=8 * GiB))  # of its own accord
    used(s, victim, 3.5, 8 * GiB)  # the victim's next cell brings it back
    assert not of(Evict, s.acquire(4.5, b))  # it was asked at 2.0: not again before 7.0
    assert s.next_deadline(4.5) == 7.0
    assert of(Evict, s.tick(7.0)) == [Evict(victim, 0, 8 * GiB, "b")]


def test_a_low_waiter_moves_a_normal_kernel_out_at_most_once_a_tq() -> None:
    s = make(capacity=12 * GiB)
    victim, low = kernel(s, "victim", 8 * GiB), kernel(s, "low", 8 * GiB, priority="LOW")
    used(s, victim, 1.0, 8 * GiB)
    assert of(Evict, s.acquire(2.0, low))
    s.evicted(2.5, victim, MemoryFigures(resident=0, host=8 * GiB))
    s.report_working_set(3.0, low, 8 * GiB, MemoryFigures(resident=8 * GiB, host=0))
    s.release(3.0, low)
    s.evicted(3.2, low, MemoryFigures(resident=0, host=8 * GiB))  # of its own accord, say
    used(s, victim, 4.0, 8 * GiB)  # the victim's next cell brings it back
    assert not of(Evict, s.acquire(10.0, low))
    assert s.next_deadline(10.0) == 2.0 + TQ
    assert of(Evict, s.tick(2.0 + TQ)) == [Evict(victim, 0, 8 * GiB, "low")]


def test_a_grant_others_evicted_for_and_not_used_makes_the_next_wait_ask_later() -> None:
    s = make(capacity=12 * GiB, interval=5.0)
    victim, taker = kernel(s, "victim", 8 * GiB), kernel(s, "taker", 8 * GiB)
    used(s, victim, 1.0, 8 * GiB)
    s.acquire(2.0, taker)
    s.evicted(2.5, victim, MemoryFigures(resident=0, host=8 * GiB))
    assert s.clients[taker].state == "holding"
    s.release(2.6, taker)  # it never touched the GPU: nothing resident seen
    used(s, victim, 3.0, 8 * GiB)
    # The victim may be asked again from 7.0; the taker may ask only from 2.6 + 5.
    assert not of(Evict, s.acquire(7.2, taker))
    assert s.next_deadline(7.2) == pytest.approx(7.6)
    assert of(Evict, s.tick(7.6)) == [Evict(victim, 0, 8 * GiB, "taker")]
    # A second unused one doubles the wait.
    s.evicted(8.0, victim, MemoryFigures(resident=0, host=8 * GiB))
    s.release(8.1, taker)
    assert s.clients[taker].may_ask_from == pytest.approx(8.1 + 10.0)


def test_a_cancelled_wait_others_evicted_for_counts_as_unused() -> None:
    s = make(capacity=12 * GiB)
    victim, taker = kernel(s, "victim", 8 * GiB), kernel(s, "taker", 8 * GiB)
    used(s, victim, 1.0, 8 * GiB)
    assert of(Evict, s.acquire(2.0, taker))
    s.release(2.1, taker)  # cancelled before its grant
    assert s.clients[taker].unused_room == 1
    assert s.clients[taker].may_ask_from == pytest.approx(2.1 + INTERVAL)


def test_a_used_grant_clears_the_backoff() -> None:
    s = make(capacity=12 * GiB)
    victim, taker = kernel(s, "victim", 8 * GiB), kernel(s, "taker", 8 * GiB)
    used(s, victim, 1.0, 8 * GiB)
    s.acquire(2.0, taker)
    s.release(2.1, taker)
    assert s.clients[taker].unused_room == 1
    s.tick(5.0)
    assert of(Evict, s.acquire(5.0, taker)) == []  # the victim is on its way out already
    s.evicted(5.5, victim, MemoryFigures(resident=0, host=8 * GiB))
    assert s.clients[taker].state == "holding"
    s.report_working_set(6.0, taker, 8 * GiB, MemoryFigures(resident=8 * GiB, host=0))
    s.release(7.0, taker)
    assert (s.clients[taker].unused_room, s.clients[taker].may_ask_from) == (0, 0.0)


def test_evictions_are_counted_by_who_asked() -> None:
    s = make(capacity=12 * GiB)
    victim, low = kernel(s, "victim", 8 * GiB), kernel(s, "low", 8 * GiB, priority="LOW")
    used(s, victim, 1.0, 8 * GiB)
    s.acquire(2.0, low)
    assert s.gpus[0].evictions_by == {"LOW": 1}
    assert s.clients[low].evictions_asked == 1 and s.clients[victim].evictions_asked == 0
    assert s.clients[victim].residency == EVICTING
    assert s.clients[low].residency == RESIDENT
