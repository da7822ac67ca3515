"""The daemon's checkpoint evictor: suspends and resumes processes between the scheduler's
actions, so that a grant never reaches the next holder before the GPU really is free.

Split by role: ``lines`` holds each GPU's line of work (which actions wait, and for which
job), ``runner`` runs the jobs and stops a line whose checkpoint failed, and this file is what
the daemon sees: who is checkpointed, who has gone, and what the status document says of it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from nodeside.evict import CHECKPOINT, MANAGED
from nodeside.evict import checkpoint as api_module
from nodeside.evict.checkpoint import CheckpointApi, CheckpointUnavailable
from nodeside.evict.jobs import Record
from nodeside.evict.lines import Line, Shell
from nodeside.evict.policy import choose
from nodeside.evict.runner import JobRunner
from nodeside.scheduler.core import Client

log = logging.getLogger("kiwi.daemon")


class CheckpointEvictor(JobRunner):
    def __init__(self, shell: Shell, library: str, lock_timeout: Callable[[], float],
                 memory_used: Callable[[], dict[int, int | None]]) -> None:
        self.shell = shell
        self.library = library
        self.lock_timeout = lock_timeout
        self.memory_used = memory_used
        self.records: dict[str, Record] = {}
        self._lines: dict[int, Line] = {}
        self._passed: set[int] = set()  # ids of actions already let through once
        self._api: CheckpointApi | None = None
        self._api_missing: str | None = None

    # -- registration ----------------------------------------------------------------------

    def register(self, client: Client, requested: str | None) -> str:
        """The evictor for a newly registered client: the one it asked for when this daemon
        can carry it out, else managed, said in one log line."""
        missing = self._load_api() if requested == CHECKPOINT else None
        evictor, why = choose(requested, client.pid, client.uid, missing)
        if why is not None:
            log.warning("%s (pid %s) asked to be checkpointed; paging it as managed memory "
                        "instead: %s", client.name, client.pid, why)
        if evictor == CHECKPOINT and client.pid is not None:
            self.records[client.id] = Record(client.id, client.pid, client.gpu, client.name)
        return evictor

    def _load_api(self) -> str | None:
        if self._api is None and self._api_missing is None:
            try:
                self._api = api_module.load(self.library)
            except CheckpointUnavailable as exc:
                self._api_missing = str(exc)
        return self._api_missing

    def forget(self, client_id: str) -> None:
        """The client's connection closed. A process that dies takes its checkpoint with it."""
        self._discard(client_id)
        record = self.records.pop(client_id, None)
        if record is None:
            return
        record.gone = True
        if record.state != "running":
            log.info("Client %s (%s, pid %d) went away while %s; nothing to restore",
                     record.name, client_id, record.pid, record.state)
        line = self._lines.get(record.gpu)
        if line is not None and line.blocker is record:
            log.info("GPU %d: the process whose checkpoint failed is gone; granting again",
                     record.gpu)
            line.blocked = line.blocker = None
            self._resume(record.gpu)

    # -- status ----------------------------------------------------------------------------

    def annotate(self, status: dict[str, Any]) -> dict[str, Any]:
        """Adds each client's evictor and checkpoint state, and each GPU's blocked reason."""
        for entry in status.get("clients", ()):
            record = self.records.get(entry.get("id"))
            entry.setdefault("evict", CHECKPOINT if record else MANAGED)
            if record is not None:
                entry["checkpoint_state"] = record.state
                entry["checkpoint_error"] = record.error
        for entry in status.get("gpus", ()):
            line = self._lines.get(entry.get("index"))
            entry["evict_blocked"] = line.blocked if line is not None else None
        return status
