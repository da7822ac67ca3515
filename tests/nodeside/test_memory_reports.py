"""What the scheduler hears of a client's memory figures: metered at the protocol's 50 ms and,
for an idle client's resident bytes, damped (issue 40, N2 and N5b). The sans-I/O rules with an
injected clock, then the daemon in this process on virtual time, counting its scheduling passes.
"""

from __future__ import annotations

from nodeside import protocol as p
from nodeside.daemon.memory_reports import HOLDING, IDLE, INTERVAL, MOVING, MemoryReports
from nodeside.daemon.working_sets import HOLD
from nodeside.scheduler.residency import PROGRESS_BYTES
from nodeside.testing import Node

GiB = 1 << 30
MiB = 1 << 20


def test_the_first_report_is_heard_at_once_and_later_ones_at_most_every_interval() -> None:
    reports = MemoryReports()
    assert reports.report("a", (GiB, 0, 0), HOLDING, 0.0) == (GiB, 0, 0)
    assert reports.report("a", (2 * GiB, 0, 0), HOLDING, 0.01) is None
    assert reports.report("a", (3 * GiB, None, None), HOLDING, 0.02) is None
    assert reports.next_due() == INTERVAL
    assert reports.due(INTERVAL - 0.001) == []
    assert reports.due(INTERVAL) == [("a", (3 * GiB, 0, 0))]
    assert reports.next_due() is None


def test_a_flood_of_reports_is_heard_twenty_times_a_second() -> None:
    reports = MemoryReports()
    heard = 0
    for i in range(10_000):  # 10,000 reports in one second, each a new figure
        now = i / 10_000
        heard += reports.report("a", (GiB + i, 0, 0), HOLDING, now) is not None
        heard += len(reports.due(now))
    assert heard <= 1 / INTERVAL + 1


def test_an_idle_clients_rise_is_heard_only_once_it_holds() -> None:
    reports = MemoryReports()
    reports.report("a", (0, 0, 0), IDLE, 0.0)
    t = 0.0
    for _ in range(100):  # 16 GiB and 0 in turn: the rise never holds
        t += 0.1
        high = reports.report("a", (16 * GiB, 0, 0), IDLE, t)
        t += 0.1
        low = reports.report("a", (0, 0, 0), IDLE, t)
        assert high is None and low is None and reports.due(t) == []
    # A rise that holds is heard HOLD after the last report as small as the one heard.
    assert reports.report("a", (16 * GiB, 0, 0), IDLE, t + 0.1) is None
    assert reports.next_due() == t + HOLD
    assert reports.due(t + HOLD) == [("a", (16 * GiB, 0, 0))]


def test_an_idle_clients_fall_is_heard_at_the_meter() -> None:
    reports = MemoryReports()
    reports.report("a", (8 * GiB, 0, 0), IDLE, 0.0)
    assert reports.report("a", (GiB, 0, 0), IDLE, 1.0) == (GiB, 0, 0)


def test_a_moving_clients_progress_is_heard_at_once_each_step() -> None:
    reports = MemoryReports()
    reports.report("a", (8 * GiB, 0, 0), IDLE, 0.0)
    left = 8 * GiB
    for i in range(1, 5):  # 256 MiB out each millisecond
        left -= 256 * MiB
        assert reports.report("a", (left, 8 * GiB - left, 0), MOVING, 0.001 * i) is not None
    # Less than a step within the interval waits for the meter.
    assert reports.report("a", (left - PROGRESS_BYTES // 2, 0, 0), MOVING, 0.005) is None


def test_evicted_figures_stand_over_what_waited() -> None:
    reports = MemoryReports()
    reports.report("a", (8 * GiB, 0, 0), HOLDING, 0.0)
    assert reports.report("a", (4 * GiB, 4 * GiB, 0), HOLDING, 0.01) is None
    reports.heard("a", (0, 8 * GiB, 0), 0.02)
    assert reports.next_due() is None and reports.due(1.0) == []


def test_a_flood_of_memory_reports_costs_the_daemon_no_scheduling_pass_each() -> None:
    """In the daemon: 2,000 reports of new figures in a tenth of a second are each answered,
    and the scheduler hears three of them (the first, then one per 50 ms)."""
    with Node(tq=30, gpu_memory=16 * GiB) as node:
        flooder = node.client("flood", features=[p.FEATURE_MEMORY])
        assert flooder.request(p.ACQUIRE)["op"] == p.GRANT  # a holder: metered only
        state = node.daemon.scheduler._state  # noqa: SLF001 - its count of scheduling passes
        before = state.events
        for i in range(2000):
            flooder.send(p.encode(p.WORKING_SET, seq=i, bytes=GiB, resident=GiB + i, host=0))
            if i % 20 == 19:
                node.sleep(0.001)
        for i in range(2000):
            assert flooder.read()["seq"] == i
        node.sleep(0.1)
        assert state.events - before <= 4
        assert node.daemon.scheduler.clients[flooder.client_id].resident_bytes == GiB + 1999


def test_an_idle_clients_memory_coming_back_from_host_memory_is_heard_at_once() -> None:
    """A ``fetch`` to the GPU brings an idle client's memory back without a grant: its rise is
    progress, not an allocation ahead. Damped, the room it took back counted for nobody, and
    the next grant put two working sets on a card with room for one (the restore-on-intent
    benchmark waited for good for an eviction that was never asked)."""
    with Node(tq=30, gpu_memory=16 * GiB) as node:
        kernel = node.client("kernel", features=[p.FEATURE_MEMORY], working_set=8 * GiB,
                             resident=0, host=8 * GiB)
        record = node.daemon.scheduler.clients[kernel.client_id]
        assert record.residency.value == "evicted"
        # Its way out's end, heard at once (a first report); the fetch ends a meter later.
        kernel.request(p.WORKING_SET, bytes=8 * GiB, resident=0, host=8 * GiB)
        node.sleep(INTERVAL)
        kernel.request(p.WORKING_SET, bytes=8 * GiB, resident=8 * GiB, host=0)
        node.sleep(INTERVAL / 10)
        assert (record.resident_bytes, record.host_bytes) == (8 * GiB, 0)
        assert record.residency.value == "resident"
