"""Holders that go on working while paused: noted where NVML gives per-process utilization.

A client that registers ``pausable`` promises to stop its GPU work at ``pause`` and go on at
``resume`` (the CUDA shim does), and on that promise the holders side by side take turns at
the GPU's time (``interactive.turns``, taking_turns.py). The scheduler cannot see whether a
client keeps it: a client that says ``pausable`` and works on through its pauses takes the
turns of the others. NVML can see it where it samples each process's use of the GPU
(``nvmlDeviceGetProcessUtilization``): the daemon reads the samples while someone is paused
(``watch``), and ``PauseWatch`` says which paused holder's process used the GPU's SMs after
its pause had had time to take effect.

What it does with that is report, not judge: one warning line per pause a client was seen
working through (at most one per client every ``lograte`` interval), and its count in the
status document (``pause_ignored`` in the client's entry). Nothing is revoked: a sample is a
hint (the pid is the one the socket gave; a process sharing it with a working holder of the
same GPU is never counted), and what to do about a client that cheats is the operator's call.

The rule is sans-I/O: ``PauseWatch.seen`` takes the scheduler's state and the samples, with
their times on the daemon's clock, and returns the notes. ``watch`` is the loop around it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from nodeside.scheduler.core import Scheduler

log = logging.getLogger("kiwi.pauses")

#: Seconds after a pause in which the work a client launched before it may still run.
GRACE: Final = 1.0
#: The share of the GPU's SMs (percent, NVML's ``smUtil``) that counts as working.
THRESHOLD: Final = 10
#: Seconds between two reads of NVML's samples while a holder is paused.
INTERVAL: Final = 2.0


@dataclass(frozen=True)
class Sample:
    """One of NVML's samples: process ``pid`` used ``sm`` percent of GPU ``gpu``'s SMs at
    ``at`` (the daemon's clock)."""
    gpu: int
    pid: int
    at: float
    sm: int


@dataclass(frozen=True)
class Note:
    """A paused holder seen working: what its warning line says."""
    client: str
    name: str
    pid: int
    gpu: int
    sm: int
    #: Seconds between the start of its pause and the sample.
    into_pause: float
    #: Pauses it was seen working through, this one included.
    count: int


class PauseWatch:
    def __init__(self, grace: float = GRACE, threshold: int = THRESHOLD) -> None:
        self.grace = grace
        self.threshold = threshold
        #: client id -> pauses it was seen working through (the status document's
        #: ``pause_ignored``); forgotten when the client goes.
        self.counts: dict[str, int] = {}
        #: client id -> the start of the pause it was last noted in: one note per pause.
        self._noted: dict[str, float] = {}

    @staticmethod
    def anyone_paused(scheduler: Scheduler) -> bool:
        return any(gpu.paused for gpu in scheduler.gpus.values())

    def seen(self, scheduler: Scheduler, samples: Iterable[Sample]) -> list[Note]:
        """The paused holders that ``samples`` show working, each once per pause."""
        self._forget_gone(scheduler)
        by_gpu: dict[int, list[Sample]] = {}
        for sample in samples:
            by_gpu.setdefault(sample.gpu, []).append(sample)
        notes = []
        for index, gpu in scheduler.gpus.items():
            if not gpu.paused or index not in by_gpu:
                continue
            holders = list(gpu.holders.values())
            working = {c.pid for c in holders if not c.paused}
            for client in holders:
                hold = client.hold
                if hold is None or hold.paused_since is None or client.pid is None:
                    continue
                since = hold.paused_since
                if self._noted.get(client.id) == since or client.pid in working:
                    continue
                busy = [s for s in by_gpu[index] if s.pid == client.pid
                        and s.at >= since + self.grace and s.sm >= self.threshold]
                if not busy:
                    continue
                worst = max(busy, key=lambda s: s.sm)
                self._noted[client.id] = since
                count = self.counts[client.id] = self.counts.get(client.id, 0) + 1
                notes.append(Note(client.id, client.name, client.pid, index, worst.sm,
                                  worst.at - since, count))
        return notes

    def _forget_gone(self, scheduler: Scheduler) -> None:
        for client in [c for c in self.counts if c not in scheduler.clients]:
            del self.counts[client]
            self._noted.pop(client, None)


#: Reads NVML's samples newer than those it read last: (GPU index, pid, wall-clock seconds,
#: SM percent) each. Raises ``Unsupported`` when NVML cannot give them on this node.
Reader = Callable[[], Sequence[tuple[int, int, float, int]]]


class Unsupported(Exception):
    """NVML gives no per-process utilization here (the GPU or the driver does not sample it)."""


async def watch(pauses: PauseWatch, scheduler: Scheduler, read: Reader,
                now: Callable[[], float], noted: Callable[[list[Note]], None],
                interval: float = INTERVAL) -> None:
    """Every ``interval`` while a holder is paused, read the samples (on a thread: NVML may
    take milliseconds) and hand the notes to ``noted``. Ends when NVML cannot sample."""
    loop = asyncio.get_running_loop()
    while True:
        await asyncio.sleep(interval)
        if not pauses.anyone_paused(scheduler):
            continue
        try:
            raw = await loop.run_in_executor(None, read)
        except Unsupported as exc:
            log.info("Paused clients that go on working are not noted: %s", exc)
            return
        except Exception as exc:  # noqa: BLE001 - a report, never a reason to stop the daemon
            log.warning("Reading NVML's process samples failed (%s); paused clients that go "
                        "on working are no longer noted", exc)
            return
        # NVML stamps its samples with the wall clock; the scheduler runs on the daemon's.
        offset = time.time() - now()
        notes = pauses.seen(scheduler, [Sample(gpu, pid, wall - offset, sm)
                                        for gpu, pid, wall, sm in raw])
        if notes:
            noted(notes)
