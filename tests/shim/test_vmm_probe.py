"""The vmm device probe (benchmarks/shim/vmm_probe.py) run whole against the fake driver: every
step runs, the contents come back, the card's memory is counted free after each release, and
it says why it skips where it cannot run. (Its timings there mean nothing: on a GPU, ``make
gpu-check`` runs it as the step ``probe``.)"""

from __future__ import annotations

import ctypes.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GiB = 1 << 30


def probe(fake_cuda: Path | None, tmp_path: Path, *args: str, **env: str) -> tuple[str, str]:
    """The probe's report, and what it printed."""
    report = tmp_path / "probe.md"
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_CUDA_", "KIWI_"))}
    environment.update({"PYTHONPATH": str(REPO),
                        "LD_LIBRARY_PATH": str(fake_cuda.parent if fake_cuda else tmp_path),
                        **env})
    done = subprocess.run([sys.executable, "-m", "benchmarks.shim.vmm_probe", "--out",
                           str(report), *args], cwd=REPO, env=environment, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return report.read_text(), done.stdout


def rows(report: str, step: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip("|").split("|")]
            for line in report.splitlines() if line.startswith(f"| {step}")]


@pytest.fixture
def report(fake_cuda: Path, tmp_path: Path) -> str:
    # 64 MiB, in 8 MiB chunks, on a card of 3 GiB (2 GiB of headroom) that the probe's
    # second process shares, so (i) sees its managed memory.
    text, printed = probe(fake_cuda, tmp_path, "--gib", "0.0625", "--chunk-mib", "8",
                          FAKE_CUDA_TOTAL=str(3 * GiB), FAKE_CUDA_DEVICE=str(tmp_path / "card"))
    assert printed == text  # printed as it went, the same lines
    return text


def test_the_probe_measures_the_floor_and_both_ways_of_pinning(report: str) -> None:
    assert "Working set 0.06 GiB; granularity 2 MiB; eviction chunks of 8 MiB." in report
    assert len(rows(report, "(a) pinned cuMemcpy")) == 2
    assert len(rows(report, "(e) cuMemAllocHost")) == 1
    (shadow,) = rows(report, "(e) mmap + MADV_HUGEPAGE")
    assert re.search(r"fault [\d.]+ s on \d+ threads, register [\d.]+ s", shadow[7])
    assert re.search(r"- \(e\) the shadow: (mmap \+ cuMemHostRegister|cuMemAllocHost)$", report,
                     re.MULTILINE)


def test_every_handle_size_maps_and_comes_free_when_released(report: str) -> None:
    mapped = rows(report, "(b) create+map+access")
    assert [row[0] for row in mapped] == [
        "(b) create+map+access, 32 x 2 MiB", "(b) create+map+access, 3 x 20 MiB",
        "(b) create+map+access, 256 MiB handles", "(b) create+map+access, 1 x whole"]
    assert mapped[2][7] == "larger than the working set: skipped"
    released = rows(report, "(b, c) unmap+release")
    assert len(released) == 3
    assert all("freed: cuMemGetInfo 100%" in row[7] for row in released)
    assert "- (c) freed after release: pass" in report


def test_each_eviction_round_frees_the_card_and_restores_the_contents(report: str) -> None:
    evictions = rows(report, "(d) evict to the registered shadow")
    assert [row[0].split(", ")[-1] for row in evictions] == [
        "1 stream(s)", "2 stream(s)", "4 stream(s)"]
    # The fake card holds nothing else: all of it came free, each round.
    assert all("freed: cuMemGetInfo 100%" in row[7] for row in evictions)
    assert all(float(row[6]) == pytest.approx(3.0) for row in evictions)
    assert "- (d) freed by the eviction: pass" in report
    restores = rows(report, "(d, g) restore")
    assert len(restores) == 3
    assert all(row[7].startswith("contents: intact (32 blocks") for row in restores)
    assert "- (g) contents: pass" in report
    assert "- (d) >= 0.8 of (a) both ways: " in report
    assert len(rows(report, "(f) D->H and H->D at once")) == 1


def test_another_process_managed_memory_counts_after_its_prefetch(report: str) -> None:
    """The fake keeps prefetched managed memory on the card, as the driver's UVM does."""
    (managed,) = rows(report, "(i)")
    assert "free fell by 0.02 GiB, then came back by 0.00 GiB" in managed[7]
    assert "- (i) managed memory prefetched out still counts as used: yes" in report


def test_a_device_without_vmm_is_skipped_with_the_reason(fake_cuda: Path,
                                                         tmp_path: Path) -> None:
    text, _ = probe(fake_cuda, tmp_path, FAKE_CUDA_NO_VMM="1")
    assert "Skipped: the device says it does not support virtual memory management" in text
    assert "| step |" not in text


def test_a_card_without_room_is_skipped_never_oversubscribed(fake_cuda: Path,
                                                             tmp_path: Path) -> None:
    text, _ = probe(fake_cuda, tmp_path, FAKE_CUDA_TOTAL=str(2 * GiB))  # all of it headroom
    assert "Skipped: the card (2.0 GiB free)" in text


@pytest.mark.skipif(ctypes.util.find_library("cuda") is not None,
                    reason="a CUDA driver is here: the skip is what machines without one do")
def test_without_a_driver_it_says_so_and_succeeds(tmp_path: Path) -> None:
    text, _ = probe(None, tmp_path)
    assert "Skipped: no usable CUDA driver or GPU" in text
