"""The blocking half of the checkpoint evictor: suspending and resuming one process.

Each function runs on a worker thread (the driver's calls block for as long as the copy takes,
seconds for tens of GiB) and touches nothing of the daemon's: it acts on a pid, says how a slow
lock is going through ``slow`` and whether to give up through ``cancelled``, and its return or
its exception is the result the shell feeds back to the lines (``lines.py``).

Before every call of the driver the pid is checked against the identity of the process that
registered (``identity.py``): a pid that names another process now, or one of another uid, is
never acted on (``ProcessChanged``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from nodeside.evict.checkpoint import (
    INVALID_VALUE,
    NOT_READY,
    CheckpointApi,
    CheckpointError,
    CheckpointUnavailable,
    ProcessState,
)
from nodeside.evict.lines import Checkpoint, Job, Restore

log = logging.getLogger("kiwi.daemon")


class ProcessChanged(Exception):
    """The job's pid no longer names the process that registered; the message says how."""


@dataclass(frozen=True)
class Failure:
    """Why a job failed; ``memory_free``: the process holds no GPU memory (the driver knows no
    CUDA process by its pid, or the pid names another process now)."""

    error: str
    memory_free: bool = False


def same_process(job: Job) -> None:
    """Raise ProcessChanged unless the job's pid still names the process that registered."""
    if job.identity is not None:
        why = job.identity.mismatch()
        if why is not None:
            raise ProcessChanged(why)


def suspend(api: CheckpointApi, job: Checkpoint, name: str, lock_timeout: float,
            cancelled: Callable[[], bool], slow: Callable[[str], None]) -> None:
    """Lock (again and again while the process's GPU work runs on), then checkpoint; gives up
    quietly once ``cancelled`` says its client has gone."""
    attempts = 0
    while not cancelled():
        try:
            same_process(job)
            api.lock(job.pid, lock_timeout)
            break
        except CheckpointError as exc:
            if exc.code != NOT_READY:
                raise
            attempts += 1
            why = (f"its GPU work still runs {attempts * lock_timeout:.1f} s after the lock "
                   "was asked for; still trying")
            slow(why)
            if attempts & (attempts - 1) == 0:  # 1, 2, 4, 8...: a hung process, not a flood
                log.warning("%s (pid %d): %s", name, job.pid, why)
    if cancelled():
        return
    same_process(job)
    api.checkpoint(job.pid)
    log.info("%s %s (%s, pid %d)%s: its GPU memory is in host memory",
             "Revoked" if job.forced else "Checkpointed", name, job.client, job.pid,
             " by a forced checkpoint" if job.forced else "")


def resume(api: CheckpointApi, job: Restore, name: str) -> None:
    """Restore (when checkpointed) and unlock: the process may run on the GPU again."""
    same_process(job)
    if api.state(job.pid) == ProcessState.CHECKPOINTED:
        same_process(job)
        api.restore(job.pid)
    same_process(job)
    api.unlock(job.pid)
    log.debug("Restored %s (%s, pid %d)", name, job.client, job.pid)


def failure(api: CheckpointApi | None, job: Job, exc: BaseException) -> Failure:
    """What a failed job says: the error, and the state the driver left the process in."""
    if isinstance(exc, CheckpointError) and exc.code == INVALID_VALUE:
        # The driver knows no CUDA process by this pid: nothing of it is on the GPU.
        return Failure(f"{exc} (no CUDA process)", memory_free=True)
    try:
        same_process(job)
        state = api.state(job.pid).name if api is not None else "unknown"
    except (CheckpointError, CheckpointUnavailable, ProcessChanged, ValueError):
        state = "unknown"
    return Failure(f"{exc} (process state {state})")
