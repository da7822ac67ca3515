"""Overlapped handoffs in the sans-I/O core (``handoff_overlap``, issue 39 Must-work 3): a
``vmm`` client is granted while the room it lacks is still on its way out, so its way in (its
restore waits for each chunk's room, kiwi_jupyter/shim/mechanisms/vmm_move.c) overlaps the
other's way out, each direction on its own copy engine. Off by default; other evictors, and room
nobody is moving out, are waited for as before.
"""

from __future__ import annotations

from nodeside.config import SchedulerConfig
from nodeside.model import EVICTING, MemoryFigures, Registration
from nodeside.scheduler.core import Drop, Evict, GpuSpec, Grant, Released, Scheduler

GiB = 1 << 30


def make(overlap: bool = True) -> Scheduler:
    config = SchedulerConfig(tq=30.0, mode="on", memory_reserve=0, evict_timeout=10.0,
                             handoff_overlap=overlap)
    return Scheduler(config, [GpuSpec(0, memory_total=10 * GiB)], now=0.0)


def client(s: Scheduler, name: str, working_set: int, evict: str = "vmm") -> str:
    c = s.register(0.0, Registration(name=name, working_set=working_set, evict=evict))
    s.track_memory(c.id, MemoryFigures(resident=0, host=0), checkpointable=False)
    return c.id


def filled(s: Scheduler, c: str, now: float, nbytes: int) -> None:
    assert Grant(c, 0, 30.0) in s.acquire(now, c)
    s.report_working_set(now, c, nbytes, MemoryFigures(resident=nbytes, host=0))
    s.release(now + 1.0, c)


def test_a_vmm_waiter_is_granted_as_the_idle_client_is_asked_to_evict() -> None:
    s = make()
    a, b = client(s, "nbA", 6 * GiB), client(s, "nbB", 6 * GiB)
    filled(s, a, 1.0, 6 * GiB)
    actions = s.acquire(5.0, b)
    assert actions == [Evict(a, 0, 6 * GiB, "nbB"), Grant(b, 0, 30.0)]
    assert s.clients[a].residency == EVICTING


def test_a_vmm_waiter_is_granted_when_the_holder_releases_evicting() -> None:
    s = make()
    a, b = client(s, "nbA", 6 * GiB), client(s, "nbB", 6 * GiB)
    assert Grant(a, 0, 30.0) in s.acquire(1.0, a)
    s.report_working_set(1.0, a, 6 * GiB, MemoryFigures(resident=6 * GiB, host=0))
    assert s.acquire(2.0, b) == []
    drops = [x for x in s.tick(31.0) if isinstance(x, Drop)]
    assert drops and drops[0].evict
    assert s.release(31.5, a, evicting=True) == [Released(a, evict=True), Grant(b, 0, 30.0)]


def test_without_overlap_the_grant_waits_for_the_room() -> None:
    s = make(overlap=False)
    a, b = client(s, "nbA", 6 * GiB), client(s, "nbB", 6 * GiB)
    filled(s, a, 1.0, 6 * GiB)
    assert s.acquire(5.0, b) == [Evict(a, 0, 6 * GiB, "nbB")]


def test_a_managed_waiter_waits_for_the_room_even_with_overlap() -> None:
    s = make()
    a, b = client(s, "nbA", 6 * GiB), client(s, "nbB", 6 * GiB, evict="managed")
    filled(s, a, 1.0, 6 * GiB)
    assert s.acquire(5.0, b) == [Evict(a, 0, 6 * GiB, "nbB")]


def test_room_that_nobody_can_move_out_is_not_counted_as_coming() -> None:
    s = make()
    a, b = client(s, "nbA", 6 * GiB), client(s, "nbB", 6 * GiB)
    filled(s, a, 1.0, 6 * GiB)
    s.memory_seen(1.5, {a: 6 * GiB, b: 0})  # NVML vouches: it counts whatever a says
    s.evicted(2.0, a, failed="copy failed")  # it could not move its memory
    assert not [x for x in s.acquire(5.0, b) if isinstance(x, Grant)]
