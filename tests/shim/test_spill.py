"""The shim's side of the disk tier (issue 42, the hello feature `tiers`): `spill` moves an
evicted kernel's host copy to unnamed files in its uid's directory under KIWI_SPILL_DIR, `fetch`
brings it back a tier, a grant restores from disk, `pin_budget` changes the pin budget; and
every fault (a full or failing disk, a corrupt block, an unsafe directory, kill -9 mid-spill)
loses nothing and tells the daemon why in `tier_moved`.

The daemon is scripted (scripted_daemon.py) until the daemon's side of `tier_moved` lands; the
rest is real: the shim, the fake driver's card, files on this machine's disk. Disk faults come
from fault_io.c, a test library preloaded beside the shim; nothing of it ships.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_device import FakeCard
from scripted_daemon import Message, ScriptedDaemon
from shim_harness import preload
from support import wait_for
from test_vmm_evictor import holds, pattern

MiB = 1 << 20
#: Three allocations of 6 MiB: several 4 MiB blocks, blocks that hold two allocations' bytes.
SIZE = 6 * MiB
COUNT = 3
HERE = Path(__file__).parent


@pytest.fixture(scope="session")
def fault_io(tmp_path_factory: pytest.TempPathFactory) -> Path:
    output = tmp_path_factory.mktemp("fault-io") / "libfaultio.so"
    subprocess.run(["gcc", "-std=c11", "-O1", "-fPIC", "-shared", "-Wall", "-Werror", "-o",
                    str(output), str(HERE / "fault_io.c")],
                   check=True, capture_output=True, text=True)
    return output


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[ScriptedDaemon]:
    scripted = ScriptedDaemon(tmp_path / "tiers.sock", features=("position", "memory", "tiers"))
    yield scripted
    scripted.close()


@pytest.fixture
def spill_dir(tmp_path: Path) -> Path:
    # Made by the shim at its first spill; direct I/O where the test's filesystem takes it.
    return tmp_path / "spill"


@pytest.fixture
def kernel(workload, card: FakeCard, daemon: ScriptedDaemon, spill_dir: Path, shim_library: Path,
           fault_io: Path):
    """Starts a shimmed process on the vmm evictor with its spill directory; plan: the disk's
    faults (fault_io.c), none by default."""
    def begin(plan: str = "", **env: str):
        shim = preload(shim_library)
        # First of all, even before a sanitizer's runtime: a sanitizer's own pwrite and pread
        # would call the C library's past this one (its transfers are system calls of its own).
        faulty = f"{fault_io}:{shim['LD_PRELOAD']}"
        asan = shim.get("ASAN_OPTIONS")
        sanitizer = {"ASAN_OPTIONS": f"{asan}:verify_asan_link_order=0"} if asan else {}
        return workload(KIWI_SOCKET=str(daemon.path), KIWI_EVICT="vmm",
                        KIWI_SPILL_DIR=str(spill_dir), LD_PRELOAD=faulty, FAULT_IO_PLAN=plan,
                        FAULT_IO_DIR=str(spill_dir), **sanitizer, **card.env, **env)
    return begin


def filled(w) -> list[int]:
    """COUNT allocations of SIZE, each filled with its own pattern, then idle and evicted to
    host memory by the daemon's `evict`."""
    pointers = [w.call(f"d.alloc({SIZE})") for _ in range(COUNT)]
    assert w.call("d.launch()") == 0
    for i, ptr in enumerate(pointers):
        assert w.call(f"d.write({ptr}, {pattern(i, SIZE)!r})") == 0
    w.call("shim.release()")
    return pointers


def evicted(w, daemon: ScriptedDaemon) -> Message:
    daemon.wait_op("release")
    daemon.send(op="evict", gpu=0, bytes=COUNT * SIZE, **{"for": "nbB.ipynb"})
    report = daemon.wait_op("evicted")
    assert "failed" not in report and report["host"] == COUNT * SIZE
    return report


def tier_moved(daemon: ScriptedDaemon, nth: int = 1) -> Message:
    """The nth `tier_moved` the shim sent, once it has."""
    daemon.wait_op("tier_moved")
    moved: Message = wait_for(lambda: len(daemon.messages("tier_moved")) >= nth and
                              daemon.messages("tier_moved")[nth - 1],
                              what=f"tier_moved number {nth}")
    return moved


def intact(w, pointers: list[int]) -> bool:
    """Every allocation holds its pattern (read through the shim: the read waits for the
    grant, and so for the restore)."""
    return all(holds(w, ptr, pattern(i, SIZE)) for i, ptr in enumerate(pointers))


def uid_dir(spill_dir: Path) -> Path:
    return spill_dir / f"uid-{os.geteuid()}"


# ---- the way out and back ------------------------------------------------------------------

def test_hello_asks_for_tiers(daemon, kernel) -> None:
    w = kernel()
    w.call(f"d.alloc({MiB})")  # the shim connects at its first call
    assert "tiers" in daemon.wait_op("hello")["features"]


def test_a_spill_moves_host_memory_to_unnamed_files_and_a_grant_restores_it(
        daemon, kernel, card, spill_dir) -> None:
    w = kernel()
    pointers = filled(w)
    evicted(w, daemon)
    daemon.send(op="spill", gpu=0)
    moved = tier_moved(daemon)
    assert "failed" not in moved, moved["failed"]
    assert (moved["tier"], moved["host"], moved["disk"], moved["moved"]) == (
        "disk", 0, COUNT * SIZE, COUNT * SIZE)
    w.call(f"d.alloc({MiB})")  # while away: addresses only, and a report
    report = daemon.wait_for(lambda m: m["op"] == "working_set" and m.get("disk"),
                             what="a report with the memory on disk")
    assert (report["host"], report["disk"]) == (0, COUNT * SIZE)
    mode = uid_dir(spill_dir).stat().st_mode
    assert stat.S_IMODE(mode) == 0o700 and not list(uid_dir(spill_dir).iterdir())
    assert card.used_by(w.process.pid) == 0
    assert intact(w, pointers)
    back = daemon.wait_for(lambda m: m["op"] == "working_set" and
                           m.get("resident") == COUNT * SIZE, what="the report after the restore")
    assert (back["host"], back["disk"]) == (0, 0)


def test_fetch_host_reads_the_spill_back_into_host_memory(daemon, kernel) -> None:
    w = kernel()
    pointers, back = spilled_then_fetched(w, daemon)
    assert "failed" not in back, back["failed"]
    assert (back["tier"], back["host"], back["disk"], back["moved"]) == (
        "host", COUNT * SIZE, 0, COUNT * SIZE)
    assert intact(w, pointers)


def test_fetch_gpu_restores_without_a_grant(daemon, kernel, card) -> None:
    w = kernel()
    pointers = filled(w)
    evicted(w, daemon)
    grants = len(daemon.messages("acquire"))
    reports = len(daemon.messages("working_set"))
    daemon.send(op="fetch", gpu=0, tier="gpu")
    daemon.wait_for(lambda m: m["op"] == "working_set" and
                    daemon.messages("working_set").index(m) >= reports and
                    m.get("resident") == COUNT * SIZE and m["host"] == 0,
                    what="the report that ends the restore")
    assert card.used_by(w.process.pid) == COUNT * SIZE
    assert len(daemon.messages("acquire")) == grants  # it never asked for the GPU
    assert intact(w, pointers)


def test_a_spill_of_some_bytes_moves_at_least_that_much(daemon, kernel) -> None:
    w = kernel()
    pointers = filled(w)
    evicted(w, daemon)
    daemon.send(op="spill", gpu=0, bytes=SIZE)
    moved = tier_moved(daemon)
    assert moved["tier"] == "disk" and moved["disk"] >= SIZE
    assert moved["host"] + moved["disk"] == COUNT * SIZE and moved["host"] > 0
    assert intact(w, pointers)


def test_a_smaller_pin_budget_unpins_shadows_of_memory_on_the_card(daemon, kernel) -> None:
    w = kernel()
    pointers = filled(w)
    pinned = wait_for(lambda: w.stats()["host_shadow_pinned"] >= COUNT * SIZE and w.stats(),
                      what="the shadows pinned ahead")
    assert pinned["pin_budget"] > 4 * MiB
    reports = len(daemon.messages("working_set"))
    daemon.send(op="pin_budget", pin_budget=4 * MiB)
    after = wait_for(lambda: (s := w.stats())["pin_budget"] == 4 * MiB and
                     s["host_shadow_pinned"] + s["host_staging"] <= 4 * MiB and s,
                     what="the shadows over the new budget unpinned")
    assert after["host_shadow_pinned"] < pinned["host_shadow_pinned"]
    told = daemon.wait_for(lambda m: m["op"] == "working_set" and
                           daemon.messages("working_set").index(m) >= reports and
                           m["pinned"] <= 4 * MiB, what="the report of what is pinned now")
    assert told["resident"] == COUNT * SIZE
    assert intact(w, pointers)


def test_a_pin_budget_during_a_way_out_never_holds_up_the_kernels_word(
        daemon, kernel, tmp_path) -> None:
    # The way out waits inside the driver at its first unmap, holding the evictor's lock; the
    # daemon's pin_budget comes meanwhile. The comm thread took that lock to set the budget and
    # said nothing more until the way out ended: no progress report, no ask for the GPU (the
    # daemon checkpointed such a kernel in the middle of its move for making no progress).
    gate = tmp_path / "unmap-may-go"
    w = kernel(FAKE_CUDA_UNMAP_GATE=str(gate), KIWI_SHIM_LOG="1")
    pointers = filled(w)
    daemon.wait_op("release")
    daemon.send(op="evict", gpu=0, bytes=COUNT * SIZE, **{"for": "nbB.ipynb"})
    wait_for(lambda: w.log.calls("cuMemcpyDtoHAsync_v2"), what="the way out's first copies")
    daemon.send(op="pin_budget", pin_budget=4 * MiB)
    wait_for(lambda: any(f"pin budget: {4 * MiB} bytes" in line for line in w.stderr),
             what="the comm thread to take the budget while the way out is held")
    w.call("shim.cell_begin()")  # and the cell still asks for the GPU through it
    daemon.wait_op("acquire")
    assert not daemon.messages("evicted")  # still held in the driver
    gate.touch()
    assert "failed" not in daemon.wait_op("evicted")
    wait_for(lambda: w.stats()["pin_budget"] == 4 * MiB, what="the new budget taken")
    assert intact(w, pointers)  # granted at once by this daemon: restored


def test_a_spill_while_holding_is_refused_with_a_reason(daemon, kernel) -> None:
    w = kernel()
    w.call(f"d.alloc({SIZE})")
    assert w.call("d.launch()") == 0  # holding now
    daemon.send(op="spill", gpu=0)
    moved = tier_moved(daemon)
    assert "holding" in moved["failed"]


# ---- faults: nothing lost, the daemon told why ----------------------------------------------

@pytest.mark.parametrize("plan, reason", [
    ("write:2:ENOSPC", "No space left on device"),
    ("write:3:EIO", "Input/output error"),
])
def test_a_failing_write_leaves_the_memory_in_host_memory(daemon, kernel, spill_dir, plan,
                                                          reason) -> None:
    w = kernel(plan)
    pointers = filled(w)
    evicted(w, daemon)
    daemon.send(op="spill", gpu=0)
    moved = tier_moved(daemon)
    assert reason in moved["failed"]
    assert (moved["tier"], moved["host"], moved["disk"]) == ("host", COUNT * SIZE, 0)
    assert not list(uid_dir(spill_dir).iterdir())
    assert intact(w, pointers)


def spilled_then_fetched(w, daemon) -> tuple[list[int], dict]:
    """w's memory filled, evicted, spilled, and asked back to host memory: its pointers, and
    the fetch's `tier_moved`."""
    pointers = filled(w)
    evicted(w, daemon)
    daemon.send(op="spill", gpu=0)
    tier_moved(daemon)
    daemon.send(op="fetch", gpu=0, tier="host")
    return pointers, tier_moved(daemon, 2)


def test_a_failing_read_keeps_the_memory_on_disk_and_the_next_read_brings_it(
        daemon, kernel) -> None:
    w = kernel("read:1:EIO")
    pointers, failed = spilled_then_fetched(w, daemon)
    assert "Input/output error" in failed["failed"]
    assert (failed["tier"], failed["host"], failed["disk"]) == ("disk", 0, COUNT * SIZE)
    assert intact(w, pointers)  # the grant's restore reads it again


def test_a_corrupt_block_is_read_again(daemon, kernel) -> None:
    w = kernel("read:1-2:corrupt")
    pointers, back = spilled_then_fetched(w, daemon)
    assert "failed" not in back and back["tier"] == "host"
    assert "does not match its checksum" in "".join(w.stderr)
    assert intact(w, pointers)


def test_a_block_that_stays_corrupt_fails_clearly_and_stays_on_disk(daemon, kernel) -> None:
    w = kernel("read:1-1000:corrupt")
    filled(w)
    evicted(w, daemon)
    daemon.send(op="spill", gpu=0)
    tier_moved(daemon)
    daemon.send(op="fetch", gpu=0, tier="host")
    failed = tier_moved(daemon, 2)
    assert "checksum mismatch" in failed["failed"]
    assert (failed["tier"], failed["disk"]) == ("disk", COUNT * SIZE)


def test_an_unsafe_spill_directory_is_refused(daemon, kernel, spill_dir) -> None:
    uid_dir(spill_dir).mkdir(parents=True)
    uid_dir(spill_dir).chmod(0o777)
    w = kernel()
    pointers = filled(w)
    evicted(w, daemon)
    daemon.send(op="spill", gpu=0)
    moved = tier_moved(daemon)
    assert "unsafe" in moved["failed"] and "others may write" in moved["failed"]
    assert (moved["tier"], moved["host"], moved["disk"]) == ("host", COUNT * SIZE, 0)
    assert intact(w, pointers)


def test_a_spill_directory_that_cannot_be_made_is_said(daemon, kernel, spill_dir) -> None:
    spill_dir.write_text("a file where the directory would go")
    w = kernel()
    pointers = filled(w)
    evicted(w, daemon)
    daemon.send(op="spill", gpu=0)
    moved = tier_moved(daemon)
    assert "cannot make the spill directory" in moved["failed"]
    assert intact(w, pointers)


def test_kill_9_mid_spill_leaves_no_file(daemon, kernel, spill_dir, tmp_path) -> None:
    mark = tmp_path / "writing"
    w = kernel("write:2:hang", FAULT_IO_MARK=str(mark))
    filled(w)
    evicted(w, daemon)
    daemon.send(op="spill", gpu=0)
    wait_for(mark.exists, what="the spill's second write")
    pid = w.process.pid
    open_files = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    assert [f for f in open_files if f.startswith(str(uid_dir(spill_dir)))]
    assert not list(uid_dir(spill_dir).iterdir())  # it has no name, even now
    os.kill(pid, signal.SIGKILL)
    w.process.wait()
    assert not list(uid_dir(spill_dir).iterdir())
