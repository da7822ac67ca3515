"""A voluntary release with ``evict_first``, on the sans-I/O core with an injected clock.

A holder leaving of its own accord (a cell ended, an idle spell) asks the scheduler whether the
next holder needs its room before the GPU changes hands. If so the hold turns into a drop
(reason ``release``, evict) and the GPU is handed over only by the plain release that follows
the eviction; otherwise it is handed over at once, as a plain release would.
"""

from __future__ import annotations

import pytest

from nodeside import protocol as p
from nodeside.config import SchedulerConfig
from nodeside.model import Registration
from nodeside.scheduler.core import Drop, GpuSpec, Grant, Released, Revoke, Scheduler

GiB = 1 << 30
GRACE = 5.0


def make(mode: str = "on", memory: int | None = 16 * GiB) -> Scheduler:
    config = SchedulerConfig(tq=30.0, mode=mode, grace=GRACE, memory_reserve=0)
    return Scheduler(config, [GpuSpec(0, memory_total=memory)], now=0.0)


def grants(actions: list) -> list[str]:
    return [a.client for a in actions if isinstance(a, Grant)]


def holding_with_a_waiter(s: Scheduler, held: int, wanted: int) -> tuple[str, str]:
    """A holds the GPU with ``held`` bytes; B, wanting ``wanted`` bytes, waits."""
    a = s.register(0.0, Registration(name="A", working_set=held))
    b = s.register(0.0, Registration(name="B", working_set=wanted))
    assert grants(s.acquire(1.0, a.id)) == [a.id]
    assert s.acquire(2.0, b.id) == []
    return a.id, b.id


def test_a_waiter_that_needs_the_room_is_not_granted_until_the_second_release() -> None:
    s = make()
    a, b = holding_with_a_waiter(s, 10 * GiB, 10 * GiB)
    actions = s.release(3.0, a, evict_first=True)
    assert actions == [Drop(a, 0, p.REASON_RELEASE, True, GRACE)]
    assert s.clients[a].state == "holding" and s.clients[b].state == "waiting"
    assert s.queue_position(b, 3.0) == 1
    # The eviction runs; the plain release that follows hands over at once.
    assert grants(s.release(3.5, a)) == [b]
    assert s.clients[a].state == "idle"


def test_the_second_release_is_answered_as_a_release_after_a_drop() -> None:
    s = make()
    a, _ = holding_with_a_waiter(s, 10 * GiB, 10 * GiB)
    s.release(3.0, a, evict_first=True)
    released = [x for x in s.release(3.5, a) if isinstance(x, Released)]
    assert released == [Released(a, evict=True)]


def test_the_drain_goes_to_the_waiter_it_was_made_for() -> None:
    s = make()
    a, b = holding_with_a_waiter(s, 10 * GiB, 10 * GiB)
    s.release(3.0, a, evict_first=True)
    c = s.register(3.1, Registration(name="C", working_set=1 * GiB, priority="HIGH"))
    assert s.acquire(3.2, c.id) == []
    assert grants(s.release(3.5, a))[0] == b


def test_a_waiter_that_fits_beside_is_granted_at_once_without_eviction() -> None:
    s = make()
    a, b = holding_with_a_waiter(s, 4 * GiB, 4 * GiB)
    actions = s.release(3.0, a, evict_first=True)
    assert actions[0] == Released(a, evict=False)
    assert grants(actions) == [b]


def test_with_nobody_waiting_the_release_is_immediate_and_keeps_the_memory() -> None:
    s = make()
    a = s.register(0.0, Registration(name="A", working_set=10 * GiB))
    s.acquire(1.0, a.id)
    assert s.release(2.0, a.id, evict_first=True) == [Released(a.id, evict=False)]
    assert s.clients[a.id].state == "idle"


def test_with_unknown_sizes_any_waiter_needs_the_room() -> None:
    s = make(memory=None)
    a, b = holding_with_a_waiter(s, 1 * GiB, 1 * GiB)
    assert [type(x) for x in s.release(3.0, a, evict_first=True)] == [Drop]
    assert grants(s.release(3.1, a)) == [b]


def test_cancelling_a_wait_with_evict_first_is_a_plain_cancel() -> None:
    s = make()
    a, b = holding_with_a_waiter(s, 10 * GiB, 10 * GiB)
    assert s.release(3.0, b, evict_first=True) == [Released(b, evict=False)]
    assert s.clients[b].state == "idle"


def test_a_drain_past_its_grace_is_revoked_and_the_waiter_granted() -> None:
    s = make()
    a, b = holding_with_a_waiter(s, 10 * GiB, 10 * GiB)
    s.release(3.0, a, evict_first=True)
    assert s.next_deadline(3.0) == pytest.approx(3.0 + GRACE)
    assert s.tick(3.0 + GRACE - 0.01) == []
    actions = s.tick(3.0 + GRACE)
    assert [(x.client, x.reason) for x in actions if isinstance(x, Revoke)] == [
        (a, p.REASON_GRACE)]
    assert grants(actions) == [b]
    # The late plain release finds nothing held.
    assert s.release(9.0, a) == [Released(a, evict=False)]


def test_a_client_that_dies_while_draining_frees_the_gpu_at_once() -> None:
    s = make()
    a, b = holding_with_a_waiter(s, 10 * GiB, 10 * GiB)
    s.release(3.0, a, evict_first=True)
    assert grants(s.unregister(3.2, a)) == [b]


def test_a_drain_does_not_end_at_the_quantum() -> None:
    s = make()
    a, b = holding_with_a_waiter(s, 10 * GiB, 10 * GiB)
    s.release(3.0, a, evict_first=True)
    # The quantum ends at 31 s, but the hold is already a drop: only its grace applies.
    assert s.tick(4.0) == []
    assert s.clients[a].state == "holding"


def test_evict_first_after_a_drop_that_says_evict_keeps_that_drop_and_its_grace() -> None:
    s = make()
    a, b = holding_with_a_waiter(s, 10 * GiB, 10 * GiB)
    drop = s.tick(31.0)[0]
    assert (drop.reason, drop.evict) == (p.REASON_QUANTUM, True)
    # The shim's cell-end release crossed the drop on the wire.
    again = s.release(32.0, a, evict_first=True)
    # The grace compared on its own: a compiled Drop holds a float, not pytest's approx.
    (drop_again,) = again
    assert drop_again == Drop(a, 0, p.REASON_QUANTUM, True, drop_again.grace)
    assert drop_again.grace == pytest.approx(GRACE - 1.0)
    assert s.counts["drops"] == 1
    assert grants(s.release(32.5, a)) == [b]


def test_evict_first_after_a_drop_that_fits_beside_hands_over_at_once() -> None:
    s = make()
    a, b = holding_with_a_waiter(s, 4 * GiB, 4 * GiB)
    assert s.tick(31.0)[0].evict is False
    actions = s.release(31.5, a, evict_first=True)
    assert actions[0] == Released(a, evict=False)
    assert grants(actions) == [b]


def test_auto_mode_drains_when_the_waiter_does_not_fit_beside_the_leaver() -> None:
    s = make(mode="auto")
    a, b = holding_with_a_waiter(s, 10 * GiB, 10 * GiB)
    assert [type(x) for x in s.release(3.0, a, evict_first=True)] == [Drop]
    assert grants(s.release(3.1, a)) == [b]


def test_a_plain_release_still_hands_over_at_once_and_says_evict() -> None:
    s = make()
    a, b = holding_with_a_waiter(s, 10 * GiB, 10 * GiB)
    actions = s.release(3.0, a)
    assert actions[0] == Released(a, evict=True)
    assert grants(actions) == [b]
