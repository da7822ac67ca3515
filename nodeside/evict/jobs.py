"""The blocking half of the checkpoint evictor: suspending and resuming one process.

Each function runs on a worker thread (the driver's calls block for as long as the copy takes,
seconds for tens of GiB) and only changes the process's ``Record``; the evictor on the event
loop decides what happens around them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from nodeside.evict.checkpoint import NOT_READY, CheckpointApi, CheckpointError, ProcessState

log = logging.getLogger("kiwi.daemon")


@dataclass
class Record:
    """One process registered with the checkpoint evictor."""

    client: str
    pid: int
    gpu: int
    name: str = ""
    #: running | checkpointing | checkpointed | restoring | failed
    state: str = "running"
    error: str | None = None
    gone: bool = False  # the connection closed: jobs for it stop or are skipped


def suspend(api: CheckpointApi, record: Record, lock_timeout: float, forced: bool) -> None:
    """Lock (again and again while the process's GPU work runs on), then checkpoint."""
    attempts = 0
    while not record.gone:
        try:
            api.lock(record.pid, lock_timeout)
            break
        except CheckpointError as exc:
            if exc.code != NOT_READY:
                raise
            attempts += 1
            record.error = (f"its GPU work still runs {attempts * lock_timeout:.1f} s after "
                            "the lock was asked for; still trying")
            if attempts & (attempts - 1) == 0:  # 1, 2, 4, 8...: a hung process, not a flood
                log.warning("%s (pid %d): %s", record.name, record.pid, record.error)
    if record.gone:
        return
    api.checkpoint(record.pid)
    record.state, record.error = "checkpointed", None
    log.info("%s %s (%s, pid %d)%s: its GPU memory is in host memory",
             "Revoked" if forced else "Checkpointed", record.name, record.client, record.pid,
             " by a forced checkpoint" if forced else "")


def resume(api: CheckpointApi, record: Record) -> None:
    """Restore (when checkpointed) and unlock: the process may run on the GPU again."""
    if api.state(record.pid) == ProcessState.CHECKPOINTED:
        api.restore(record.pid)
    api.unlock(record.pid)
    record.state, record.error = "running", None
    log.debug("Restored %s (%s, pid %d)", record.name, record.client, record.pid)
