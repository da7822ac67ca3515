"""A spill whose disk hangs, end to end: the real daemon on a real Unix socket (``spill_after``
at once, ``tier_timeout`` 1 s) and shimmed processes under the vmm evictor over the fake driver,
the first of them with a disk whose first write to its spill files never returns (fault_io.c's
``hang``). The daemon gives the spill up after ``tier_timeout`` without progress: the status
document says why, and the kernel's memory is counted in host memory again, where it stayed.
Every wait is on the daemon's ``changed`` events."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from shim_harness import preload
from test_memory_e2e import RESERVE, ROOM_FOR_ONE, WORKING_SET, Kernel, client
from test_spill import fault_io  # noqa: F401  (the fixture that builds it)

MiB = 1 << 20


def test_a_spill_whose_writes_hang_is_given_up_after_tier_timeout(
        start_daemon, workload, card, watch, shim_library: Path, fault_io: Path,  # noqa: F811
        tmp_path: Path) -> None:
    config = tmp_path / "kiwi.yaml"
    config.write_text("spill_after: 0.05\ntier_timeout: 1\n")
    daemon = start_daemon("--tq", "60", "--grace", "30", "--gpus", "1", "--gpu-memory",
                          f"{(RESERVE + ROOM_FOR_ONE) // MiB}MiB", "--config", str(config))
    events = watch(daemon)
    spill_dir = tmp_path / "spill"
    shim = preload(shim_library)
    asan = shim.get("ASAN_OPTIONS")
    hangs = {"LD_PRELOAD": f"{fault_io}:{shim['LD_PRELOAD']}", "FAULT_IO_PLAN": "write:1:hang",
             "FAULT_IO_DIR": str(spill_dir), "KIWI_SPILL_DIR": str(spill_dir),
             **({"ASAN_OPTIONS": f"{asan}:verify_asan_link_order=0"} if asan else {})}
    a = Kernel(workload, card, daemon, "nbA.ipynb", **hangs)
    b = Kernel(workload, card, daemon, "nbB.ipynb")
    a.turn()
    a.release()
    b.turn()  # a moves to host memory for b; idle there, it is asked to spill, and hangs

    def given_up(document: dict) -> dict | None:
        entry = client(document, a)
        return entry if entry is not None and entry.get("tier_failed") else None

    entry = events.wait_for(given_up, what="nbA's hung spill given up")
    assert "the spill made no progress for 1 s and was given up" in entry["tier_failed"]
    assert (entry["tier"], entry["host_bytes"]) == ("host", WORKING_SET)
    os.kill(a.pid, signal.SIGKILL)  # its spill's thread never returns
    a.w.process.wait()
