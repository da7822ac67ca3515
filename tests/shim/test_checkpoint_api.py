"""The daemon's binding of the driver's checkpoint API, acting on another process over the
fake driver: the locked process's calls really block, locks time out, failures are FAILED."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support import wait_for

from nodeside.evict.checkpoint import (
    NOT_READY,
    CheckpointApi,
    CheckpointError,
    CheckpointUnavailable,
    ProcessState,
)


@pytest.fixture
def checkpoint_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "checkpoint"
    directory.mkdir()
    monkeypatch.setenv("FAKE_CUDA_CHECKPOINT_DIR", str(directory))
    return directory


@pytest.fixture
def api(fake_cuda: Path, checkpoint_dir: Path) -> CheckpointApi:
    return CheckpointApi(str(fake_cuda))


def bare_process(workload, checkpoint_dir: Path, **env: str):
    """A process over the fake driver without the shim's gate, so only the driver blocks."""
    w = workload(KIWI_SHIM="0", FAKE_CUDA_CHECKPOINT_DIR=str(checkpoint_dir), **env)
    assert w.call("d.launch()") == 0
    return w


def test_a_locked_process_s_calls_block_until_it_is_restored_and_unlocked(
        api, workload, checkpoint_dir) -> None:
    w = bare_process(workload, checkpoint_dir)
    pid = w.process.pid
    api.lock(pid, timeout=5)
    api.checkpoint(pid)
    assert api.state(pid) == ProcessState.CHECKPOINTED
    launch = w.start("d.launch()")
    time.sleep(0.3)  # a launch that is not blocked answers in milliseconds
    assert not launch.done()
    api.restore(pid)
    assert api.state(pid) == ProcessState.LOCKED
    assert not launch.done()
    api.unlock(pid)
    assert launch.result() == 0
    assert api.state(pid) == ProcessState.RUNNING


def test_a_lock_times_out_while_work_runs_and_leaves_the_process_running(
        api, workload, checkpoint_dir) -> None:
    w = bare_process(workload, checkpoint_dir, FAKE_CUDA_LAUNCH_SECONDS="1.5")
    slow = w.start("d.launch()")
    wait_for(lambda: _in_progress(checkpoint_dir, w), what="the slow launch to start")
    with pytest.raises(CheckpointError) as failure:
        api.lock(w.process.pid, timeout=0.1)
    assert failure.value.code == NOT_READY
    assert api.state(w.process.pid) == ProcessState.RUNNING
    assert slow.result() == 0


def _in_progress(checkpoint_dir: Path, w) -> bool:
    """The fake's count of the process's calls under way (the second int of its page)."""
    raw = (checkpoint_dir / str(w.process.pid)).read_bytes()
    return int.from_bytes(raw[4:8], "little") > 0


def test_a_process_with_managed_memory_fails_its_checkpoint(api, workload,
                                                            checkpoint_dir) -> None:
    w = bare_process(workload, checkpoint_dir)
    w.call("d.alloc_managed(4096)")
    api.lock(w.process.pid, timeout=5)
    with pytest.raises(CheckpointError):
        api.checkpoint(w.process.pid)
    assert api.state(w.process.pid) == ProcessState.FAILED


def test_a_process_that_is_gone_cannot_be_locked(api, workload, checkpoint_dir) -> None:
    w = bare_process(workload, checkpoint_dir)
    w.process.kill()
    w.process.wait()
    with pytest.raises(CheckpointError):
        api.lock(w.process.pid, timeout=1)


def test_a_driver_without_the_api_is_refused_with_a_reason(fake_cuda: Path,
                                                           monkeypatch) -> None:
    monkeypatch.setenv("FAKE_CUDA_NO_CHECKPOINT", "1")
    with pytest.raises(CheckpointUnavailable, match="r570"):
        CheckpointApi(str(fake_cuda))


def test_no_driver_at_all_is_refused_with_a_reason(tmp_path: Path) -> None:
    with pytest.raises(CheckpointUnavailable, match="cannot load"):
        CheckpointApi(str(tmp_path / "libcuda.so.1"))

