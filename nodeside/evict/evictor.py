"""The checkpoint evictor's shell: it chooses who is checkpointed, runs the jobs its lines ask
for on worker threads, and feeds their results back.

What waits for what is decided in ``lines.py``, sans I/O; the blocking calls are ``jobs.py``.
This file is the I/O between them: the driver's API, loaded once; a worker thread per job; and,
while a failed checkpoint blocks a GPU, a look at NVML every ``RECHECK_SECONDS`` and at the
lines' deadline (``EvictionLines.expire``). Whatever the lines let go after an event goes to the
``then`` the shell gave with the job (its delivery).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from nodeside.evict import CHECKPOINT, MANAGED, VMM
from nodeside.evict import checkpoint as api_module
from nodeside.evict.checkpoint import CheckpointApi, CheckpointUnavailable
from nodeside.evict.identity import ProcessIdentity
from nodeside.evict.jobs import Failure, ProcessChanged, failure, resume, suspend
from nodeside.evict.lines import Checkpoint, EvictionLines, Item, Job
from nodeside.evict.policy import cannot_act_on, choose, unbound
from nodeside.scheduler.core import ClientRecord

log = logging.getLogger("kiwi.daemon")

#: Seconds between looks at NVML while a failed checkpoint holds a GPU's line.
RECHECK_SECONDS = 1.0

#: Where what the lines let go is carried out (the daemon's delivery).
Then = Callable[[list[Item]], None]


class Running:
    """A job on a worker thread, and whether its client went away meanwhile or the daemon gave
    up on it (the thread reads that between lock attempts)."""

    def __init__(self, job: Job, name: str) -> None:
        self.job = job
        self.name = name
        self.cancelled = False
        #: The job ran past the checkpoint timeout: its lines were told it failed, and
        #: whatever the thread returns later changes nothing.
        self.given_up = False
        self.deadline: asyncio.TimerHandle | None = None

    def is_cancelled(self) -> bool:
        return self.cancelled or self.given_up


@dataclass(frozen=True)
class EvictorChoice:
    """What the daemon can carry out for a client: its evictor (``evict``), and whether the
    checkpoint evictor reaches its process (the lines keep a record of it)."""

    evict: str
    reached: bool


class CheckpointEvictor:
    def __init__(self, lines: EvictionLines, loop: asyncio.AbstractEventLoop, library: str,
                 lock_timeout: Callable[[], float],
                 memory_used: Callable[[], Mapping[int, int | None]],
                 job_timeout: Callable[[], float] = lambda: 120.0) -> None:
        self.lines = lines
        self.loop = loop
        self.library = library
        self.lock_timeout = lock_timeout
        self.memory_used = memory_used
        #: Seconds a job may run before the daemon gives up on it (``checkpoint_timeout``).
        self.job_timeout = job_timeout
        self._api: CheckpointApi | None = None
        self._api_missing: str | None = None
        self._running: dict[str, Running] = {}
        self._watched: set[int] = set()  # GPUs whose blocked line NVML is asked about

    # -- registration ----------------------------------------------------------------------

    def choose(self, pid: int | None, uid: int | None, name: str, requested: str | None,
               identity: ProcessIdentity | None = None) -> EvictorChoice:
        """The evictor for a client about to register (the peer's ``pid`` and ``uid``): the
        one it asked for when this daemon can carry it out, else managed, said in one log
        line. ``identity``: the process that connected (``Peer.identity``); without it nobody
        is checkpointed. A ``vmm`` client (feature ``memory``) pages itself; where the
        checkpoint API reaches its process (the one that connected, of the peer's uid) it is
        recorded too (``keep``), to be checkpointed when the core asks (``Suspend``)."""
        if requested == VMM:
            reached = pid is not None and identity is not None and identity.uid == uid and \
                self._load_api() is None and cannot_act_on(pid, uid) is None
            return EvictorChoice(VMM, reached)
        missing = self._load_api() if requested == CHECKPOINT else None
        evictor, why = choose(requested, pid, uid, missing)
        if evictor == CHECKPOINT:
            why = unbound(identity)
            if why is None and identity is not None and identity.uid != uid:
                why = f"the process runs as uid {identity.uid}, not as the peer's {uid}"
            if why is not None:
                evictor = MANAGED
        if why is not None:
            log.warning("%s (pid %s) asked to be checkpointed; paging it as managed memory "
                        "instead: %s", name, pid, why)
        return EvictorChoice(evictor, evictor == CHECKPOINT and pid is not None)

    def keep(self, client: ClientRecord, choice: EvictorChoice,
             identity: ProcessIdentity | None = None) -> None:
        """``client`` registered with ``choice``: the lines record a process they reach."""
        if choice.reached and client.pid is not None:
            self.lines.register(client.id, client.pid, client.gpu, client.name, identity,
                                on_demand=choice.evict == VMM)

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
        future: asyncio.Future[Failure | None] = self.loop.create_future()
        future.add_done_callback(lambda done: self._ended(running, done, then))
        # A thread of its own, a daemon one, not the loop's executor: a driver call that never
        # returns must neither take an executor worker for good nor keep the daemon from
        # exiting (the executor's threads are joined at exit).
        threading.Thread(target=self._work_then_answer, args=(running, future), daemon=True,
                         name=f"kiwi-{type(job).__name__.lower()}-{job.pid}").start()
        running.deadline = self.loop.call_later(self.job_timeout(), self._overdue, running,
                                                then)

    def _overdue(self, running: Running, then: Then) -> None:
        """The job has run past the checkpoint timeout: the driver's call has not returned.

        Nothing can interrupt a thread inside the driver, so the thread is left to finish or
        hang; the lines hear that the job failed, which bounds what waits on it (a failed
        checkpoint holds the GPU's grants one grace period at most, or until NVML shows the
        memory free), and the one error line says what to look at."""
        job = running.job
        if running.given_up or self._running.get(job.client) is not running:
            return
        running.given_up = True
        del self._running[job.client]
        step = "checkpoint" if isinstance(job, Checkpoint) else "restore"
        error = (f"the driver's {step} did not return in {self.job_timeout():g} s "
                 "(checkpoint_timeout); given up, its memory counted as still on the GPU")
        log.error("GPU %d: the %s of %s (%s, pid %d) did not return in %g s: given up. A "
                  "driver call that never returns is the checkpoint API's known hang with "
                  "several CUDA processes (NVIDIA/cuda-checkpoint #30, #44, #45)", job.gpu,
                  step, running.name, job.client, job.pid, self.job_timeout())
        self._settle(job, Failure(error), then)

    def _work_then_answer(self, running: Running,
                          future: asyncio.Future[Failure | None]) -> None:
        failed = self._work(running)

        def answer() -> None:
            if not future.done():
                future.set_result(failed)
        # RuntimeError: the loop has closed; the daemon is gone and there is nobody to tell.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(answer)

    def _work(self, running: Running) -> Failure | None:
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
        except ProcessChanged as exc:  # never asked the driver anything about that pid
            log.warning("Leaving pid %d alone (%s, %s): %s", job.pid, running.name, job.client,
                        exc)
            return Failure(str(exc), memory_free=True)
        except Exception as exc:  # CheckpointError, or a bug: neither may leave a line stuck
            return failure(self._api, job, exc)
        return None

    def _slow(self, job: Checkpoint, why: str) -> None:
        self.loop.call_soon_threadsafe(self.lines.checkpoint_slow, job, why)

    def _ended(self, running: Running, done: asyncio.Future[Failure | None],
               then: Then) -> None:
        job = running.job
        if running.deadline is not None:
            running.deadline.cancel()
        if running.given_up:
            if not done.cancelled():
                log.warning("The driver's call for %s (%s, pid %d) returned %s after the daemon "
                            "had given up on it", running.name, job.client, job.pid,
                            "an error" if done.result() is not None else "at last")
            return
        if self._running.get(job.client) is running:
            del self._running[job.client]
        if done.cancelled():
            return  # the loop is closing: nothing more goes out
        self._settle(job, done.result(), then)

    def _settle(self, job: Job, failed: Failure | None, then: Then) -> None:
        """Feed a job's result to the lines, and carry out what they let go."""
        lines = self.lines
        if isinstance(job, Checkpoint):
            ready = lines.checkpoint_done(job) if failed is None else lines.checkpoint_failed(
                job, failed.error, self.loop.time(), memory_free=failed.memory_free)
        else:
            ready = lines.restore_done(job) if failed is None \
                else lines.restore_failed(job, failed.error)
        if lines.blocked(job.gpu) is not None:
            self._watch(job.gpu, then)
        then(ready)

    # -- a GPU blocked by a failed checkpoint ------------------------------------------------

    def _watch(self, gpu: int, then: Then) -> None:
        if gpu not in self._watched:
            self._watched.add(gpu)
            at = self.loop.time() + RECHECK_SECONDS
            deadline = self.lines.next_deadline()
            self.loop.call_at(at if deadline is None else min(at, deadline), self._recheck,
                              gpu, then)

    def _recheck(self, gpu: int, then: Then) -> None:
        self._watched.discard(gpu)
        if self.lines.blocked(gpu) is None:
            return  # its process went away meanwhile
        ready = self.lines.memory_seen(gpu, self.memory_used().get(gpu))
        ready += self.lines.expire(self.loop.time())
        if self.lines.blocked(gpu) is not None:
            self._watch(gpu, then)
        then(ready)
