"""The ``memory`` feature's metrics (MEMORY-PROTOCOL names): read from the core at scrape time,
the two histograms fed by the core's reports (``Evicted``, ``Restored``)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from nodeside.config import SchedulerConfig
from nodeside.metrics import Metrics
from nodeside.model import MemoryFigures, Registration
from nodeside.scheduler.core import GpuSpec, Scheduler

GiB = 1 << 30


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.exposition().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def b_asks_a_to_evict(b_priority: str = "NORMAL") -> tuple[Scheduler, str, str]:
    """nbA holds 6 GiB and goes idle; nbB's grant needs the room: a is asked to evict."""
    s = Scheduler(SchedulerConfig(memory_reserve=0), [GpuSpec(0, memory_total=10 * GiB)], 0.0)
    a = s.register(0.0, Registration(name="nbA", working_set=6 * GiB, evict="vmm")).id
    b = s.register(0.0, Registration(name="nbB", working_set=6 * GiB, evict="vmm",
                                     priority=b_priority)).id
    for client in (a, b):
        s.track_memory(client, MemoryFigures(resident=0, host=0))
    s.acquire(1.0, a)
    s.report_working_set(1.0, a, 6 * GiB, MemoryFigures(resident=6 * GiB, host=0))
    s.release(2.0, a)
    s.acquire(3.0, b)
    return s, a, b


def test_resident_and_evicted_bytes_evictions_and_restores_are_exposed() -> None:
    s, a, b = b_asks_a_to_evict()
    metrics = Metrics(s, clock=lambda: 5.0)
    # The histograms hear of evictions and restores from the core's reports, as the daemon
    # passes every list of actions to its observers.
    metrics.observe(s.evicted(4.0, a, MemoryFigures(resident=0, host=6 * GiB), seconds=0.8,
                              moved=6 * GiB),
                    4.0)
    got = samples(metrics)
    assert got[("kiwi_resident_bytes", (("client", "nbA"), ("gpu", "0")))] == 0
    assert got[("kiwi_evicted_bytes", (("client", "nbA"), ("gpu", "0")))] == 6 * GiB
    assert got[("kiwi_evictions_total", (("gpu", "0"), ("reason", "room")))] == 1
    assert got[("kiwi_evicted_bytes_total", ())] == 6 * GiB
    assert got[("kiwi_restores_total", ())] == 0
    assert got[("kiwi_eviction_seconds_count", (("gpu", "0"),))] == 1
    assert got[("kiwi_eviction_seconds_sum", (("gpu", "0"),))] == 0.8
    metrics.observe(s.release(5.0, b), 5.0)
    metrics.observe(s.acquire(6.0, a), 6.0)
    back = MemoryFigures(resident=6 * GiB, host=0)
    metrics.observe(s.report_working_set(6.25, a, 6 * GiB, back), 6.25)
    got = samples(metrics)
    assert got[("kiwi_restores_total", ())] == 1
    assert got[("kiwi_restore_seconds_count", (("gpu", "0"),))] == 1
    assert got[("kiwi_restore_seconds_sum", (("gpu", "0"),))] == 0.25


def test_evictions_are_counted_by_who_asked() -> None:
    """Issue 40, N5: by the waiter's priority per GPU, and per client that asked."""
    s, _, _ = b_asks_a_to_evict("LOW")
    got = samples(Metrics(s, clock=lambda: 5.0))
    assert got[("kiwi_evictions_asked_by_total", (("gpu", "0"), ("priority", "LOW")))] == 1
    assert got[("kiwi_client_evictions_asked_total", (("client", "nbB"), ("gpu", "0")))] == 1
    assert ("kiwi_client_evictions_asked_total", (("client", "nbA"), ("gpu", "0"))) not in got
