"""The checkpoint evictor's shell: it chooses who is checkpointed, runs the jobs its lines ask
for on worker threads, and feeds their results back.

What waits for what is decided in ``lines.py``, sans I/O; the blocking calls are ``jobs.py``.
This file is the I/O between them: the driver's API, loaded once; a worker thread per job; and,
while a failed checkpoint blocks a GPU, a look at NVML every ``RECHECK_SECONDS``. Whatever the
lines let go after an event goes to the ``then`` the shell gave with the job (its delivery).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from nodeside.evict import CHECKPOINT, VMM
from nodeside.evict import checkpoint as api_module
from nodeside.evict.checkpoint import CheckpointApi, CheckpointUnavailable
from nodeside.evict.jobs import failure, resume, suspend
from nodeside.evict.lines import Checkpoint, EvictionLines, Item, Job
from nodeside.evict.policy import cannot_act_on, choose
from nodeside.scheduler.core import Client

log = logging.getLogger("kiwi.daemon")

#: Seconds between looks at NVML while a failed checkpoint holds a GPU's line.
RECHECK_SECONDS = 1.0

#: Where what the lines let go is carried out (the daemon's delivery).
Then = Callable[[list[Item]], None]


class Running:
    """A job on a worker thread, and whether its client went away meanwhile (the thread reads
    it between lock attempts)."""

    def __init__(self, job: Job, name: str) -> None:
        self.job = job
        self.name = name
        self.cancelled = False

    def is_cancelled(self) -> bool:
        return self.cancelled


class CheckpointEvictor:
    def __init__(self, lines: EvictionLines, loop: asyncio.AbstractEventLoop, library: str,
                 lock_timeout: Callable[[], float],
                 memory_used: Callable[[], Mapping[int, int | None]]) -> None:
        self.lines = lines
        self.loop = loop
        self.library = library
        self.lock_timeout = lock_timeout
        self.memory_used = memory_used
        self._api: CheckpointApi | None = None
        self._api_missing: str | None = None
        self._running: dict[str, Running] = {}
        self._watched: set[int] = set()  # GPUs whose blocked line NVML is asked about

    # -- registration ----------------------------------------------------------------------

    def register(self, client: Client, requested: str | None) -> str:
        """The evictor for a newly registered client: the one it asked for when this daemon
        can carry it out, else managed, said in one log line. A ``vmm`` client (feature
        ``memory``) pages itself; where the checkpoint API reaches its process it is recorded
        too, to be checkpointed when the core asks (``Suspend``)."""
        if requested == VMM:
            if client.pid is not None and self._load_api() is None and \
                    cannot_act_on(client.pid, client.uid) is None:
                self.lines.register(client.id, client.pid, client.gpu, client.name,
                                    on_demand=True)
            return VMM
        missing = self._load_api() if requested == CHECKPOINT else None
        evictor, why = choose(requested, client.pid, client.uid, missing)
        if why is not None:
            log.warning("%s (pid %s) asked to be checkpointed; paging it as managed memory "
                        "instead: %s", client.name, client.pid, why)
        if evictor == CHECKPOINT and client.pid is not None:
            self.lines.register(client.id, client.pid, client.gpu, client.name)
        return evictor

    def _load_api(self) -> str | None:
        if self._api is None and self._api_missing is None:
            try:
                self._api = api_module.load(self.library)
            except CheckpointUnavailable as exc:
                self._api_missing = str(exc)
        return self._api_missing

    def forget(self, client_id: str) -> list[Item]:
        """The client's connection closed: a job working on it gives up at its next chance,
        and what its lines let go now is returned."""
        running = self._running.get(client_id)
        if running is not None:
            running.cancelled = True
        return self.lines.forget(client_id)

    # -- jobs ------------------------------------------------------------------------------

    def start(self, job: Job, then: Then) -> None:
        """Run ``job`` on a worker thread; what the lines let go after it goes to ``then``."""
        record = self.lines.records.get(job.client)
        running = Running(job, record.name if record is not None else job.client)
        self._running[job.client] = running
        future = self.loop.run_in_executor(None, self._work, running)
        future.add_done_callback(lambda done: self._ended(running, done, then))

    def _work(self, running: Running) -> str | None:
        """The job's blocking part, on a worker thread: None, or why it failed."""
        job = running.job
        try:
            if self._api is None:
                raise CheckpointUnavailable(self._api_missing or "no checkpoint API")
            if isinstance(job, Checkpoint):
                suspend(self._api, job, running.name, self.lock_timeout(),
                        running.is_cancelled, lambda why: self._slow(job, why))
            else:
                resume(self._api, job, running.name)
        except Exception as exc:  # CheckpointError, or a bug: neither may leave a line stuck
            return failure(self._api, job.pid, exc)
        return None

    def _slow(self, job: Checkpoint, why: str) -> None:
        self.loop.call_soon_threadsafe(self.lines.checkpoint_slow, job, why)

    def _ended(self, running: Running, done: asyncio.Future[str | None], then: Then) -> None:
        job = running.job
        if self._running.get(job.client) is running:
            del self._running[job.client]
        if done.cancelled():
            return  # the loop is closing: nothing more goes out
        error = done.result()
        lines = self.lines
        if isinstance(job, Checkpoint):
            ready = lines.checkpoint_done(job) if error is None \
                else lines.checkpoint_failed(job, error)
        else:
            ready = lines.restore_done(job) if error is None else lines.restore_failed(job, error)
        if lines.blocked(job.gpu) is not None:
            self._watch(job.gpu, then)
        then(ready)

    # -- a GPU blocked by a failed checkpoint ------------------------------------------------

    def _watch(self, gpu: int, then: Then) -> None:
        if gpu not in self._watched:
            self._watched.add(gpu)
            self.loop.call_later(RECHECK_SECONDS, self._recheck, gpu, then)

    def _recheck(self, gpu: int, then: Then) -> None:
        self._watched.discard(gpu)
        if self.lines.blocked(gpu) is None:
            return  # its process went away meanwhile
        ready = self.lines.memory_seen(gpu, self.memory_used().get(gpu))
        if self.lines.blocked(gpu) is not None:
            self._watch(gpu, then)
        then(ready)
