"""Each GPU's line of work under the checkpoint evictor: the scheduler's actions and the jobs
they wait for, in order.

The scheduler decides as before; this sits between its actions and the sockets. Each GPU has
one line of work, in order: actions to send, and checkpoint jobs (lock, checkpoint) or restore
jobs (restore, unlock) that run on a worker thread. While a job runs, what comes after it on
the same GPU waits, so a grant that follows a checkpoint is sent only once the checkpoint is
done, and a holder's grant only once it is restored. When no job is under way, actions go out
at once: the handoff's hot path is one dictionary look-up longer.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from nodeside.evict.jobs import Record
from nodeside.scheduler.core import Action, Drop, Grant, Released, Revoke, Scheduler


class Shell(Protocol):
    """What the evictor needs of the daemon."""

    scheduler: Scheduler

    def resume(self, actions: list[Action]) -> None:
        """Carry out actions the evictor held back (already counted when they first came)."""


@dataclass
class Job:
    record: Record
    kind: str  # "checkpoint" | "restore"
    forced: bool = False


@dataclass
class Line:
    queue: deque[Action | Job] = field(default_factory=deque)
    busy: bool = False
    #: Why nothing more is granted on this GPU (a failed checkpoint), and by whom.
    blocked: str | None = None
    blocker: Record | None = None

    @property
    def idle(self) -> bool:
        """No job under way, nothing queued, not blocked: an action on this GPU may go now."""
        return not self.busy and not self.queue and self.blocked is None


class GpuLines:
    """The lines half of ``CheckpointEvictor``: which actions wait, and for what."""

    shell: Shell
    records: dict[str, Record]
    _lines: dict[int, Line]
    _passed: set[int]  # ids of actions already let through once

    def _run(self, gpu: int, job: Job) -> Coroutine[Any, Any, None]:
        raise NotImplementedError

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

    def _items(self, action: Action) -> list[Action | Job] | None:
        """What the action becomes on its GPU's line; None when it bypasses the line."""
        if isinstance(action, Released):
            # A hold that ended (or a wait cancelled) before its grant went out: that grant,
            # and any drop behind it, are stale now.
            self._discard(action.client)
            record = self.records.get(action.client)
            if record is not None and action.evict:
                return [Job(record, "checkpoint")]
            return None  # the reply to a release is the daemon's own business
        record = self.records.get(action.client)
        line = self._lines.get(action.gpu)
        idle = line is None or line.idle
        if isinstance(action, Revoke) and record is not None:
            # It ignored the drop: take the GPU from outside the process.
            return [action, Job(record, "checkpoint", forced=True)]
        if isinstance(action, Grant) and record is not None and \
                (record.state != "running" or not idle):
            return [Job(record, "restore"), action]
        if idle or (isinstance(action, (Drop, Revoke)) and not self._queued(line, action.client)):
            # Asking a holder to leave depends on nothing queued, unless its own grant still
            # is (it must not hear the drop first). A drop that answers a release keeps its seq.
            return None
        return [action]

    def _queued(self, line: Line | None, client_id: str) -> bool:
        return line is not None and any(
            (item.record.client if isinstance(item, Job) else item.client) == client_id
            for item in line.queue)

    def _discard(self, client_id: str) -> None:
        for line in self._lines.values():
            stale = [item for item in line.queue
                     if not isinstance(item, Job) and item.client == client_id]
            for item in stale:
                line.queue.remove(item)

    def _gpu_of(self, action: Action) -> int:
        if isinstance(action, Released):
            return self.records[action.client].gpu
        return action.gpu

    def _line(self, gpu: int) -> Line:
        return self._lines.setdefault(gpu, Line())

    def _pump(self, gpu: int) -> list[Action]:
        """Take from the GPU's line what can go now, up to the next job (which starts)."""
        line = self._line(gpu)
        ready: list[Action] = []
        while line.queue and not line.busy and line.blocked is None:
            item = line.queue.popleft()
            if not isinstance(item, Job):
                ready.append(item)
                continue
            if item.record.gone or not self._needed(item):
                continue
            line.busy = True
            asyncio.ensure_future(self._run(gpu, item))
        if line.idle:
            del self._lines[gpu]
        return ready

    def _needed(self, job: Job) -> bool:
        state = job.record.state
        return state == "running" if job.kind == "checkpoint" else state != "running"

    def _resume(self, gpu: int) -> None:
        ready = self._pump(gpu)
        if ready:
            # They come back through the daemon's delivery, which asks filter again: let them by.
            self._passed.update(id(a) for a in ready)
            self.shell.resume(ready)
