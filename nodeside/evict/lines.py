"""Each GPU's line of work under the checkpoint evictor, sans I/O: the scheduler's actions, and
the checkpoints and restores they must wait for, in order.

The scheduler decides as before; the shell passes its actions through ``take`` on their way to
the clients. Each GPU has one line: while a job (``Checkpoint``: lock, then checkpoint;
``Restore``: restore, then unlock) runs on that GPU, what comes after it waits, so a grant that
follows a checkpoint goes out only once the checkpoint is done, and a holder's grant only once
it is restored. ``take`` and every event (``checkpoint_done``, ``checkpoint_failed``,
``restore_done``, ``restore_failed``, ``memory_seen``, ``forget``) return what may go now, in
order: scheduler actions to deliver and jobs to start. The shell (``evictor.py``) runs each job
on a worker thread and feeds its result back here; nothing here blocks, waits or keeps a clock:
the shell passes the time in.

A failed checkpoint stops its GPU's line only while the process may still hold its memory, and
never past a deadline: one grace period (config ``grace``) after the failure the line goes on
(``expire``). Either way the client is marked not checkpointable: no job is started for it again
but one unlock of a process the driver may have left locked.

When nobody is checkpointed ``quiet`` is true and the shell delivers actions without asking:
the handoff's hot path does not come here at all.

The core's ``Suspend`` (feature ``memory``: an idle client that did not answer ``evict`` in time,
or one evicted and idle for ``checkpoint_after``) becomes a ``Checkpoint`` on its GPU's line
where a record reaches the client; its result goes back to the core as a ``Checkpointed`` item
(``Scheduler.checkpointed``), and at once, failed, where no record does. A client that pages
itself (``vmm``) is registered ``on_demand``: only a ``Suspend`` checkpoints it.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Final

from nodeside.evict.identity import ProcessIdentity
from nodeside.scheduler.core import Action, Drop, Grant, Released, Revoke, Scheduler, Suspend

log = logging.getLogger("kiwi.daemon")

#: A checkpointed client's states: what it is, and what is under way.
RUNNING: Final = "running"
CHECKPOINTING: Final = "checkpointing"
CHECKPOINTED: Final = "checkpointed"
RESTORING: Final = "restoring"
FAILED: Final = "failed"


# Values like the scheduler's actions (and written the same way: see scheduler/actions.py).
@dataclass(init=False, unsafe_hash=True)
class Checkpoint:
    """Suspend a process: lock its CUDA calls once its submitted work is done, then move its
    device memory to host memory. ``forced``: it ignored a drop (a revocation). ``identity``:
    the process that registered, checked before each call (None: only in tests)."""

    client: Final[str]
    gpu: Final[int]
    pid: Final[int]
    forced: Final[bool]
    identity: Final[ProcessIdentity | None]

    def __init__(self, client: str, gpu: int, pid: int, forced: bool = False,
                 identity: ProcessIdentity | None = None) -> None:
        self.client = client
        self.gpu = gpu
        self.pid = pid
        self.forced = forced
        self.identity = identity


@dataclass(init=False, unsafe_hash=True)
class Restore:
    """Resume a process: restore its device memory (when checkpointed), then unlock it."""

    client: Final[str]
    gpu: Final[int]
    pid: Final[int]
    identity: Final[ProcessIdentity | None]

    def __init__(self, client: str, gpu: int, pid: int,
                 identity: ProcessIdentity | None = None) -> None:
        self.client = client
        self.gpu = gpu
        self.pid = pid
        self.identity = identity


Job = Checkpoint | Restore


@dataclass(init=False, unsafe_hash=True)
class Checkpointed:
    """The result of a ``Suspend`` the core asked for, for the core: ``error`` None when the
    process's memory is in host memory now; ``memory_free``: the process holds no GPU memory
    (the driver knows no CUDA process by its pid), so none counts for it."""

    client: Final[str]
    error: Final[str | None]
    memory_free: Final[bool]

    def __init__(self, client: str, error: str | None, memory_free: bool = False) -> None:
        self.client = client
        self.error = error
        self.memory_free = memory_free


#: What the lines let go: actions to deliver, jobs to start, results for the core.
Item = Action | Job | Checkpointed


class Record:
    """One process registered with the checkpoint evictor, and what is known of it."""

    def __init__(self, client: str, pid: int, gpu: int, name: str,
                 identity: ProcessIdentity | None, on_demand: bool = False) -> None:
        self.client = client
        self.pid = pid
        self.gpu = gpu
        self.name = name
        self.identity = identity
        #: It moves its own memory out (``vmm``): checkpointed only when the core asks.
        self.on_demand = on_demand
        #: A checkpoint under way was the core's ``Suspend``: its result goes back to it.
        self.suspended = False
        #: RUNNING, CHECKPOINTING, CHECKPOINTED, RESTORING or FAILED
        self.state: str = RUNNING
        #: False once a checkpoint of it failed: it is never checkpointed again.
        self.checkpointable = True
        #: A failed checkpoint may have left the process locked: one restore (its unlock) is
        #: still tried, at its next grant.
        self.may_be_locked = False
        #: Why the last job failed, or what keeps the current one waiting.
        self.error: str | None = None


class Line:
    """One GPU's line: what waits, the job under way, and why nothing more goes (if so)."""

    def __init__(self) -> None:
        self.queue: deque[Item] = deque()
        self.running: Job | None = None
        #: Why nothing more is granted on this GPU (a failed checkpoint), whose, and until when.
        self.blocked: str | None = None
        self.blocker: str | None = None
        self.blocked_until = 0.0
        #: The same reason, as a non-admin may read it (no pid).
        self.blocked_publicly: str | None = None

    @property
    def idle(self) -> bool:
        """No job under way, nothing queued, not blocked: an action on this GPU may go now."""
        return self.running is None and not self.queue and self.blocked is None


class EvictionLines:
    def __init__(self, scheduler: Scheduler) -> None:
        #: Read only, for the room a blocked line's next holder needs.
        self.scheduler = scheduler
        self.records: dict[str, Record] = {}
        self._lines: dict[int, Line] = {}
        #: Bumped whenever what the status document shows of the lines may have changed (a
        #: record's state or error, a line blocked or freed): kept documents are built again.
        self.version = 0

    def quiet(self) -> bool:
        """Nobody is checkpointed and no line has work: every action may go as it comes."""
        return not self.records and not self._lines

    # -- who is checkpointed ------------------------------------------------------------------

    def register(self, client: str, pid: int, gpu: int, name: str,
                 identity: ProcessIdentity | None = None, on_demand: bool = False) -> None:
        """A client whose process this daemon checkpoints (the shell chose it for it);
        ``identity``: the process as it connected, checked before every job acts on it;
        ``on_demand``: only when the core asks (``Suspend``)."""
        self.records[client] = Record(client, pid, gpu, name, identity, on_demand)
        self.version += 1

    def forget(self, client: str) -> list[Item]:
        """The client's connection closed: what was queued for it is stale, and a process that
        died takes its checkpoint (or the memory a failed one left) with it."""
        self._discard(client)
        record = self.records.pop(client, None)
        if record is None:
            return []
        self.version += 1
        if record.state != RUNNING:
            log.info("Client %s (%s, pid %d) went away while %s; nothing to restore",
                     record.name, client, record.pid, record.state)
        line = self._lines.get(record.gpu)
        if line is None or line.blocker != client:
            return []
        log.info("GPU %d: the process whose checkpoint failed is gone; granting again",
                 record.gpu)
        line.blocked = line.blocker = line.blocked_publicly = None
        return self._pump(record.gpu)

    # -- the scheduler's actions --------------------------------------------------------------

    def hold_back(self, grant: Grant) -> bool:
        """Must this grant (about to be sent as acquire's reply) wait for its GPU's line?"""
        record = self.records.get(grant.client)
        line = self._lines.get(grant.gpu)
        return (line is not None and not line.idle) or \
            (record is not None and record.state != RUNNING)

    def take(self, actions: list[Action]) -> list[Item]:
        """What may go now of ``actions``, and the jobs to start; the rest waits on its GPU's
        line and comes out of a later event, once the jobs before it are done."""
        ready: list[Item] = []
        touched: list[int] = []
        for action in actions:
            items = self._items(action)
            if items is None:
                ready.append(action)
                continue
            gpu = self.records[action.client].gpu if isinstance(action, Released) \
                else action.gpu
            self._line(gpu).queue.extend(items)
            touched.append(gpu)
        for gpu in dict.fromkeys(touched):
            ready.extend(self._pump(gpu))
        return ready

    def _items(self, action: Action) -> list[Item] | None:
        """What the action becomes on its GPU's line; None when it bypasses the line."""
        record = self.records.get(action.client)
        if isinstance(action, Released):
            # A hold that ended (or a wait cancelled) before its grant went out: that grant,
            # and any drop behind it, are stale now.
            self._discard(action.client)
            if record is not None and action.evict and record.checkpointable and \
                    not record.on_demand:
                return [Checkpoint(record.client, record.gpu, record.pid,
                                   identity=record.identity)]
            return None  # the reply to a release is the session's own business
        if isinstance(action, Suspend):
            if record is None:
                return [Checkpointed(action.client, "the checkpoint evictor does not reach "
                                                    "this process")]
            if not record.checkpointable:  # a checkpoint of it failed: never again
                return [Checkpointed(action.client, record.error or "its checkpoint failed")]
            if record.state != RUNNING:
                return [Checkpointed(action.client, None)]  # already checkpointed
            record.suspended = True
            return [Checkpoint(record.client, record.gpu, record.pid, identity=record.identity)]
        line = self._lines.get(action.gpu)
        idle = line is None or line.idle
        if isinstance(action, Revoke) and record is not None and record.checkpointable:
            # It ignored the drop: take the GPU from outside the process.
            return [action, Checkpoint(record.client, record.gpu, record.pid, forced=True,
                                       identity=record.identity)]
        if isinstance(action, Grant) and record is not None and \
                (record.checkpointable or record.may_be_locked) and \
                (record.state != RUNNING or not idle):
            return [Restore(record.client, record.gpu, record.pid, identity=record.identity),
                    action]
        if idle or (isinstance(action, (Drop, Revoke)) and not _queued(line, action.client)):
            # Asking a holder to leave depends on nothing queued, unless its own grant still
            # is (it must not hear the drop first). A drop that answers a release keeps its seq.
            return None
        return [action]

    # -- the jobs' results ----------------------------------------------------------------------

    def checkpoint_slow(self, job: Checkpoint, why: str) -> None:
        """The lock still waits for the process's GPU work (the job goes on trying)."""
        record = self.records.get(job.client)
        if record is not None:
            record.error = why
            self.version += 1

    def checkpoint_done(self, job: Checkpoint) -> list[Item]:
        """The process is checkpointed (or was gone before it could be)."""
        record = self.records.get(job.client)
        if record is not None:
            record.state, record.error = CHECKPOINTED, None
        return [*self._told(record, None), *self._finished(job)]

    def checkpoint_failed(self, job: Checkpoint, error: str, now: float,
                          memory_free: bool = False) -> list[Item]:
        """The checkpoint failed at ``now``; the client is never checkpointed again.

        ``memory_free``: the process holds no GPU memory (the driver knows no CUDA process by
        its pid, or the pid names another process now): the line goes on at once. Otherwise
        the process may still hold its memory (the driver leaves it FAILED): its GPU's line
        stops until the process is gone, the memory is seen free (``memory_seen``), or one
        grace period has passed (``expire``)."""
        record = self.records.get(job.client)
        if record is None:  # it died under the job: its memory went with it
            return self._finished(job)
        told = self._told(record, error, memory_free)
        record.state, record.error = FAILED, error
        record.checkpointable = False
        record.may_be_locked = not memory_free
        if memory_free:
            log.warning("GPU %d: the checkpoint of %s (%s, pid %d) failed: %s; it holds no GPU "
                        "memory, so the GPU goes on; it is not checkpointed again", job.gpu,
                        record.name, record.client, record.pid, error)
            return [*told, *self._finished(job)]
        line = self._line(job.gpu)
        grace = self.scheduler.config.grace
        until = (f"nothing is granted on GPU {job.gpu} until it exits, NVML shows its memory "
                 f"free, or {grace:g} s (grace) have passed")
        line.blocked = (f"the checkpoint of {record.name} ({record.client}, pid {record.pid}) "
                        f"failed: {error}; {until}")
        line.blocked_publicly = f"the checkpoint of {record.name} ({record.client}) failed; " \
            f"{until}"
        line.blocker = record.client
        line.blocked_until = now + grace
        log.error("GPU %d: %s", job.gpu, line.blocked)
        return [*told, *self._finished(job)]

    def restore_done(self, job: Restore) -> list[Item]:
        record = self.records.get(job.client)
        if record is not None:
            record.state, record.error = RUNNING, None
        return self._finished(job)

    def restore_failed(self, job: Restore, error: str) -> list[Item]:
        """The process cannot run on the GPU again; its grant still goes out, so that its CUDA
        calls fail and say so, rather than wait for ever."""
        record = self.records.get(job.client)
        if record is not None:
            record.state, record.error = FAILED, error
            record.may_be_locked = False  # tried once: never again
            log.error("Could not restore %s (%s, pid %d): %s", record.name, record.client,
                      record.pid, error)
        return self._finished(job)

    def memory_seen(self, gpu: int, used: int | None) -> list[Item]:
        """What NVML reads as used on a GPU whose line a failed checkpoint blocks: when the
        next holder's working set fits in what is free, the line goes on."""
        line = self._lines.get(gpu)
        if line is None or line.blocked is None or not self._room_free(gpu, line, used):
            return []
        log.warning("GPU %d: NVML shows the memory free despite the failed checkpoint of %s; "
                    "granting again", gpu, line.blocker or "?")
        line.blocked = line.blocker = line.blocked_publicly = None
        self.version += 1
        return self._pump(gpu)

    def next_deadline(self) -> float | None:
        """When the first line a failed checkpoint blocks must go on anyway (``expire``)."""
        due = [line.blocked_until for line in self._lines.values() if line.blocked is not None]
        return min(due) if due else None

    def expire(self, now: float) -> list[Item]:
        """Lines blocked past their deadline go on: the waiter is granted, the failed client
        is not checkpointed again, and its memory is its own business (and the driver's)."""
        ready: list[Item] = []
        for gpu, line in list(self._lines.items()):
            if line.blocked is None or line.blocked_until > now:
                continue
            log.warning("GPU %d: the failed checkpoint of %s still holds the GPU after the "
                        "grace period; granting again (the next holder may find less memory "
                        "free)", gpu, line.blocker or "?")
            line.blocked = line.blocker = line.blocked_publicly = None
            self.version += 1
            ready.extend(self._pump(gpu))
        return ready

    # -- what the status document shows -------------------------------------------------------

    def blocked(self, gpu: int, full: bool = True) -> str | None:
        """Why nothing is granted on ``gpu`` now; ``full=False``: as a non-admin may read it
        (without the pid of the process that blocks it)."""
        line = self._lines.get(gpu)
        if line is None:
            return None
        return line.blocked if full else line.blocked_publicly

    def checkpoint(self, client: str) -> tuple[str, str | None] | None:
        record = self.records.get(client)
        return (record.state, record.error) if record is not None else None

    # -- the lines ------------------------------------------------------------------------------

    @staticmethod
    def _told(record: Record | None, error: str | None,
              memory_free: bool = False) -> list[Item]:
        """The core's answer, when the checkpoint was its ``Suspend``."""
        if record is None or not record.suspended:
            return []
        record.suspended = False
        return [Checkpointed(record.client, error, memory_free)]

    def _finished(self, job: Job) -> list[Item]:
        self.version += 1  # every job's end changes a state the status document shows
        line = self._line(job.gpu)
        line.running = None
        return self._pump(job.gpu)

    def _line(self, gpu: int) -> Line:
        line = self._lines.get(gpu)
        if line is None:
            line = self._lines[gpu] = Line()
        return line

    def _pump(self, gpu: int) -> list[Item]:
        """Take from the GPU's line what can go now, up to the next job (which starts)."""
        line = self._line(gpu)
        ready: list[Item] = []
        while line.queue and line.running is None and line.blocked is None:
            item = line.queue.popleft()
            if not isinstance(item, (Checkpoint, Restore)):
                ready.append(item)
                continue
            record = self.records.get(item.client)
            if record is None or not _needed(item, record):
                continue  # gone, or already where the job would put it
            record.state = CHECKPOINTING if isinstance(item, Checkpoint) else RESTORING
            self.version += 1
            line.running = item
            ready.append(item)
        if line.idle:
            del self._lines[gpu]
        return ready

    def _discard(self, client: str) -> None:
        for line in self._lines.values():
            stale = [item for item in line.queue
                     if not isinstance(item, (Checkpoint, Restore)) and item.client == client]
            for item in stale:
                line.queue.remove(item)

    def _room_free(self, gpu: int, line: Line, used: int | None) -> bool:
        state = self.scheduler.gpus.get(gpu)
        total = state.spec.memory_total if state is not None else None
        if used is None or total is None:
            return False  # without NVML nothing says the memory is free
        incoming = next((a for a in line.queue if isinstance(a, Grant)), None)
        client = self.scheduler.clients.get(incoming.client) if incoming is not None else None
        need = client.working_set if client is not None and client.working_set is not None \
            else total
        return total - used >= need


def _needed(job: Job, record: Record) -> bool:
    if isinstance(job, Checkpoint):
        return record.state == RUNNING and record.checkpointable
    return record.state != RUNNING and (record.checkpointable or record.may_be_locked)


def _queued(line: Line | None, client: str) -> bool:
    return line is not None and any(item.client == client for item in line.queue)
