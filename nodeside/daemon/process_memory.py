"""Each process's GPU memory as NVML counts it, checked against what memory clients report.

A client that speaks the ``memory`` feature says how many bytes it has on the GPU; NVML counts
what the driver holds for its process (its context, the driver's own pools, memory the shim
never saw). Where NVML's figure is larger the scheduler plans with it (``Scheduler.memory_seen``,
the status shows ``memory_source: nvml``), so a grant never counts on room the card does not
have. Read every ``INTERVAL`` seconds while some client speaks the feature, on a thread (NVML
may take milliseconds); GPUs that NVML did not find (logical ones) have nothing to read, and
containers and MIG without per-process figures give None, which the core ignores.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from nodeside.daemon.gpus import nvml_handles
from nodeside.scheduler.core import Action, GpuSpec, Scheduler

log = logging.getLogger("kiwi.gpus")

#: Seconds between reads while some client speaks ``memory``.
INTERVAL = 2.0

#: (GPU index, pid, bytes used or None) for each compute process NVML lists.
Reader = Callable[[], Sequence[tuple[int, int, int | None]]]


def nvml_process_memory(gpus: Sequence[GpuSpec]) -> Reader | None:
    """A reader of the compute processes' used memory on ``gpus``, or None without NVML or
    without GPUs that NVML found."""
    found = nvml_handles(gpus, "per-process memory")
    if found is None:
        return None
    pynvml, handles = found

    def read() -> list[tuple[int, int, int | None]]:
        found: list[tuple[int, int, int | None]] = []
        for index, handle in handles.items():
            try:
                processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except pynvml.NVMLError as exc:
                log.debug("GPU %d: no per-process memory (%s)", index, exc)
                continue
            for process in processes:
                used = process.usedGpuMemory
                found.append((index, int(process.pid), None if used is None else int(used)))
        return found

    return read


def by_client(scheduler: Scheduler, read: Sequence[tuple[int, int, int | None]]
              ) -> dict[str, int | None]:
    """NVML's figures by the id of the memory client whose process it is (same pid, same GPU);
    a memory client NVML does not list has nothing on the card (0)."""
    figures = {(gpu, pid): used for gpu, pid, used in read}
    return {client.id: figures.get((client.gpu, client.pid), 0)
            for client in scheduler.clients.values()
            if client.memory and client.pid is not None}


async def watch(scheduler: Scheduler, read: Reader, now: Callable[[], float],
                apply: Callable[[list[Action]], None], interval: float = INTERVAL) -> None:
    """Every ``interval`` while some client speaks ``memory``, hand NVML's figures to the core
    when they moved and carry out what it decides (a grant the room is there for now, an
    eviction to ask); ``apply`` also hears an empty list, when only the document changed."""
    loop = asyncio.get_running_loop()
    last: dict[str, int | None] = {}
    while True:
        await asyncio.sleep(interval)
        if not any(client.memory for client in scheduler.clients.values()):
            continue
        try:
            found = await loop.run_in_executor(None, read)
        except Exception as exc:  # noqa: BLE001 - a check, never a reason to stop the daemon
            log.warning("Reading NVML's per-process memory failed (%s); the clients' own "
                        "reports are used alone from now on", exc)
            return
        figures = by_client(scheduler, found)
        if figures != last:
            last = figures
            apply(scheduler.memory_seen(now(), figures))
