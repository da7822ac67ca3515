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
import re
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


# ---- a restore from disk to the card: disk -> the staging ring -> GPU, pipelined ---------------

#: Four chunks of 16 MiB: sixteen spill blocks, each its own read and its own copy to the card.
CHUNK = 16 * MiB
CHUNKS = 4


def marked(w) -> list[int]:
    """CHUNKS allocations of CHUNK, a pattern at each one's start and end (the rest zeros: all of
    it live, copied both ways), then idle; once the staging ring is pinned (a restore from disk
    goes through it)."""
    pointers = [w.call(f"d.alloc({CHUNK})") for _ in range(CHUNKS)]
    assert w.call("d.launch()") == 0
    for i, ptr in enumerate(pointers):
        assert w.call(f"d.write({ptr}, {pattern(i, 64)!r})") == 0
        assert w.call(f"d.write({ptr + CHUNK - 64}, {pattern(i + 7, 64)!r})") == 0
    wait_for(lambda: w.stats()["host_staging"] > 0, what="the staging ring pinned")
    w.call("shim.release()")
    return pointers


def marks_intact(w, pointers: list[int]) -> bool:
    return all(holds(w, ptr, pattern(i, 64)) and holds(w, ptr + CHUNK - 64, pattern(i + 7, 64))
               for i, ptr in enumerate(pointers))


def spilled(w, daemon: ScriptedDaemon) -> list[int]:
    """w's marked memory evicted and spilled whole: its pointers."""
    pointers = marked(w)
    daemon.wait_op("release")
    daemon.send(op="evict", gpu=0, bytes=CHUNKS * CHUNK, **{"for": "nbB.ipynb"})
    assert "failed" not in daemon.wait_op("evicted")
    daemon.send(op="spill", gpu=0)
    moved = tier_moved(daemon)
    assert "failed" not in moved and moved["disk"] == CHUNKS * CHUNK, moved
    return pointers


def intervals(log: Path, kind: str) -> list[tuple[int, int]]:
    """(start, end) in ns of each line of kind in a log of fault_io.c's or the fake link's."""
    lines = log.read_text().splitlines() if log.exists() else []
    return [(int(re.search(r"start=(\d+)", line)[1]), int(re.search(r"end=(\d+)", line)[1]))
            for line in lines if line.startswith(kind)]


def covered(spans: list[tuple[int, int]]) -> int:
    """How long (ns) at least one of spans is under way."""
    total, reached = 0, 0
    for start, end in sorted(spans):
        total += max(0, end - max(start, reached))
        reached = max(reached, end)
    return total


def failed_restore(daemon: ScriptedDaemon) -> Message:
    """The `evicted` with which the shim gave a grant back after its restore failed."""
    return daemon.wait_for(lambda m: m["op"] == "evicted" and "failed" in m,
                           what="the failed restore's report")


def test_a_restore_from_disk_copies_each_block_to_the_card_while_the_next_are_read(
        daemon, kernel, tmp_path) -> None:
    io_log = tmp_path / "io.log"
    # A slow disk (50 ms a block) and a slow link (4 MiB in 21 ms): in series, 0.2 + 0.34 s.
    w = kernel("read:1-100000:delay:50", FAULT_IO_LOG=str(io_log), FAKE_CUDA_LINK_GBPS="0.2")
    pointers = spilled(w, daemon)
    w.log.clear()
    assert marks_intact(w, pointers)  # the grant restores, from disk
    reads = intervals(io_log, "pread")
    copies = intervals(w.log.path, "link engine=to-device")
    assert len(reads) == CHUNKS * CHUNK // (4 * MiB)  # each block read once
    assert min(start for start, _ in copies) < max(end for _, end in reads)
    # The disk and the link were busy at once: together less than the two in series (the CPU's
    # own time between them, which a busy machine stretches, left out).
    assert covered(reads + copies) < covered(reads) + covered(copies)


def vm_kib(pid: int, field: str) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", status, re.M)[1])


@pytest.mark.skipif(os.environ.get("KIWI_TEST_SANITIZE") == "thread",
                    reason="ThreadSanitizer's shadow of every byte copied counts in the RSS")
def test_a_restore_from_disk_takes_no_more_host_memory_than_the_staging_ring(
        daemon, kernel) -> None:
    # A pin budget of 128 MiB: a ring of 32 MiB, whatever the CPUs (vmm_builder.c).
    w = kernel(KIWI_VMM_PIN_BUDGET=str(128 * MiB))
    pointers = spilled(w, daemon)
    ring = w.stats()["host_staging"]
    assert ring == 32 * MiB
    pid = w.process.pid
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak RSS starts again from here
    before = vm_kib(pid, "VmRSS") * 1024
    assert marks_intact(w, pointers)
    # The fake card's memory is the process's own: the restored bytes count once in its RSS,
    # and the ring; through host shadows, the whole set would count twice.
    grew = vm_kib(pid, "VmHWM") * 1024 - before
    assert grew <= CHUNKS * CHUNK + ring + 16 * MiB, grew


def test_without_a_staging_ring_a_restore_from_disk_goes_through_host_memory(
        daemon, kernel) -> None:
    w = kernel(KIWI_VMM_SHADOW="pageable")  # nothing pinned: no ring to stream through
    pointers = filled(w)
    evicted(w, daemon)
    daemon.send(op="spill", gpu=0)
    assert "failed" not in tier_moved(daemon)
    assert w.stats()["host_staging"] == 0
    assert intact(w, pointers)


def test_a_failing_read_rolls_a_restore_to_the_card_back_and_the_next_grant_restores(
        daemon, kernel, card) -> None:
    w = kernel("read:2:EIO")
    pointers = spilled(w, daemon)
    launched = w.start("d.launch()")  # the grant's restore fails; the next grant's does not
    failed = failed_restore(daemon)
    assert "reading block" in failed["failed"] and "Input/output error" in failed["failed"]
    assert (failed["resident"], failed["disk"]) == (0, CHUNKS * CHUNK)
    assert launched.result(timeout=30) == 0
    assert card.used_by(w.process.pid) == CHUNKS * CHUNK
    assert marks_intact(w, pointers)


def test_a_ring_the_kernel_refuses_for_a_direct_read_is_filled_through_a_buffer(
        daemon, kernel, tmp_path) -> None:
    io_log = tmp_path / "io.log"
    w = kernel("read:1:EFAULT", FAULT_IO_LOG=str(io_log))
    pointers = spilled(w, daemon)
    assert marks_intact(w, pointers)
    # The refused read is not logged (it moved nothing); its block is read again elsewhere.
    assert len(intervals(io_log, "pread")) == CHUNKS * CHUNK // (4 * MiB)
    assert not [m for m in daemon.messages("evicted") if "failed" in m]


def test_a_block_corrupt_once_is_read_again_on_the_way_to_the_card(daemon, kernel) -> None:
    w = kernel("read:3:corrupt")
    pointers = spilled(w, daemon)
    assert marks_intact(w, pointers)
    assert "does not match its checksum" in "".join(w.stderr)
    assert not [m for m in daemon.messages("evicted") if "failed" in m]


def test_a_block_that_stays_corrupt_fails_the_restore_and_leaves_the_card_empty(
        daemon, kernel, card) -> None:
    w = kernel("read:1-100000:corrupt")
    spilled(w, daemon)
    w.start("d.launch()")  # never returns: each grant's restore fails the same way
    failed = failed_restore(daemon)
    assert "checksum mismatch" in failed["failed"]
    assert (failed["resident"], failed["disk"]) == (0, CHUNKS * CHUNK)
    assert card.used_by(w.process.pid) == 0


def test_kill_9_mid_restore_leaves_no_file(
        daemon, kernel, card, spill_dir, tmp_path) -> None:
    mark = tmp_path / "reading"
    w = kernel("read:5:hang", FAULT_IO_MARK=str(mark))
    spilled(w, daemon)
    w.start("d.launch()")
    wait_for(mark.exists, what="the restore's fifth read")
    pid = w.process.pid
    wait_for(lambda: card.used_by(pid) > 0, what="the first chunks on the card, mid-restore")
    os.kill(pid, signal.SIGKILL)
    w.process.wait()
    assert not list(uid_dir(spill_dir).iterdir())
