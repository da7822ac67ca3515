"""Running the checkpoint evictor's jobs from the event loop, and what a failed one does to
its GPU's line.

When a checkpoint fails the process may still hold its memory (the driver leaves it FAILED):
the GPU's line stops there, and nothing more is granted on that GPU until the process is gone
or NVML shows the room free. The reason is logged and shown in the status document.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from nodeside.evict.checkpoint import CheckpointApi, CheckpointError, CheckpointUnavailable
from nodeside.evict.jobs import Record, resume, suspend
from nodeside.evict.lines import GpuLines, Job, Line
from nodeside.scheduler.core import Grant

log = logging.getLogger("kiwi.daemon")

#: Seconds between looks at NVML while a failed checkpoint holds a GPU's line.
RECHECK_SECONDS = 1.0


class JobRunner(GpuLines):
    """The jobs half of ``CheckpointEvictor``: each on a worker thread, one per GPU at a time."""

    lock_timeout: Callable[[], float]
    memory_used: Callable[[], dict[int, int | None]]
    _api: CheckpointApi | None
    _api_missing: str | None

    async def _run(self, gpu: int, job: Job) -> None:
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

    def _work(self, job: Job) -> None:
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

    def _failed(self, gpu: int, job: Job, exc: Exception) -> None:
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

    def _room_free(self, gpu: int, line: Line) -> bool:
        state = self.shell.scheduler.gpus.get(gpu)
        used = self.memory_used().get(gpu)
        if state is None or used is None or state.spec.memory_total is None:
            return False  # without NVML nothing says the memory is free
        incoming = next((a for a in line.queue if isinstance(a, Grant)), None)
        client = self.shell.scheduler.clients.get(incoming.client) if incoming else None
        need = client.working_set if client and client.working_set is not None \
            else state.spec.memory_total
        return state.spec.memory_total - used >= need
