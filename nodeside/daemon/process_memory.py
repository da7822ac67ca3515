"""Each process's GPU memory as NVML counts it: the evidence a memory client's claims are held to.

A client that speaks the ``memory`` feature says how many bytes it has on the GPU; NVML counts
what the driver holds for its process (its context, the driver's own pools, memory the shim
never saw). Wherever NVML vouches for a client's process, the scheduler counts NVML's figure
instead of the claim, both ways (``Scheduler.memory_seen``; the status shows ``memory_source:
nvml``): a grant never counts on room the card does not have, and a client cannot keep others
out with bytes it does not hold. NVML vouches for a process it lists, and for one it does not
list (it holds nothing on the card) where NVML's pids are the daemon's: the daemon runs in the
host's PID namespace, or NVML lists the process of some memory client now. Several memory
clients of one process share its figure: each counts what it claims of it, the first the rest.

Read every ``INTERVAL`` seconds while some client speaks the feature, on a thread (NVML may take
milliseconds), and sooner (at most every ``SOON`` seconds) when a client reports less than NVML
last counted for it: an eviction's progress is then seen as it happens. GPUs that NVML did not
find (logical ones) have nothing to read, and containers and MIG without per-process figures
give None: NVML does not vouch for those processes, and their claims stand.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Sequence

from nodeside.daemon.gpus import nvml_handles
from nodeside.scheduler.core import Action, ClientRecord, GpuSpec, Scheduler

log = logging.getLogger("kiwi.gpus")

#: Seconds between reads while some client speaks ``memory``; and at least between two reads
#: that a client's report asked for.
INTERVAL = 2.0
SOON = 0.1
#: The inode of the host's (the initial) PID namespace (``PROC_PID_INIT_INO`` in Linux).
_HOST_PID_NAMESPACE = 0xEFFFFFFC

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


def in_host_pid_namespace() -> bool:
    """Does the daemon see the host's pids, the ones NVML lists?"""
    try:
        return os.stat("/proc/self/ns/pid").st_ino == _HOST_PID_NAMESPACE
    except OSError:
        return False


def by_client(scheduler: Scheduler, read: Sequence[tuple[int, int, int | None]],
              host_pids: bool = False) -> dict[str, int | None]:
    """NVML's figures by the id of each memory client whose process NVML vouches for (None for
    the others); ``host_pids``: the daemon's pids are NVML's."""
    figures = {(gpu, pid): used for gpu, pid, used in read}
    processes: dict[tuple[int, int], list[ClientRecord]] = {}
    out: dict[str, int | None] = {}
    for client in scheduler.clients.values():
        if client.memory:
            if client.pid:
                processes.setdefault((client.gpu, client.pid), []).append(client)
            else:
                out[client.id] = None  # a peer whose pid the daemon cannot see
    ours = host_pids or any(key in figures for key in processes)
    for key, clients in processes.items():
        total = figures.get(key, 0 if ours else None)
        if total is None:
            out.update((client.id, None) for client in clients)
            continue
        left = total
        for client in clients:
            share = min(client.resident_bytes, left)
            out[client.id] = share
            left -= share
        out[clients[0].id] = (out[clients[0].id] or 0) + left
    return out


async def watch(scheduler: Scheduler, read: Reader, now: Callable[[], float],
                apply: Callable[[list[Action]], None], soon: asyncio.Event | None = None,
                interval: float = INTERVAL) -> None:
    """Every ``interval`` while some client speaks ``memory`` (and when ``soon`` is set, at
    most every ``SOON`` seconds), hand NVML's figures to the core when they moved and carry out
    what it decides (a grant the room is there for now, an eviction to ask); ``apply`` also
    hears an empty list, when only the document changed."""
    loop = asyncio.get_running_loop()
    soon = soon if soon is not None else asyncio.Event()
    host_pids = in_host_pid_namespace()
    last: dict[str, int | None] = {}
    read_at = 0.0
    while True:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(soon.wait(), interval)
        wait = read_at + SOON - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        soon.clear()
        if not any(client.memory for client in scheduler.clients.values()):
            continue
        try:
            found = await loop.run_in_executor(None, read)
        except Exception as exc:  # noqa: BLE001 - a check, never a reason to stop the daemon
            log.warning("Reading NVML's per-process memory failed (%s); the clients' own "
                        "reports are used alone from now on", exc)
            apply(scheduler.memory_seen(now(), {c.id: None for c in scheduler.clients.values()
                                                if c.memory}))
            return
        read_at = loop.time()
        figures = by_client(scheduler, found, host_pids)
        if figures != last:
            last = figures
            apply(scheduler.memory_seen(now(), figures))
