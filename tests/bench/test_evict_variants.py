"""The eviction-strategy benchmark's arithmetic, sizing and table (the measurement itself needs
a GPU: ``make gpu-check`` runs it there as the step ``evict``)."""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.shim.evict_strategies import (
    CHUNK_ALIGN,
    HEADER,
    HEADROOM,
    STRATEGIES,
    GiB,
    Round,
    Strategy,
    chunks,
    floor_row,
    header,
    row,
    working_set,
)

REPO = Path(__file__).resolve().parents[2]


def test_chunks_cover_the_buffer_exactly_once_cut_on_2_mib_boundaries():
    base, nbytes = 1 << 40, 10 * GiB + 6 * CHUNK_ALIGN
    for parts in (1, 2, 3, 4, 8):
        pieces = chunks(base, nbytes, parts)
        assert len(pieces) <= parts
        assert pieces[0][0] == base
        for (start, size), (following, _) in zip(pieces, pieces[1:], strict=False):
            assert start + size == following  # no gap, no overlap
            assert size % CHUNK_ALIGN == 0 and (start - base) % CHUNK_ALIGN == 0
        assert sum(size for _, size in pieces) == nbytes


def test_one_part_is_the_whole_buffer():
    assert chunks(4096, 3 * CHUNK_ALIGN, 1) == [(4096, 3 * CHUNK_ALIGN)]


def test_the_buffer_never_takes_more_than_the_card_has_free_less_headroom():
    plenty = 1 << 50
    assert working_set(10 * GiB, 80 * GiB, plenty) == 10 * GiB
    assert working_set(10 * GiB, 8 * GiB, plenty) == 8 * GiB - HEADROOM
    assert working_set(10 * GiB, HEADROOM, plenty) == 0
    assert working_set(10 * GiB, 1 * GiB, plenty) == 0
    size = working_set(10 * GiB, 7 * GiB + 12345, plenty)
    assert size % CHUNK_ALIGN == 0 and size <= 7 * GiB + 12345 - HEADROOM


def test_the_buffer_also_fits_three_times_in_the_hosts_available_memory():
    assert working_set(10 * GiB, 80 * GiB, 3 * 4 * GiB + HEADROOM) == 4 * GiB


def test_the_strategies_are_the_ones_the_gpu_session_must_compare():
    names = [s.name for s in STRATEGIES]
    assert len(set(names)) == len(names)
    assert "prefetch" in names and "prefetch, advise CPU" in names
    for parts in (2, 4, 8):
        assert f"prefetch, {parts} parts on {parts} streams" in names
        assert f"prefetch, {parts} parts on {parts} streams, advise CPU" in names
        assert f"prefetch, {parts} parts on {parts} threads" in names
    assert "copy-pinned + discard" in names and "copy-pageable + discard" in names
    assert all(s.needs_discard == (s.how != "prefetch") for s in STRATEGIES)
    assert Strategy("copy-pinned", drop="discard+prefetch").name == \
        "copy-pinned + discard+prefetch"


def test_a_row_gives_each_direction_against_the_pinned_memcpy_of_the_same_run():
    measured = Round("prefetch", 2, nbytes=10 * 10**9, evict_s=2.0, evict_call_s=1.9991,
                     freed=10 * GiB, restore_s=0.25, intact=True)
    text = row(measured, floor_to_host=50e9, floor_to_device=50e9)
    assert text == "| prefetch | 2 | 5.0 | 0.10 | 1.999 | 10.00 | 40.0 | 0.80 | yes |"


def test_a_buffer_that_came_back_wrong_is_flagged_in_its_row():
    measured = Round("copy-pinned + discard", 1, 10**9, 1.0, 0.0, 0, 1.0, intact=False)
    assert row(measured, 1e9, 1e9).endswith("| **NO** |")


def test_the_table_has_a_header_a_rule_and_the_floor_as_its_first_row():
    lines = header()
    assert lines[0].count("|") == len(HEADER) + 1
    assert lines[1] == "|" + " --- |" * len(HEADER)
    floor = floor_row(10 * GiB, 55e9, 54.9e9)
    assert floor.count("|") == len(HEADER) + 1
    assert "| 55.0 | 1.00 |" in floor and "| 54.9 | 1.00 |" in floor


@pytest.mark.skipif(ctypes.util.find_library("cuda") is not None,
                    reason="a CUDA driver is here: the skip is what machines without one do")
def test_without_a_gpu_it_says_why_in_one_line_and_exits_0(tmp_path: Path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "LD_LIBRARY_PATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "benchmarks.shim.evict_variants"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Skipped: no usable CUDA driver or GPU here (")
    assert len(done.stdout.strip().splitlines()) == 1


def build_fake_driver(directory: Path) -> Path:
    """tests/bench/fake_uvm.c as directory/libcuda.so.1: memory-backed, so bytes really move."""
    subprocess.run(["gcc", "-std=c11", "-O1", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall",
                    "-Werror", "-Wl,-soname,libcuda.so.1", "-o", str(directory / "libcuda.so.1"),
                    str(REPO / "tests" / "bench" / "fake_uvm.c"), "-lpthread"],
                   check=True, capture_output=True, text=True)
    return directory


def run_against_fake(tmp_path: Path, status: int = 0, **env: str) -> tuple[list[str], list[str]]:
    """The table's rows (or the lines, when there is no table), and the calls the fake saw."""
    log = tmp_path / "calls.log"
    environment = {**os.environ, "PYTHONPATH": str(REPO), "FAKE_UVM_LOG": str(log),
                   "LD_LIBRARY_PATH": str(build_fake_driver(tmp_path)), **env}
    done = subprocess.run([sys.executable, "-m", "benchmarks.shim.evict_variants", "--gib",
                           "0.0625"], cwd=REPO, env=environment, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == status, done.stderr
    assert not done.stderr  # no traceback, whatever happened
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    return rows or done.stdout.splitlines(), log.read_text().splitlines() if log.exists() else []


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_every_strategy_moves_the_bytes_out_and_back_intact_and_frees_the_gpu(tmp_path: Path):
    rows, _ = run_against_fake(tmp_path)
    measured = [cells(line) for line in rows[3:]]  # after the header, the rule and the floor
    assert len(measured) == 2 * len(STRATEGIES)  # two rounds of each
    assert [row[0] for row in measured[::2]] == [s.name for s in STRATEGIES]
    for row_cells in measured:
        assert row_cells[-1] == "yes", row_cells
        assert row_cells[5] == "0.06", row_cells  # 64 MiB off the card, all of it


def test_copy_out_then_discard_copies_before_it_drops_and_repopulates_before_copying_back(
        tmp_path: Path):
    _, calls = run_against_fake(tmp_path)
    names = [line.split()[0] for line in calls]
    first = names.index("cuMemDiscardBatchAsync")
    assert names[first - 1] == "cuMemcpyDtoHAsync_v2"  # the bytes are out before the drop
    back = names[first + 1:first + 3]
    assert back == ["cuMemDiscardAndPrefetchBatchAsync", "cuMemcpyHtoDAsync_v2"]
    assert "device=0" in calls[first + 1]  # fresh pages on the GPU, nothing migrated


def test_a_driver_that_refuses_discards_gets_a_failed_row_and_the_run_goes_on(tmp_path: Path):
    rows, _ = run_against_fake(tmp_path, FAKE_UVM_NO_DISCARD="1")
    copies = [cells(line) for line in rows if line.startswith("| copy-")]
    assert copies and all("failed: cuMem" in row[2] and "801" in row[2] for row in copies)
    prefetches = [cells(line) for line in rows if line.startswith("| prefetch")]
    assert len(prefetches) == 2 * sum(s.how == "prefetch" for s in STRATEGIES)
    assert all(row[-1] == "yes" for row in prefetches)


@pytest.mark.parametrize("only", ["0", "15", "two", ""])
def test_only_takes_the_strategies_numbers_and_refuses_others(only: str):
    done = subprocess.run([sys.executable, "-m", "benchmarks.shim.evict_variants", "--only", only],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 2 and "--only takes numbers 1-14" in done.stderr


def test_a_host_that_cannot_pin_the_buffer_stops_the_run_with_one_line_saying_so(tmp_path: Path):
    lines, _ = run_against_fake(tmp_path, status=1, FAKE_UVM_NO_PINNING="1")
    assert lines[-1] == ("Stopped: cuMemAllocHost_v2 failed with CUresult 2 allocating 0.06 GiB "
                         "of pinned host memory.")
