"""Host memory: the room an eviction has, read from /proc and the cgroup v2 tree.

The readers take their roots as arguments, so most tests lay out real files the way the kernel
does; one reads this machine's own, and one runs the daemon."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from support import wait_on_client

from nodeside.client import Client
from nodeside.daemon import hostmem

GiB = 1 << 30


def layout(tmp_path: Path, *, available_kib: int, cgroup: str,
           levels: dict[str, tuple[str, str]]) -> tuple[Path, Path]:
    """A /proc with meminfo and process 42 in cgroup, and a cgroup tree whose levels
    (path -> (memory.max, memory.current)) are given."""
    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "42").mkdir(parents=True)
    (proc / "meminfo").write_text(f"MemTotal: 99999999 kB\nMemAvailable: {available_kib} kB\n")
    (proc / "42" / "cgroup").write_text(f"0::{cgroup}\n")
    for path, (limit, current) in levels.items():
        directory = root / path.lstrip("/")
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "memory.max").write_text(limit + "\n")
        (directory / "memory.current").write_text(current + "\n")
    return proc, root


def test_the_pods_cgroup_bounds_the_room_when_it_is_tighter_than_the_host(tmp_path) -> None:
    proc, root = layout(tmp_path, available_kib=64 * 1024 * 1024, cgroup="/kubepods/pod-a",
                        levels={"/kubepods": ("max", str(10 * GiB)),
                                "/kubepods/pod-a": (str(16 * GiB), str(12 * GiB))})
    room = hostmem.room_for(42, proc=proc, root=root)
    assert room == hostmem.HostRoom(4 * GiB, "cgroup /kubepods/pod-a")


def test_a_parent_cgroups_limit_counts_too(tmp_path) -> None:
    proc, root = layout(tmp_path, available_kib=64 * 1024 * 1024, cgroup="/kubepods/pod-a",
                        levels={"/kubepods": (str(20 * GiB), str(19 * GiB)),
                                "/kubepods/pod-a": ("max", str(5 * GiB))})
    assert hostmem.room_for(42, proc=proc, root=root).available == 1 * GiB


def test_without_a_cgroup_limit_the_host_bounds_the_room(tmp_path) -> None:
    proc, root = layout(tmp_path, available_kib=3 * 1024 * 1024, cgroup="/user.slice",
                        levels={"/user.slice": ("max", str(GiB))})
    assert hostmem.room_for(42, proc=proc, root=root) == hostmem.HostRoom(3 * GiB, "host")


def test_the_budget_for_evicted_memory_is_what_it_holds_plus_what_the_host_has(tmp_path) -> None:
    proc, _ = layout(tmp_path, available_kib=3 * 1024 * 1024, cgroup="/user.slice", levels={})
    assert hostmem.evictions_budget(2 * GiB, proc=proc) == 5 * GiB
    assert hostmem.evictions_budget(0, proc=tmp_path / "nowhere") is None


def test_an_eviction_that_does_not_fit_is_said_so_and_one_that_fits_is_not() -> None:
    room = hostmem.HostRoom(4 * GiB, "cgroup /kubepods/pod-a")
    said = hostmem.eviction_shortfall(6 * GiB, room)
    assert said == ("no room in host memory for an eviction of 6.0 GiB: 4.0 GiB left in the "
                    "cgroup /kubepods/pod-a")
    assert hostmem.eviction_shortfall(4 * GiB, room) is None
    assert hostmem.eviction_shortfall(None, room) is None
    assert hostmem.eviction_shortfall(6 * GiB, None) is None


def test_this_machines_own_room_is_read(tmp_path) -> None:
    room = hostmem.room_for(os.getpid())
    assert room is not None and room.available > 0
    assert hostmem.room_for(None, proc=tmp_path) is None  # nothing readable: nothing known


def test_the_daemon_says_when_an_eviction_has_no_room(start_daemon) -> None:
    daemon = start_daemon("--tq", "0.05", "--gpus", "1", "--gpu-memory", "8GiB", "--grace", "30")
    huge = 2 ** 49  # more than any host has
    with Client(daemon.socket, name="huge") as holder, \
            Client(daemon.socket, name="next") as next_holder:
        holder.acquire(timeout=5)  # connected: the report below reaches the daemon whole
        holder.report_working_set(huge, evictable=huge)
        next_holder.report_working_set(6 * GiB)
        acquiring = threading.Thread(target=next_holder.acquire, kwargs={"timeout": 20})
        acquiring.start()
        daemon.wait_log(r"to evict: no room in host memory for an eviction of 512\.0 TiB")
        holder.release()
        acquiring.join(timeout=20)
        wait_on_client(next_holder, lambda: next_holder.holding, what="the next holder's grant")
