"""The checkpoint evictor's lines without a driver, a thread or a clock: the scheduler's actions
in, what may go now and the jobs to start out, and the jobs' results fed back as events."""

from __future__ import annotations

import pytest

from nodeside import protocol as p
from nodeside.config import SchedulerConfig
from nodeside.evict.lines import (
    CHECKPOINTED,
    CHECKPOINTING,
    FAILED,
    RESTORING,
    RUNNING,
    Checkpoint,
    EvictionLines,
    Restore,
)
from nodeside.model import Registration
from nodeside.scheduler.core import Drop, GpuSpec, Grant, Released, Revoke, Scheduler

GiB = 1 << 30


@pytest.fixture
def scheduler() -> Scheduler:
    return Scheduler(SchedulerConfig(tq=1.0), [GpuSpec(0, "logical GPU", None, 8 * GiB)], 0.0)


@pytest.fixture
def lines(scheduler: Scheduler) -> EvictionLines:
    """Lines with one checkpointed client, c1 (pid 101), and a managed one, c2."""
    lines = EvictionLines(scheduler)
    for name in ("ckpt", "managed"):
        scheduler.register(0.0, Registration(name=name, working_set=6 * GiB))
    lines.register("c1", 101, 0, "ckpt")
    return lines


def evicted(lines: EvictionLines) -> Checkpoint:
    """c1 released with evict: its checkpoint starts."""
    (job,) = lines.take([Released("c1", evict=True)])
    assert job == Checkpoint("c1", 0, 101)
    return job


def test_nobody_checkpointed_means_quiet_and_every_action_goes_as_it_came(scheduler) -> None:
    lines = EvictionLines(scheduler)
    actions = [Released("c9", evict=True), Grant("c8", 0, 1.0), Drop("c7", 0, "quantum", True, 5)]
    assert lines.quiet()
    assert lines.take(actions) == actions
    assert lines.quiet()


def test_a_registered_client_makes_the_lines_not_quiet(lines: EvictionLines) -> None:
    assert not lines.quiet()
    lines.forget("c1")
    assert lines.quiet()


def test_the_next_grant_waits_for_the_leavers_checkpoint(lines: EvictionLines) -> None:
    job = evicted(lines)
    assert lines.checkpoint("c1") == (CHECKPOINTING, None)
    assert lines.take([Grant("c2", 0, 1.0)]) == []
    assert lines.checkpoint_done(job) == [Grant("c2", 0, 1.0)]
    assert lines.checkpoint("c1") == (CHECKPOINTED, None)
    assert lines.quiet() is False and lines.blocked(0) is None


def test_a_release_without_evict_checkpoints_nothing(lines: EvictionLines) -> None:
    released = Released("c1", evict=False)
    assert lines.take([released, Grant("c2", 0, 1.0)]) == [released, Grant("c2", 0, 1.0)]
    assert lines.checkpoint("c1") == (RUNNING, None)


def test_a_checkpointed_clients_grant_follows_its_restore(lines: EvictionLines) -> None:
    lines.checkpoint_done(evicted(lines))
    (restore,) = lines.take([Grant("c1", 0, 1.0)])
    assert restore == Restore("c1", 0, 101)
    assert lines.checkpoint("c1") == (RESTORING, None)
    assert lines.restore_done(restore) == [Grant("c1", 0, 1.0)]
    assert lines.checkpoint("c1") == (RUNNING, None)
    assert lines.blocked(0) is None


def test_a_grant_held_back_is_known_before_it_is_taken(lines: EvictionLines) -> None:
    assert not lines.hold_back(Grant("c1", 0, 1.0))
    job = evicted(lines)
    assert lines.hold_back(Grant("c2", 0, 1.0))  # the line is busy
    lines.checkpoint_done(job)
    assert lines.hold_back(Grant("c1", 0, 1.0))  # its process is checkpointed
    assert not lines.hold_back(Grant("c2", 0, 1.0))


def test_a_revoked_holder_hears_the_revocation_then_is_checkpointed_by_force(
        lines: EvictionLines) -> None:
    revoke = Revoke("c1", 0, p.REASON_QUANTUM, 10.0)
    assert lines.take([revoke, Grant("c2", 0, 1.0)]) == [revoke, Checkpoint("c1", 0, 101,
                                                                             forced=True)]
    assert lines.checkpoint_done(Checkpoint("c1", 0, 101, forced=True)) == [Grant("c2", 0, 1.0)]


def test_a_drop_for_another_goes_at_once_but_not_ahead_of_its_own_grant(
        lines: EvictionLines) -> None:
    job = evicted(lines)
    assert lines.take([Grant("c2", 0, 1.0)]) == []
    drop = Drop("c2", 0, p.REASON_QUANTUM, False, 5.0)
    assert lines.take([drop]) == []  # c2 must hear its grant first
    other = Drop("c3", 0, p.REASON_QUANTUM, False, 5.0)
    assert lines.take([other]) == [other]
    assert lines.checkpoint_done(job) == [Grant("c2", 0, 1.0), drop]


def test_a_wait_cancelled_before_its_grant_went_out_takes_the_grant_with_it(
        lines: EvictionLines) -> None:
    job = evicted(lines)
    lines.take([Grant("c2", 0, 1.0)])
    assert lines.take([Released("c2", evict=False)]) == [Released("c2", evict=False)]
    assert lines.checkpoint_done(job) == []
    assert lines.blocked(0) is None


def test_a_failed_checkpoint_stops_the_line_and_says_why(lines: EvictionLines) -> None:
    job = evicted(lines)
    lines.take([Grant("c2", 0, 1.0)])
    assert lines.checkpoint_failed(job, "lock failed (process state FAILED)", now=0.0) == []
    assert lines.checkpoint("c1") == (FAILED, "lock failed (process state FAILED)")
    blocked = lines.blocked(0)
    assert blocked is not None
    assert "checkpoint of ckpt (c1, pid 101) failed: lock failed" in blocked
    assert lines.take([Grant("c3", 0, 1.0)]) == []
    assert lines.hold_back(Grant("c2", 0, 1.0))


def test_the_failed_process_going_away_lets_the_line_go_on(lines: EvictionLines) -> None:
    job = evicted(lines)
    lines.take([Grant("c2", 0, 1.0)])
    lines.checkpoint_failed(job, "failed", now=0.0)
    assert lines.forget("c1") == [Grant("c2", 0, 1.0)]
    assert lines.blocked(0) is None and lines.quiet()


def test_nvml_showing_room_for_the_next_holder_lets_the_line_go_on(
        lines: EvictionLines) -> None:
    job = evicted(lines)
    lines.take([Grant("c2", 0, 1.0)])  # c2 needs 6 GiB of the 8
    lines.checkpoint_failed(job, "failed", now=0.0)
    assert lines.memory_seen(0, None) == []  # no NVML: nothing says it is free
    assert lines.memory_seen(0, 3 * GiB) == []  # 5 GiB free
    assert lines.blocked(0) is not None
    assert lines.memory_seen(0, 2 * GiB) == [Grant("c2", 0, 1.0)]
    assert lines.blocked(0) is None


def test_a_failed_restore_still_sends_the_grant_so_its_cuda_calls_fail_and_say_so(
        lines: EvictionLines) -> None:
    lines.checkpoint_done(evicted(lines))
    (restore,) = lines.take([Grant("c1", 0, 1.0)])
    assert lines.restore_failed(restore, "restore failed") == [Grant("c1", 0, 1.0)]
    assert lines.checkpoint("c1") == (FAILED, "restore failed")
    assert lines.blocked(0) is None


def test_a_slow_lock_is_shown_while_the_job_goes_on(lines: EvictionLines) -> None:
    job = evicted(lines)
    lines.checkpoint_slow(job, "its GPU work still runs 10.0 s after the lock was asked for")
    assert lines.checkpoint("c1") == (CHECKPOINTING, "its GPU work still runs 10.0 s after the "
                                                     "lock was asked for")
    lines.checkpoint_done(job)
    assert lines.checkpoint("c1") == (CHECKPOINTED, None)


def test_a_job_whose_client_went_away_ends_quietly_and_frees_the_line(
        lines: EvictionLines) -> None:
    job = evicted(lines)
    lines.take([Grant("c2", 0, 1.0)])
    assert lines.forget("c1") == []  # its job still runs: the grant waits for it
    assert lines.checkpoint_failed(job, "no such process", now=0.0) == [Grant("c2", 0, 1.0)]
    assert lines.blocked(0) is None and lines.quiet()


def test_a_queued_job_for_a_client_that_went_away_is_skipped(
        lines: EvictionLines, scheduler: Scheduler) -> None:
    scheduler.register(0.0, Registration(name="ckpt2"))
    lines.register("c3", 103, 0, "ckpt2")
    first = evicted(lines)
    assert lines.take([Released("c3", evict=True), Grant("c2", 0, 1.0)]) == []
    lines.forget("c3")
    assert lines.checkpoint_done(first) == [Grant("c2", 0, 1.0)]


def test_only_checkpointed_clients_have_a_checkpoint_state(lines: EvictionLines) -> None:
    assert lines.checkpoint("c1") == (RUNNING, None)
    assert lines.checkpoint("c2") is None


def test_a_client_whose_checkpoint_failed_is_never_checkpointed_again(
        lines: EvictionLines) -> None:
    job = evicted(lines)
    lines.take([Grant("c2", 0, 1.0)])
    assert lines.checkpoint_failed(job, "no CUDA process", now=0.0, memory_free=True) == \
        [Grant("c2", 0, 1.0)]
    # Its next holds end like a managed client's: no job, and a revoke takes nothing by force.
    assert lines.take([Released("c1", evict=True)]) == [Released("c1", evict=True)]
    revoke = Revoke("c1", 0, p.REASON_QUANTUM, 5.0)
    assert lines.take([revoke]) == [revoke]
    assert lines.checkpoint("c1") == (FAILED, "no CUDA process")
    assert lines.blocked(0) is None
