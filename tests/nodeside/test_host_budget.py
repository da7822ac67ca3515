"""The measured host budget kept current (feature ``tiers``): Kiwi's own counted host use plus
MemAvailable less a margin, read again every ``HOST_READ_EVERY`` seconds and before an acquire
when the last read is older than ``HOST_READ_FRESH``. The sans-I/O rules with an injected
clock; the reader over a meminfo file; then the daemon in this process on virtual time, its
meminfo a file the test rewrites."""

from __future__ import annotations

from pathlib import Path

from nodeside import protocol as p
from nodeside.config import SchedulerConfig
from nodeside.daemon import hostmem
from nodeside.model import MemoryFigures, Registration
from nodeside.scheduler.core import GpuSpec, Grant, Scheduler, Spill
from nodeside.scheduler.tiers import HOST_READ_EVERY, HOST_READ_FRESH
from nodeside.testing import Node

GiB = 1 << 30
#: The margin the default budget leaves a host of 100 GiB (the larger of 4 GiB and a tenth).
MARGIN = 10 * GiB


def make(host_budget: int | None = None) -> Scheduler:
    config = SchedulerConfig(tq=30.0, mode="on", memory_reserve=0, checkpoint_after=0,
                             host_budget=host_budget, spill_after=0)
    return Scheduler(config, [GpuSpec(0, memory_total=10 * GiB)], now=0.0)


def evicted(s: Scheduler, name: str, nbytes: int, now: float) -> str:
    """A ``tiers`` client that held the GPU, filled ``nbytes`` and was evicted at ``now``."""
    c = s.register(now - 3.0, Registration(name=name, working_set=nbytes, evict="vmm")).id
    s.track_memory(c, MemoryFigures(resident=0, host=0))
    s.track_tiers(c)
    assert Grant(c, 0, 30.0) in s.acquire(now - 2.0, c)
    s.report_working_set(now - 2.0, c, nbytes, MemoryFigures(resident=nbytes, host=0))
    s.release(now - 1.0, c, evicting=True)
    s.evicted(now, c, MemoryFigures(resident=0, host=nbytes))
    return c


def test_the_measured_budget_is_kiwis_own_host_use_plus_what_the_host_has_free() -> None:
    s = make()
    evicted(s, "nbA", 6 * GiB, 10.0)
    s.host_memory_read(11.0, 2 * GiB)
    assert s.host_budget == 8 * GiB


def test_kiwis_own_growth_does_not_shrink_its_budget() -> None:
    s = make()
    s.host_memory_read(0.0, 8 * GiB)
    evicted(s, "nbA", 6 * GiB, 10.0)  # MemAvailable falls by what the eviction took
    actions = s.host_memory_read(11.0, 2 * GiB)
    assert s.host_budget == 8 * GiB and [a for a in actions if isinstance(a, Spill)] == []


def test_a_shrinking_memavailable_lowers_the_budget_and_leads_to_spills() -> None:
    s = make()
    s.host_memory_read(0.0, 8 * GiB)
    a = evicted(s, "nbA", 6 * GiB, 10.0)
    # Another tenant of the host took memory: 1 GiB short of the margin now.
    actions = s.host_memory_read(20.0, -GiB)
    assert s.host_budget == 5 * GiB
    assert [x for x in actions if isinstance(x, Spill)] == [Spill(a, 0, None, "budget")]


def test_a_configured_host_budget_stays_as_configured() -> None:
    s = make(host_budget=8 * GiB)
    evicted(s, "nbA", 6 * GiB, 10.0)
    s.host_memory_read(11.0, 100 * GiB)
    assert s.host_budget == 8 * GiB
    assert not s.host_budget_stale(1000.0)


def test_the_budget_is_read_again_before_an_acquire_once_the_last_read_is_old() -> None:
    s = make()
    assert not s.host_budget_stale(0.0)  # nobody speaks tiers: nothing plans with it
    evicted(s, "nbA", GiB, 10.0)
    s.host_memory_read(10.0, GiB)
    assert not s.host_budget_stale(10.0 + HOST_READ_FRESH - 0.001)
    assert s.host_budget_stale(10.0 + HOST_READ_FRESH)


def test_the_host_is_read_as_memavailable_less_the_margin(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       104857600 kB\nMemFree: 1 kB\n"
                       "MemAvailable:    20971520 kB\n")
    assert hostmem.host_free(meminfo) == 20 * GiB - MARGIN
    meminfo.write_text("MemTotal:       104857600 kB\nMemAvailable:     5242880 kB\n")
    assert hostmem.host_free(meminfo) == 5 * GiB - MARGIN  # short: Kiwi gives back
    assert hostmem.host_free(tmp_path / "nowhere") is None


def write_meminfo(path: Path, available: int) -> None:
    path.write_text(f"MemTotal: {100 * GiB // 1024} kB\nMemAvailable: {available // 1024} kB\n")


def evicted_peer(node: Node, name: str, nbytes: int):
    """A ``tiers`` kernel of the daemon that held the GPU, filled ``nbytes`` and was evicted."""
    peer = node.client(name, features=[p.FEATURE_MEMORY, p.FEATURE_TIERS], evict="vmm",
                       resident=0, host=0, working_set=nbytes)
    assert peer.request(p.ACQUIRE)["op"] == p.GRANT
    assert peer.request(p.WORKING_SET, bytes=nbytes, resident=nbytes, host=0)["op"] == p.OK
    peer.send(p.encode(p.RELEASE, evicting=True))
    assert peer.request(p.EVICTED, resident=0, host=nbytes, moved=nbytes,
                        seconds=0.1)["op"] == p.OK
    return peer


def test_the_daemon_reads_the_host_again_and_a_shrinking_host_spills(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    write_meminfo(meminfo, MARGIN + 8 * GiB)
    with Node(gpu_memory=10 * GiB, meminfo=meminfo, memory_reserve=0, spill_after=0) as node:
        a = evicted_peer(node, "nbA", 6 * GiB)
        # The eviction took 6 GiB of the host's: its budget stays 8 GiB at the next read.
        write_meminfo(meminfo, MARGIN + 2 * GiB)
        node.sleep(HOST_READ_EVERY)
        assert node.status()["gpus"][0]["host_budget"] == 8 * GiB
        assert not [m for m in a.lines() if m["op"] == p.SPILL]
        # Another tenant takes 5 GiB: 3 GiB short of what a holds; a is asked to spill.
        write_meminfo(meminfo, MARGIN - 3 * GiB)
        node.sleep(HOST_READ_EVERY)
        assert node.status()["gpus"][0]["host_budget"] == 3 * GiB
        assert [m["op"] for m in a.lines() if m["op"] == p.SPILL] == [p.SPILL]


def test_an_acquire_reads_the_host_again_when_the_last_read_is_old(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    write_meminfo(meminfo, MARGIN + 8 * GiB)
    with Node(gpu_memory=10 * GiB, meminfo=meminfo, memory_reserve=0, spill_after=0) as node:
        evicted_peer(node, "nbA", 6 * GiB)
        node.sleep(HOST_READ_EVERY)  # read: its 6 GiB and 8 GiB free
        assert node.status()["gpus"][0]["host_budget"] == 14 * GiB
        write_meminfo(meminfo, MARGIN + 6 * GiB)  # another tenant took 2 GiB
        b = node.client("nbB", features=[p.FEATURE_MEMORY, p.FEATURE_TIERS], evict="vmm",
                        resident=0, host=0)
        node.sleep(HOST_READ_FRESH)  # less than HOST_READ_EVERY: no timer read since
        assert b.request(p.ACQUIRE)["op"] == p.GRANT
        assert node.status()["gpus"][0]["host_budget"] == 12 * GiB
