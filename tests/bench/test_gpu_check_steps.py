"""How `make gpu-check` picks its steps and reports a test step cut off by its limit (the GPU
runs themselves are what a machine with a GPU does)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.shim.gpu_check import (
    GPU_TESTS,
    PRESETS,
    STEPS,
    VMM_TESTS,
    ended_tests,
    find_gpu,
    judge,
)

REPO = Path(__file__).resolve().parents[2]


def test_the_decisive_steps_come_first_in_the_proofs_order():
    # The driver alone, the evictor's row, the smoke through real programs, the tests.
    assert PRESETS["decisive"] == ("probe", "vmm", "smoke", "vmm-tests")
    assert STEPS[:4] == PRESETS["decisive"]
    assert PRESETS["second"] == ("tests", "evictors")  # managed and checkpoint: the next call
    assert "tests/kernel/test_kernel_gpu_switch.py" in GPU_TESTS  # the two-kernel test
    assert VMM_TESTS == ("tests/shim/test_gpu.py", "tests/kernel/test_kernel_gpu_switch.py")
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
    planned = [line for line in done.stdout.splitlines() if line.startswith("  ")]
    assert [line.split("`")[1] for line in planned] == list(PRESETS["decisive"])
    assert "`benchmarks.shim.vmm_probe` at 16 GiB" in planned[0]
    assert "--only vmm` at 16 GiB" in planned[1] and "data changed each round" in planned[1]
    assert "NVML freed >= 95 % per process" in planned[1]
    assert "forked DataLoader" in planned[2] and "global-mode capture" in planned[2]
    assert "pytest -m gpu -k vmm tests/shim/test_gpu.py tests/kernel/" in planned[3]
    assert all("verdict against:" in line for line in planned)
    assert "- Evictors: managed, checkpoint and vmm: " in done.stdout


def test_a_verdict_line_per_target_from_what_each_step_printed():
    assert judge("vmm", ["| vmm | ... |", "", "- verdict vmm: PASS (evict and restore ...)"]) \
        .startswith("- `vmm`: PASS (vmm PASS")
    assert judge("vmm", ["| vmm | ... |"]).startswith("- `vmm`: FAIL (no verdict")
    assert judge("smoke", ["- verdict smoke: FAIL (forked DataLoader)"]).startswith(
        "- `smoke`: FAIL (smoke FAIL (forked DataLoader)")
    probe = ["- (c) freed after release: pass", "- (d) >= 0.8 of (a) both ways: pass (best: "
             "out 0.91, in 0.88)", "- (g) contents: pass"]
    assert judge("probe", probe).startswith("- `probe`: PASS")
    assert judge("probe", [*probe[:2], "- (g) contents: FAIL (3 blocks wrong)"]).startswith(
        "- `probe`: FAIL ((g) (3 blocks wrong))")
    assert judge("probe", probe[:2]).startswith("- `probe`: FAIL (verdicts missing: g)")
    assert judge("vmm-tests", ["`pytest -m gpu -k vmm ...`: **7 passed in 90.2s**"]).startswith(
        "- `vmm-tests`: PASS")
    assert judge("vmm-tests", ["`pytest ...`: **5 passed, 1 failed in 80s**"]).startswith(
        "- `vmm-tests`: FAIL")
    assert judge("vmm-tests", ["`pytest ...`: **cut off: 3 passed; running then: x**"]) \
        .startswith("- `vmm-tests`: FAIL")


def test_an_unknown_step_is_refused_with_the_steps_there_are(tmp_path: Path) -> None:
    done = dry_run(tmp_path, "--only", "tests,bogus")
    assert done.returncode == 2
    assert "no step bogus; there are probe, vmm, smoke, vmm-tests, tests," in done.stderr
