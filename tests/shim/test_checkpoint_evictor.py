"""The checkpoint evictor end to end: a shimmed process over the fake driver, the real daemon
(loading the same fake driver) suspending and resuming it from outside on a real socket."""

from __future__ import annotations

import re
from typing import Any

import pytest
from support import wait_for, wait_for_status

from nodeside.client import Client

GiB = 1 << 30


@pytest.fixture
def scheduler(checkpointing):
    return checkpointing("--grace", "30")


def kernel(workload, scheduler, checkpoint_dir, evict: str = "checkpoint", **env: str):
    return workload(KIWI_SOCKET=scheduler.socket, KIWI_EVICT=evict,
                    FAKE_CUDA_CHECKPOINT_DIR=str(checkpoint_dir), **env)


def client_of(scheduler, w) -> dict[str, Any] | None:
    with Client(scheduler.socket, register=False) as admin:
        status = admin.status()
    return next((c for c in status["clients"] if c["pid"] == w.process.pid), None)


def until_client(scheduler, w, predicate, what: str) -> None:
    """Until the daemon's status shows ``predicate`` true of w's client entry."""
    wait_for_status(scheduler.socket, lambda d: predicate(next(
        (c for c in d["clients"] if c["pid"] == w.process.pid), None) or {}), what=what)


def status_of(scheduler) -> dict[str, Any]:
    with Client(scheduler.socket, register=False) as admin:
        return admin.status()


def hold_with(w, scheduler, nbytes: int) -> None:
    w.call(f"d.alloc({nbytes})")
    assert w.call("d.launch()") == 0
    until_client(scheduler, w, lambda c: c.get("working_set") == nbytes,
                 what="the working set report")


def checkpoint_state(scheduler, w) -> str | None:
    client = client_of(scheduler, w)
    return client.get("checkpoint_state") if client else None


def test_auto_chooses_checkpoint_when_the_device_has_no_vmm_and_the_driver_and_daemon_can(
        scheduler, workload, checkpoint_dir) -> None:
    # Where the device supports VMM, auto is the vmm evictor (test_vmm_evictor.py).
    w = kernel(workload, scheduler, checkpoint_dir, evict="auto", FAKE_CUDA_NO_VMM="1")
    w.call("d.alloc(4096)")
    assert w.stats()["evict"] == "checkpoint"
    # The shim registers on its own thread: the daemon hears it a moment later.
    until_client(scheduler, w, lambda c: c.get("evict") == "checkpoint",
                 what="the daemon to hear the checkpoint evictor")
    assert w.log.calls("cuMemAlloc_v2") and not w.log.calls("cuMemAllocManaged")


def test_auto_chooses_managed_when_the_device_has_no_vmm_and_the_driver_no_checkpoint_api(
        scheduler, workload, checkpoint_dir) -> None:
    w = kernel(workload, scheduler, checkpoint_dir, evict="auto", FAKE_CUDA_NO_CHECKPOINT="1",
               FAKE_CUDA_NO_VMM="1")
    w.call("d.alloc(4096)")
    assert w.stats()["evict"] == "managed"
    until_client(scheduler, w, lambda c: c.get("evict") == "managed",
                 what="the daemon to hear the managed evictor")
    assert w.log.calls("cuMemAllocManaged")
    said = w.said("paging this process as managed memory")
    assert len(said) == 1 and "no checkpoint API" in said[0]


def test_checkpoint_falls_back_to_managed_when_the_daemon_cannot_act(
        checkpointing, workload, checkpoint_dir, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_CUDA_NO_CHECKPOINT", "1")  # the daemon's driver predates r570
    scheduler = checkpointing()
    monkeypatch.delenv("FAKE_CUDA_NO_CHECKPOINT")
    w = kernel(workload, scheduler, checkpoint_dir)
    w.call("d.alloc(4096)")
    assert w.stats()["evict"] == "managed"
    assert w.log.calls("cuMemAllocManaged")
    scheduler.wait_log(r"asked to be checkpointed; paging it as managed memory instead: "
                       r".*has no cuCheckpointProcessLock")


def test_a_quantum_end_that_needs_the_room_checkpoints_before_the_next_grant(
        scheduler, workload, checkpoint_dir) -> None:
    w = kernel(workload, scheduler, checkpoint_dir)
    hold_with(w, scheduler, 6 * GiB)
    with Client(scheduler.socket, name="next") as next_holder:
        next_holder.report_working_set(6 * GiB)
        next_holder.acquire(timeout=10)
        # The grant came after the checkpoint: the process's memory is off the GPU already.
        assert checkpoint_state(scheduler, w) == "checkpointed"
        assert not w.log.calls("cuMemPrefetchAsync")  # nothing paged by the shim
        launch = w.start("d.launch()")
        until_client(scheduler, w, lambda c: c.get("state") == "waiting",
                      what="the kernel to ask again")
        assert not launch.done()
        next_holder.release()
        assert launch.result() == 0
    assert checkpoint_state(scheduler, w) == "running"
    assert w.stats()["evictions"] == 1


def test_a_quantum_end_whose_next_holder_fits_checkpoints_nothing(
        scheduler, workload, checkpoint_dir) -> None:
    w = kernel(workload, scheduler, checkpoint_dir)
    hold_with(w, scheduler, 1 * GiB)
    with Client(scheduler.socket, name="small") as small:
        small.report_working_set(1 * GiB)
        small.acquire(timeout=10)
        assert checkpoint_state(scheduler, w) == "running"
    assert "Checkpointed" not in scheduler.log()


def test_a_preempted_low_holder_is_checkpointed_before_the_claimant_runs(
        checkpointing, workload, checkpoint_dir, tmp_path) -> None:
    config = tmp_path / "pools.yaml"
    config.write_text("tq: 30\npools:\n"
                      "  research: {guarantee: 0.5, weight: 1, maximum: -1}\n"
                      "  batch: {guarantee: 0.0, weight: 1, maximum: -1}\n")
    scheduler = checkpointing("--config", str(config), "--tq", "30", "--grace", "30")
    w = kernel(workload, scheduler, checkpoint_dir, KIWI_POOL="batch", KIWI_PRIORITY="LOW")
    hold_with(w, scheduler, 6 * GiB)
    with Client(scheduler.socket, name="claimant", pool="research") as claimant:
        claimant.report_working_set(6 * GiB)
        claimant.acquire(timeout=10)  # at once, not at the end of the 30 s quantum
        assert checkpoint_state(scheduler, w) == "checkpointed"
    scheduler.wait_log(r"Preempting .* on GPU 0")


def test_a_holder_that_ignores_a_drop_is_revoked_by_a_forced_checkpoint(
        checkpointing, workload, checkpoint_dir) -> None:
    scheduler = checkpointing("--grace", "0.3")
    w = kernel(workload, scheduler, checkpoint_dir, FAKE_CUDA_LAUNCH_SECONDS="1.5")
    hold_with(w, scheduler, 6 * GiB)
    slow = w.start("d.launch()")  # in the driver for 1.5 s: the release comes far too late
    wait_for(lambda: w.stats()["in_flight"] == 1, what="the slow launch to be inside the gate")
    with Client(scheduler.socket, name="impatient") as impatient:
        impatient.report_working_set(6 * GiB)
        impatient.acquire(timeout=20)
        # Granted only once the lock got past the running work and the checkpoint was done.
        assert checkpoint_state(scheduler, w) == "checkpointed"
        # The launch ended in the driver before the lock; its answer crosses the workload's
        # pipe to this process's reader thread, which a busy machine may run a moment later.
        wait_for(slow.done, what="the slow launch's answer")
        impatient.release()
    scheduler.wait_log(rf"Revoked \S+ \(c\d+, pid {w.process.pid}\) by a forced checkpoint")
    wait_for(lambda: w.stats()["revokes"] == 1, what="the revoked event")
    assert w.call("d.launch()", timeout=20) == 0  # restored on its next grant
    assert checkpoint_state(scheduler, w) == "running"


def test_a_process_killed_while_checkpointed_leaves_the_gpu_free(
        scheduler, workload, checkpoint_dir) -> None:
    w = kernel(workload, scheduler, checkpoint_dir)
    hold_with(w, scheduler, 6 * GiB)
    with Client(scheduler.socket, name="next") as next_holder:
        next_holder.report_working_set(6 * GiB)
        next_holder.acquire(timeout=10)
        assert checkpoint_state(scheduler, w) == "checkpointed"
        w.process.kill()
        w.process.wait()
        scheduler.wait_log(r"went away while checkpointed")
        next_holder.release()
    with Client(scheduler.socket, name="after") as after:
        after.acquire(timeout=10)
        assert after.holding
    assert "Traceback" not in scheduler.log()


def test_a_failed_checkpoint_grants_nobody_else_and_says_why(
        scheduler, workload, checkpoint_dir) -> None:
    w = kernel(workload, scheduler, checkpoint_dir, FAKE_CUDA_CHECKPOINT_FAIL="1")
    hold_with(w, scheduler, 6 * GiB)
    with Client(scheduler.socket, name="next") as next_holder:
        next_holder.report_working_set(6 * GiB)
        with pytest.raises(TimeoutError):
            next_holder.acquire(timeout=1.5)
        assert checkpoint_state(scheduler, w) == "failed"
        blocked = status_of(scheduler)["gpus"][0]["evict_blocked"]
        assert re.search(r"checkpoint of \S+ \(c\d+, pid \d+\) failed", blocked)
        assert "FAILED" in client_of(scheduler, w)["checkpoint_error"]
        scheduler.wait_log(r"\[ERROR\] GPU 0: the checkpoint of .* failed")
        # Once the process is gone its memory is free: the GPU goes on.
        w.process.kill()
        w.process.wait()
        scheduler.wait_log(r"the process whose checkpoint failed is gone; granting again")
        next_holder.acquire(timeout=10)
    assert "Traceback" not in scheduler.log()


def test_a_checkpointed_kernel_asks_for_its_gpu_at_the_start_of_a_cell(
        scheduler, workload, checkpoint_dir) -> None:
    w = kernel(workload, scheduler, checkpoint_dir)
    hold_with(w, scheduler, 6 * GiB)
    with Client(scheduler.socket, name="next") as next_holder:
        next_holder.report_working_set(6 * GiB)
        next_holder.acquire(timeout=10)
        w.call("shim.cell_begin()")
        until_client(scheduler, w, lambda c: c.get("state") == "waiting",
                      what="the cell to ask for the GPU")


def test_a_checkpoint_the_driver_never_finishes_is_given_up_with_a_clear_error(
        checkpointing, workload, checkpoint_dir, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's checkpoint call outlives checkpoint_timeout (the fake sleeps in it, as the
    real API hangs with several processes): the daemon gives up on it in bounded time, says so
    once, and the GPU's line goes on after one grace period instead of never."""
    monkeypatch.setenv("FAKE_CUDA_CHECKPOINT_SECONDS", "6")  # the daemon's call, in its thread
    scheduler = checkpointing("--grace", "1", "--checkpoint-timeout", "0.5")
    w = kernel(workload, scheduler, checkpoint_dir)
    hold_with(w, scheduler, 6 * GiB)
    with Client(scheduler.socket, name="next") as next_holder:
        next_holder.report_working_set(6 * GiB)
        next_holder.request()  # needs the room: the holder's quantum ends in a checkpoint
        scheduler.wait_log(r"\[ERROR\] GPU 0: the checkpoint of .* did not return in 0\.5 s: "
                           r"given up")
        assert checkpoint_state(scheduler, w) == "failed"
        error = client_of(scheduler, w)["checkpoint_error"]
        assert "the driver's checkpoint did not return in 0.5 s (checkpoint_timeout)" in error
        # One grace period later the line goes on, though the driver's call may still run.
        assert next_holder.wait_for_grant(timeout=10)
        next_holder.release()
    scheduler.wait_log(r"returned at last after the daemon had given up on it", timeout=30)
    assert "Traceback" not in scheduler.log()
