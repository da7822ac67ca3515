"""A vmm way out that takes its time, and a process the daemon checkpointed (issue 39 item 0b,
and the part of item 1 that has a vmm cell ask for the GPU as it begins).

The real daemon loads the fake driver and can checkpoint the shimmed processes, as on any r570+
node (conftest's ``checkpointing``). The fake driver's modelled link (``FAKE_CUDA_LINK_GBPS``,
pinned and pageable alike here) moves one 256 MiB chunk to host memory in 0.6 of the daemon's
``evict_timeout`` (2 s on a quiet machine, stretched with the load: it is a safety net), one copy
after another on the card's copy engine, so an eviction of three chunks lasts 1.8 of it, each
chunk's report a progress that puts the deadline off; ``FAKE_CUDA_UNMAP_GATE`` holds
a way out at its first unmap.

- A way out that reports progress is never checkpointed in the middle of it (its deadline
  follows its reports), and its kernel goes on afterwards: before, the daemon checkpointed it
  from outside at 2 s, its move blocked inside the driver, and its next GPU work hung for good.
  So too when its shadows are not pinned and it goes through the staging ring: there each chunk
  queued waited for the ring's slots before the chunks done were reported, and the first
  report came after the deadline.
- The way out runs on a thread of its own: while it is held in the driver, a cell of the same
  kernel still asks the daemon for the GPU.
- A vmm cell asks for the GPU as it begins while its memory is away, so the restore starts at
  once; and a process the daemon checkpointed while away (idle past ``checkpoint_after``) is
  brought back by its next cell, even when that cell's first CUDA call is one no gate sees.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from fake_device import FakeCard
from support import DaemonProcess, StatusEvents, scaled
from test_memory_e2e import Kernel

MiB = 1 << 20
#: One physical handle, and the shim's step between two progress reports (KIWI_PROGRESS_BYTES).
REPORTED = 256 * MiB
#: The chunk of the tests that need no progress report: a sanitizer checks each byte the way
#: out and the way back copy (under ThreadSanitizer 256 MiB chunks made each test 30-80 s),
#: and a smaller handle proves the same moves.
CHUNK = 32 * MiB if os.environ.get("KIWI_TEST_SANITIZE") else REPORTED
RESERVE = 512 * MiB  #: the daemon's default memory_reserve
#: The shim's staging ring (vmm_builder.c), pinned within the kernel's pin budget before shadows.
RING = 256 * MiB


def working_set(chunk: int) -> int:
    return 3 * chunk


def slow_link() -> tuple[float, dict[str, str]]:
    """The daemon's evict_timeout in the slow way out's test (stretched by the load as the
    test starts, not as the run started), and a link (GB/s: 10^9 bytes) that moves one chunk
    in 0.6 of it, from pinned and pageable memory alike."""
    evict_timeout = scaled(2.0)
    gbps = f"{REPORTED / (0.6 * evict_timeout) / 1e9:.6f}"
    return evict_timeout, {"FAKE_CUDA_LINK_GBPS": gbps, "FAKE_CUDA_PAGEABLE_GBPS": gbps}


def daemon_with(checkpointing, tmp_path: Path, config: str, chunk: int) -> DaemonProcess:
    """The checkpointing daemon with room for the working sets of both kernels but one chunk
    (a grant waits for two chunks out), a quantum and grace long enough that only the
    kernels' own releases move the GPU."""
    path = tmp_path / "kiwi.yaml"
    path.write_text(config)
    room = working_set(chunk) + chunk
    return checkpointing("--gpu-memory", f"{(RESERVE + room) // MiB}MiB", "--tq", "60",
                         "--grace", "60", "--config", str(path))


def client(document: dict[str, Any], kernel: Kernel) -> dict[str, Any]:
    return next(c for c in document["clients"] if c["pid"] == kernel.pid)


def pair(checkpointing, tmp_path: Path, workload, card: FakeCard, watch, config: str,
         chunk: int = CHUNK, **a_env: str) -> tuple[DaemonProcess, StatusEvents, Kernel, Kernel]:
    """The daemon, its watcher, and two kernels of three chunks each: A wrote its chunks and
    gave the GPU back (it stays resident); B has its own; the daemon has heard both."""
    daemon = daemon_with(checkpointing, tmp_path, config, chunk)
    events = watch(daemon)
    sizes = (chunk, chunk, chunk)
    a = Kernel(workload, card, daemon, "nbA.ipynb", sizes, **a_env)
    a.write()
    a.release()
    b = Kernel(workload, card, daemon, "nbB.ipynb", sizes)
    events.wait_for(lambda d: all(
        any(c["pid"] == k.pid and c["resident_bytes"] == working_set(chunk)
            for c in d["clients"])
        for k in (a, b)), what="both working sets on the GPU")
    return daemon, events, a, b


@pytest.mark.parametrize("shadows", ["pinned", "staged"])
def test_a_slow_way_out_that_reports_progress_is_never_checkpointed_in_the_middle(
        checkpointing, tmp_path, workload, card, watch, shadows) -> None:
    evict_timeout, link = slow_link()
    if shadows == "staged":  # a pin budget of the ring and a little: no chunk's shadow pinned
        link["KIWI_VMM_PIN_BUDGET"] = f"{(RING + REPORTED // 4) // MiB}MiB"
    daemon, events, a, b = pair(checkpointing, tmp_path, workload, card, watch,
                                f"evict_timeout: {evict_timeout:g}\n", REPORTED, **link)
    # b's grant asks a (idle) to move out; its way out lasts 1.8 evict_timeouts, and reports
    # each chunk out (0.6 of one apart): b is granted once two chunks are out.
    assert b.w.call("d.launch()", timeout=30) == 0
    document = events.wait_for(
        lambda d: client(d, a)["residency"] == "evicted" and d, timeout=30,
        what="a's way out to end")
    assert client(document, a)["checkpoint_state"] == "running"
    # Pinned: the ring and every chunk's shadow; staged: no chunk's.
    assert (client(document, a)["pinned_bytes"] < RING + REPORTED) == (shadows == "staged")
    assert f"pid {a.pid})" not in daemon.log()  # the daemon never checkpointed it
    assert (a.card.used_by(a.pid), a.card.processes()[a.pid].checkpointed) == (0, 0)
    stats = a.w.stats()
    assert (stats["evictions"], stats["bytes_evicted"], stats["evicted"]) == (
        1, working_set(REPORTED), True)
    b.release()
    a.turn()  # its next GPU work: granted, restored, its bytes at the same addresses
    assert a.card.used_by(a.pid) == working_set(REPORTED)


def test_a_cell_asks_for_the_gpu_while_its_way_out_is_held_in_the_driver(
        checkpointing, tmp_path, workload, card, watch) -> None:
    gate = tmp_path / "unmap-may-go"
    _, events, a, b = pair(checkpointing, tmp_path, workload, card, watch,
                           "evict_timeout: 120\n", FAKE_CUDA_UNMAP_GATE=str(gate))
    launch = b.w.start("d.launch()")
    events.wait_for(lambda d: client(d, a)["residency"] == "evicting", what="a's way out")
    # The way out waits inside the driver, at its first unmap; a's next cell begins meanwhile.
    a.w.call("shim.cell_begin()")
    events.wait_for(lambda d: client(d, a)["state"] == "waiting" and
                    client(d, a)["residency"] == "evicting",
                    what="a to ask for the GPU while its memory is on its way out")
    assert not launch.done()
    gate.touch()
    assert launch.result(timeout=scaled(30)) == 0
    b.release()
    a.turn()
    assert (a.card.used_by(a.pid), b.card.used_by(b.pid)) == (working_set(CHUNK), 0)


def test_a_vmm_cell_asks_for_the_gpu_as_it_begins_while_its_memory_is_away(
        checkpointing, tmp_path, workload, card, watch) -> None:
    _, events, a, b = pair(checkpointing, tmp_path, workload, card, watch,
                           "checkpoint_after: 0\nevict_timeout: 120\n")
    assert b.w.call("d.launch()", timeout=30) == 0
    events.wait_for(lambda d: client(d, a)["residency"] == "evicted", what="a in host memory")
    b.release()
    a.w.call("shim.cell_begin()")  # no GPU call: the cell only began
    events.wait_for(lambda d: client(d, a)["state"] == "holding" and
                    client(d, a)["residency"] == "resident", what="a granted and restored")
    assert a.card.used_by(a.pid) == working_set(CHUNK)
    a.turn()


def test_a_vmm_kernel_checkpointed_while_away_is_brought_back_by_its_next_cell(
        checkpointing, tmp_path, workload, card, watch) -> None:
    daemon, events, a, b = pair(checkpointing, tmp_path, workload, card, watch,
                                "checkpoint_after: 1\nevict_timeout: 120\n")
    assert b.w.call("d.launch()", timeout=30) == 0
    # Evicted and idle past checkpoint_after: the daemon checkpoints it (its context goes too).
    # (The daemon tells watchers of no change when a checkpoint ends: its log says it.)
    daemon.wait_log(rf"Checkpointed \S+ \(c\d+, pid {a.pid}\)", timeout=30)
    assert client(events.status(), a)["checkpoint_state"] == "checkpointed"
    b.release()
    a.w.call("shim.cell_begin()")
    # The cell's first CUDA call is an allocation, which no gate sees: it blocks in the driver
    # while the process is checkpointed, and returns once the daemon has restored it (on the
    # grant the cell's beginning asked for).
    assert a.w.call(f"d.alloc({CHUNK})", timeout=30) > 0
    a.turn()
    document = events.status()
    assert client(document, a)["checkpoint_state"] == "running"
