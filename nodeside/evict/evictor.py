"""The daemon's checkpoint evictor: suspends and resumes processes between the scheduler's
actions, so that a grant never reaches the next holder before the GPU really is free.

The scheduler decides as before; this sits between its actions and the sockets. Each GPU has
one line of work, in order: actions to send, and checkpoint jobs (lock, checkpoint) or restore
jobs (restore, unlock) that run on a worker thread. While a job runs, what comes after it on
the same GPU waits, so a grant that follows a checkpoint is sent only once the checkpoint is
done, and a holder's grant only once it is restored. When no job is under way, actions go out
at once: the handoff's hot path is one dictionary look-up longer.

When a checkpoint fails the process may still hold its memory (the driver leaves it FAILED):
the GPU's line stops there, and nothing more is granted on that GPU until the process is gone
or NVML shows the room free. The reason is logged and shown in the status document.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from nodeside.evict import CHECKPOINT, MANAGED
from nodeside.evict import checkpoint as api_module
from nodeside.evict.checkpoint import (
    CheckpointApi,
    CheckpointError,
    CheckpointUnavailable,
)
from nodeside.evict.jobs import Record, resume, suspend
from nodeside.evict.policy import choose
from nodeside.scheduler.core import Action, Client, Drop, Grant, Released, Revoke, Scheduler

log = logging.getLogger("kiwi.daemon")

#: Seconds between looks at NVML while a failed checkpoint holds a GPU's line.
RECHECK_SECONDS = 1.0


class Shell(Protocol):
    """What the evictor needs of the daemon."""

    scheduler: Scheduler

    def resume(self, actions: list[Action]) -> None:
        """Carry out actions the evictor held back (already counted when they first came)."""


@dataclass
class _Job:
    record: Record
    kind: str  # "checkpoint" | "restore"
    forced: bool = False


@dataclass
class _Line:
    queue: deque[Action | _Job] = field(default_factory=deque)
    busy: bool = False
    #: Why nothing more is granted on this GPU (a failed checkpoint), and by whom.
    blocked: str | None = None
    blocker: Record | None = None

    @property
    def idle(self) -> bool:
        """No job under way, nothing queued, not blocked: an action on this GPU may go now."""
        return not self.busy and not self.queue and self.blocked is None


class CheckpointEvictor:
    def __init__(self, shell: Shell, library: str, lock_timeout: Callable[[], float],
                 memory_used: Callable[[], dict[int, int | None]]) -> None:
        self.shell = shell
        self.library = library
        self.lock_timeout = lock_timeout
        self.memory_used = memory_used
        self.records: dict[str, Record] = {}
        self._lines: dict[int, _Line] = {}
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

    # -- actions ---------------------------------------------------------------------------

    def hold_back(self, grant: Grant) -> bool:
        """Must this grant (about to be sent as acquire's reply) wait for the GPU's line?"""
        record = self.records.get(grant.client)
        line = self._lines.get(grant.gpu)
        return (line is not None and not line.idle) or \
            (record is not None and record.state != "running")

    def filter(self, actions: list[Action]) -> list[Action]:
        """The actions that may be carried out now; the others are carried out (through the
        daemon's apply) once the jobs before them on their GPU are done."""
        if not self.records and not self._lines and not self._passed:
            return actions  # nobody is checkpointed: the hot path
        now: list[Action] = []
        touched: list[int] = []
        for action in actions:
            if id(action) in self._passed:
                self._passed.discard(id(action))
                now.append(action)
                continue
            items = self._items(action)
            if items is None:
                now.append(action)
                continue
            gpu = self._gpu_of(action)
            self._line(gpu).queue.extend(items)
            touched.append(gpu)
        for gpu in dict.fromkeys(touched):
            now.extend(self._pump(gpu))
        return now

    def _items(self, action: Action) -> list[Action | _Job] | None:
        """What the action becomes on its GPU's line; None when it bypasses the line."""
        if isinstance(action, Released):
            # A hold that ended (or a wait cancelled) before its grant went out: that grant,
            # and any drop behind it, are stale now.
            self._discard(action.client)
            record = self.records.get(action.client)
            if record is not None and action.evict:
                return [_Job(record, "checkpoint")]
            return None  # the reply to a release is the daemon's own business
        record = self.records.get(action.client)
        line = self._lines.get(action.gpu)
        idle = line is None or line.idle
        if isinstance(action, Revoke) and record is not None:
            # It ignored the drop: take the GPU from outside the process.
            return [action, _Job(record, "checkpoint", forced=True)]
        if isinstance(action, Grant) and record is not None and \
                (record.state != "running" or not idle):
            return [_Job(record, "restore"), action]
        if idle or (isinstance(action, (Drop, Revoke)) and not self._queued(line, action.client)):
            # Asking a holder to leave depends on nothing queued, unless its own grant still
            # is (it must not hear the drop first). A drop that answers a release keeps its seq.
            return None
        return [action]

    def _queued(self, line: _Line | None, client_id: str) -> bool:
        return line is not None and any(
            (item.record.client if isinstance(item, _Job) else item.client) == client_id
            for item in line.queue)

    def _discard(self, client_id: str) -> None:
        for line in self._lines.values():
            stale = [item for item in line.queue
                     if not isinstance(item, _Job) and item.client == client_id]
            for item in stale:
                line.queue.remove(item)

    def _gpu_of(self, action: Action) -> int:
        if isinstance(action, Released):
            return self.records[action.client].gpu
        return action.gpu

    def _line(self, gpu: int) -> _Line:
        return self._lines.setdefault(gpu, _Line())

    def _pump(self, gpu: int) -> list[Action]:
        """Take from the GPU's line what can go now, up to the next job (which starts)."""
        line = self._line(gpu)
        ready: list[Action] = []
        while line.queue and not line.busy and line.blocked is None:
            item = line.queue.popleft()
            if not isinstance(item, _Job):
                ready.append(item)
                continue
            if item.record.gone or not self._needed(item):
                continue
            line.busy = True
            asyncio.ensure_future(self._run(gpu, item))
        if line.idle:
            del self._lines[gpu]
        return ready

    def _needed(self, job: _Job) -> bool:
        state = job.record.state
        return state == "running" if job.kind == "checkpoint" else state != "running"

    def _resume(self, gpu: int) -> None:
        ready = self._pump(gpu)
        if ready:
            # They come back through the daemon's delivery, which asks filter again: let them by.
            self._passed.update(id(a) for a in ready)
            self.shell.resume(ready)

    # -- jobs ------------------------------------------------------------------------------

    async def _run(self, gpu: int, job: _Job) -> None:
        record, loop = job.record, asyncio.get_running_loop()
        record.state = "checkpointing" if job.kind == "checkpoint" else "restoring"
        try:
            await loop.run_in_executor(None, self._work, job)
        except Exception as exc:  # CheckpointError, or a bug: neither may leave the line stuck
            self._failed(gpu, job, exc)
        finally:
            line = self._line(gpu)
            line.busy = False
            self._resume(gpu)

    def _work(self, job: _Job) -> None:
        """The job's blocking part, on a worker thread."""
        api = self._require_api()
        if job.kind == "checkpoint":
            suspend(api, job.record, self.lock_timeout(), job.forced)
        else:
            resume(api, job.record)

    def _require_api(self) -> CheckpointApi:
        if self._api is None:
            raise CheckpointUnavailable(self._api_missing or "no checkpoint API")
        return self._api

    def _failed(self, gpu: int, job: _Job, exc: Exception) -> None:
        record = job.record
        if record.gone:
            return  # it died under us: its memory went with it
        state = self._state_of(record)
        record.error = f"{exc} (process state {state})"
        record.state = "failed"
        if job.kind == "restore":
            # The process cannot run on the GPU again; its grant still goes out, so that its
            # CUDA calls fail and say so, rather than wait for ever.
            log.error("Could not restore %s (%s, pid %d): %s", record.name, record.client,
                      record.pid, record.error)
            return
        line = self._line(gpu)
        line.blocked = (f"the checkpoint of {record.name} ({record.client}, pid {record.pid}) "
                        f"failed: "
                        f"{record.error}; nothing is granted on GPU {gpu} until it exits or "
                        "NVML shows its memory free")
        line.blocker = record
        log.error("GPU %d: %s", gpu, line.blocked)
        asyncio.get_running_loop().call_later(RECHECK_SECONDS, self._recheck, gpu)

    def _state_of(self, record: Record) -> str:
        try:
            return self._require_api().state(record.pid).name
        except (CheckpointError, CheckpointUnavailable, ValueError):
            return "unknown"

    def _recheck(self, gpu: int) -> None:
        line = self._lines.get(gpu)
        if line is None or line.blocked is None:
            return
        if self._room_free(gpu, line):
            log.warning("GPU %d: NVML shows the memory free despite the failed checkpoint of "
                        "%s; granting again", gpu, line.blocker.client if line.blocker else "?")
            line.blocked = line.blocker = None
            self._resume(gpu)
            return
        asyncio.get_running_loop().call_later(RECHECK_SECONDS, self._recheck, gpu)

    def _room_free(self, gpu: int, line: _Line) -> bool:
        state = self.shell.scheduler.gpus.get(gpu)
        used = self.memory_used().get(gpu)
        if state is None or used is None or state.spec.memory_total is None:
            return False  # without NVML nothing says the memory is free
        incoming = next((a for a in line.queue if isinstance(a, Grant)), None)
        client = self.shell.scheduler.clients.get(incoming.client) if incoming else None
        need = client.working_set if client and client.working_set is not None \
            else state.spec.memory_total
        return state.spec.memory_total - used >= need

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
