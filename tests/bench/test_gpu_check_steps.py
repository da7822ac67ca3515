"""How `make gpu-check` picks its steps and reports a test step cut off by its limit (the GPU
runs themselves are what a machine with a GPU does)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.shim.gpu_check import GPU_TESTS, PRESETS, STEPS, ended_tests, find_gpu

REPO = Path(__file__).resolve().parents[2]


def test_the_decisive_steps_come_first_and_hold_the_tests_and_the_evictors():
    assert PRESETS["decisive"] == ("tests", "evictors")
    assert STEPS[:2] == PRESETS["decisive"]
    assert "tests/kernel/test_kernel_gpu_switch.py" in GPU_TESTS  # the two-kernel test
    assert (REPO / "tests" / "kernel" / "test_kernel_gpu_switch.py").is_file()


def test_a_test_step_cut_off_still_says_how_each_test_ended_and_which_one_ran():
    out = ("tests/shim/test_gpu.py::test_a PASSED                     [ 10%]\n"
           "tests/shim/test_gpu.py::test_b[native] FAILED             [ 20%]\n"
           "tests/shim/test_gpu.py::test_c SKIPPED (needs CuPy)       [ 30%]\n"
           "tests/shim/test_gpu.py::test_d PASSED                     [ 40%]\n"
           "tests/kernel/test_kernel_gpu_switch.py::test_two[auto] ")
    counts, running = ended_tests(out)
    assert counts == {"passed": 2, "failed": 1, "skipped": 1}
    assert running == "tests/kernel/test_kernel_gpu_switch.py::test_two[auto]"


def test_a_step_that_finished_has_no_test_running():
    assert ended_tests("tests/shim/test_gpu.py::test_a PASSED [100%]\n") == (
        {"passed": 1}, None)


def dry_run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(tmp_path),
           "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "benchmarks.shim.gpu_check", "--out",
                           str(tmp_path / "report.md"), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_dry_run_names_the_new_steps_and_whether_the_shim_has_the_vmm_evictor(
        tmp_path: Path) -> None:
    if find_gpu()[0] is not None:
        pytest.skip("a GPU is here: the dry run is what machines without one do")
    done = dry_run(tmp_path, "--only", "decisive")
    assert done.returncode == 0, done.stderr
    assert "`tests/kernel/test_kernel_gpu_switch.py` (two Kiwi kernels taking turns)" in done.stdout
    assert "`benchmarks.shim.evictors`, `benchmarks.shim.vmm_probe`" in done.stdout
    assert "- Evictors: managed, checkpoint and vmm: " in done.stdout


def test_an_unknown_step_is_refused_with_the_steps_there_are(tmp_path: Path) -> None:
    done = dry_run(tmp_path, "--only", "tests,bogus")
    assert done.returncode == 2
    assert "no step bogus; there are tests, evictors, probe," in done.stderr
