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


def test_a_row_is_by_the_evictors_clock_where_it_keeps_one():
    cold = Round(evict_s=0.2, waited_s=0.3, restore_s=0.25, back_s=0.3, freed=4 * GiB,
                 intact=True)
    warm = Round(evict_s=0.1, waited_s=0.2, restore_s=0.25, back_s=0.3, freed=4 * GiB,
                 intact=True)
    cells = row_cells("vmm", 5 * 10**9, [cold, warm], FLOOR)
    assert len(cells) == len(HEADER)
    assert cells == ["vmm", "25.0 (0.50)", "50.0 (1.00)", "20.0 (0.40)", "0.300",
                     "4.00 of 4.66 (86%)", "yes", "0.100", "the evictor's clock"]


def test_without_its_clock_a_row_is_by_the_wall_clock_and_a_lost_row_shows():
    lost = Round(evict_s=None, waited_s=2.0, restore_s=None, back_s=1.0, freed=None,
                 intact=False)
    cells = row_cells("checkpoint", 10**10, [lost, lost], FLOOR)
    assert cells[1] == "5.0 (0.10)" and cells[3] == "10.0 (0.20)"
    assert cells[5] == "n/a" and cells[6] == "**NO**"
    assert cells[-1] == "wall clock (B's wait, A's pass)"


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
    # The fake card's count: every byte of the working set left it; and it came back intact.
    assert cells[5] == "0.06 of 0.06 (100%)" and cells[6] == "yes"
    assert cells[-1] == "the evictor's clock |"
    assert lines[-1] == "vmm: built (the shim runs KIWI_EVICT=vmm as vmm over the fake driver)"
