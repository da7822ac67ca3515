"""`make gpu-check` without a GPU: the dry run CI can run, which must skip cleanly and say why."""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.shim.gpu_check import find_gpu

REPO = Path(__file__).resolve().parents[2]


def test_gpu_check_without_a_gpu_is_a_dry_run_that_says_so_and_writes_one_report(
        tmp_path: Path) -> None:
    if find_gpu()[0] is not None:
        pytest.skip("a GPU is here: the dry run is what machines without one do")
    report = tmp_path / "gpu-check.md"
    # No NVML and no nvidia-smi can be found, as on a machine with no NVIDIA driver.
    env = {**os.environ, "PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(tmp_path),
           "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "benchmarks.shim.gpu_check", "--out", str(report)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    text = report.read_text()
    assert done.stdout == text
    assert text.startswith("# GPU check (")
    assert "**No NVIDIA GPU here: dry run, nothing measured.**" in text
    assert "Shim: built `" in text  # the one step that needs no GPU still ran
    assert "pytest -m gpu -k 'not vmm' tests/shim" in text and "benchmarks.shim.paging" in text
    assert "benchmarks.shim.gpu_corun" in text and "benchmarks.shim.evict_variants" in text


def test_a_step_cut_off_by_its_limit_keeps_the_lines_it_printed_before() -> None:
    from benchmarks.shim.gpu_check import step

    # It would print more after ten minutes; the 5 s limit stops it first.
    code = "import time; print('| measured | 1 |', flush=True); time.sleep(600); print('| more |')"
    out, failed = step([sys.executable, "-c", code], 5)
    assert "| measured | 1 |" in out
    assert failed == "stopped after its 5 s limit"


@pytest.mark.skipif(ctypes.util.find_library("cuda") is not None,
                    reason="a CUDA driver is here: the skip is what machines without one do")
def test_the_evict_step_reports_what_evict_variants_printed_and_why_it_skipped() -> None:
    from benchmarks.shim.gpu_check import markdown_benchmark

    rows = markdown_benchmark("evict_variants", ["--gib", "1"], 120)
    assert rows == [rows[0]] and rows[0].startswith("Skipped: no usable CUDA driver or GPU")


def test_a_benchmarks_tables_keep_apart_and_its_prose_is_left_out():
    from benchmarks.shim.gpu_check import tables

    out = "warming up\n| a |\n| --- |\n| 1 |\n\nnote\n\n| b |\n| --- |\n| 2 |\n\n"
    assert tables(out) == ["| a |", "| --- |", "| 1 |", "", "| b |", "| --- |", "| 2 |"]
