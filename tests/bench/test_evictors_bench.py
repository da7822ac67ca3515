"""The evictors benchmark's sizing and rows, and its dry run (the measurement needs a GPU:
``make gpu-check`` runs it there as the step ``evictors``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.shim.evictors import (
    DAEMON_RESERVE,
    HEADER,
    HEADROOM,
    SMALL,
    GiB,
    Round,
    gpu_memory_flag,
    row_cells,
    verdict,
    working_set,
)
from benchmarks.shim.gpu_check import find_gpu

REPO = Path(__file__).resolve().parents[2]
FLOOR = {"to_host": 50e9, "to_device": 50e9}


def test_the_daemon_is_told_a_card_where_the_holder_fits_alone_but_not_beside_the_other():
    for nbytes in (1 * GiB, 4 * GiB, 10 * GiB):
        room = gpu_memory_flag(nbytes) - DAEMON_RESERVE
        assert nbytes <= room < nbytes + SMALL


def test_the_working_set_leaves_room_for_a_second_one_and_headroom():
    assert working_set(4 * GiB, 80 * GiB) == 4 * GiB
    size = working_set(4 * GiB, HEADROOM + 3 * GiB + 12345)
    assert size % (2 << 20) == 0 and 2 * size <= 3 * GiB + 12345
    assert working_set(4 * GiB, HEADROOM) == 0


def moved(first: bool = False, out: int = 4 * GiB, evict_s: float | None = 0.1,
          back: int = 4 * GiB, restore_s: float | None = 0.1, freed: int | None = 4 * GiB,
          intact: bool = True) -> Round:
    return Round(first=first, moved_out=out, evict_s=evict_s, waited_s=0.3, moved_in=back,
                 restore_s=restore_s, back_s=0.3, freed=freed, intact=intact)


def test_a_row_is_by_the_evictors_clock_over_the_bytes_each_move_moved():
    # The framework's cache held 1 GiB free: the moves moved 3 GiB of the 4, in 0.1 s each.
    rounds = [moved(first=True, out=3 * GiB, evict_s=0.2), moved(out=3 * GiB),
              moved(out=3 * GiB, back=3 * GiB, restore_s=0.2)]
    cells = row_cells("vmm", 4 * GiB, rounds, FLOOR)
    assert len(cells) == len(HEADER)
    assert cells == ["vmm", "16.1 (0.32)", "32.2 (0.64)", "16.1 (0.32)", "0.300", "100%", "yes",
                     "the evictor's clock"]


def test_without_its_clock_a_row_is_by_the_wall_clock_and_a_lost_row_shows():
    lost = moved(out=0, evict_s=None, back=0, restore_s=None, freed=None, intact=False)
    lost.waited_s, lost.back_s = 2.0, 1.0
    cells = row_cells("checkpoint", 10**10, [lost, lost], FLOOR)
    assert cells[1] == "n/a"  # no first eviction apart: not vmm
    assert cells[2] == "5.0 (0.10)" and cells[3] == "10.0 (0.20)"
    assert cells[5] == "n/a" and cells[6] == "**NO**"
    assert cells[-1] == "wall clock (B's wait, A's pass)"


def test_the_verdict_passes_only_when_every_target_is_met():
    good = [moved(first=True), moved(), moved(), moved()]
    assert verdict("vmm", 4 * GiB, good, {"to_host": 40e9, "to_device": 40e9}).startswith(
        "- verdict vmm: PASS")
    slow_first = [moved(first=True, evict_s=1.0), *good[1:]]
    kept = [*good[:3], moved(freed=3 * GiB)]
    stale = [*good[:3], moved(intact=False)]
    for rounds, why in ((slow_first, "first eviction 0.11 < 0.8"), (kept, "NVML freed 75% < 95%"),
                        (stale, "contents not intact")):
        line = verdict("vmm", 4 * GiB, rounds, {"to_host": 40e9, "to_device": 40e9})
        assert line.startswith("- verdict vmm: FAIL") and why in line, line


def test_without_a_gpu_it_runs_the_vmm_row_over_the_fake_driver(tmp_path: Path) -> None:
    if find_gpu()[0] is not None:
        pytest.skip("a GPU is here: the dry run is what machines without one do")
    env = {**os.environ, "PYTHONPATH": str(REPO), "LD_LIBRARY_PATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "benchmarks.shim.evictors"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "## Evictors side by side"
    assert "Skipped: no GPU (or no PyTorch with CUDA, or no NVML)." in lines
    rows = [line.split(" | ") for line in lines if line.startswith("| vmm |")]
    assert len(rows) == 1, done.stdout
    cells = rows[0]
    # The fake card's row of the process: every byte of the working set left it each round;
    # and it came back intact, changed each round.
    assert cells[5] == "100%" and cells[6] == "yes"
    assert cells[-1] == "the evictor's clock |"
    assert not any(line.startswith("- verdict") for line in lines)  # a dry run decides nothing
    assert lines[-1] == "vmm: built (the shim runs KIWI_EVICT=vmm as vmm over the fake driver)"


def test_the_smokes_workers_are_python_and_without_pytorch_it_skips() -> None:
    from benchmarks.shim import vmm_smoke

    for code in (vmm_smoke.MAIN_STEPS, vmm_smoke.ASYNC_STEP):
        compile(vmm_smoke.PRELUDE + code, "<smoke worker>", "exec")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "benchmarks.shim.vmm_smoke"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    if "Skipped:" not in done.stdout:
        pytest.skip("PyTorch and a GPU are here: the smoke ran for real")
    assert done.stdout.splitlines()[-1] in ("Skipped: no PyTorch.", "Skipped: no GPU.")
