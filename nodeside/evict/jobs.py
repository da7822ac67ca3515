"""The blocking half of the checkpoint evictor: suspending and resuming one process.

Each function runs on a worker thread (the driver's calls block for as long as the copy takes,
seconds for tens of GiB) and touches nothing of the daemon's: it acts on a pid, says how a slow
lock is going through ``slow`` and whether to give up through ``cancelled``, and its return or
its exception is the result the shell feeds back to the lines (``lines.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from nodeside.evict.checkpoint import (
    NOT_READY,
    CheckpointApi,
    CheckpointError,
    CheckpointUnavailable,
    ProcessState,
)
from nodeside.evict.lines import Checkpoint, Restore

log = logging.getLogger("kiwi.daemon")


def suspend(api: CheckpointApi, job: Checkpoint, name: str, lock_timeout: float,
            cancelled: Callable[[], bool], slow: Callable[[str], None]) -> None:
    """Lock (again and again while the process's GPU work runs on), then checkpoint; gives up
    quietly once ``cancelled`` says its client has gone."""
    attempts = 0
    while not cancelled():
        try:
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
    api.checkpoint(job.pid)
    log.info("%s %s (%s, pid %d)%s: its GPU memory is in host memory",
             "Revoked" if job.forced else "Checkpointed", name, job.client, job.pid,
             " by a forced checkpoint" if job.forced else "")


def resume(api: CheckpointApi, job: Restore, name: str) -> None:
    """Restore (when checkpointed) and unlock: the process may run on the GPU again."""
    if api.state(job.pid) == ProcessState.CHECKPOINTED:
        api.restore(job.pid)
    api.unlock(job.pid)
    log.debug("Restored %s (%s, pid %d)", name, job.client, job.pid)


def failure(api: CheckpointApi | None, pid: int, exc: BaseException) -> str:
    """What a failed job says: the error, and the state the driver left the process in."""
    try:
        state = api.state(pid).name if api is not None else "unknown"
    except (CheckpointError, CheckpointUnavailable, ValueError):
        state = "unknown"
    return f"{exc} (process state {state})"
