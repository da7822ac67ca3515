"""Each process's use of each GPU, as NVML samples it (``nvmlDeviceGetProcessUtilization``).

The pause watch (``pause_watch.py``) reads it to see a paused holder that goes on working. NVML
keeps a few seconds of samples per GPU, each stamped with the wall clock in microseconds; each
read asks for those newer than the newest it saw. GPUs and drivers that do not sample processes
answer NOT_SUPPORTED: the reader then raises ``Unsupported`` and the watch stops.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from nodeside.daemon.gpus import nvml_handles
from nodeside.daemon.pause_watch import Reader, Unsupported
from nodeside.scheduler.core import GpuSpec

log = logging.getLogger("kiwi.gpus")


def nvml_reader(gpus: Sequence[GpuSpec]) -> Reader | None:
    """A reader of the processes' samples on ``gpus``, or None without NVML or without GPUs
    that NVML found (logical GPUs have no UUID)."""
    found = nvml_handles(gpus, "per-process utilization")
    if found is None:
        return None
    pynvml, handles = found
    #: GPU index -> the newest sample's time seen (microseconds): the next read asks after it.
    last_seen = dict.fromkeys(handles, 0)

    def read() -> list[tuple[int, int, float, int]]:
        samples = []
        for index, handle in handles.items():
            try:
                got = pynvml.nvmlDeviceGetProcessUtilization(handle, last_seen[index])
            except pynvml.NVMLError_NotFound:
                continue  # no process sampled since the last read
            except pynvml.NVMLError_NotSupported as exc:
                raise Unsupported(f"GPU {index}: {exc}") from exc
            except pynvml.NVMLError as exc:
                log.debug("GPU %d: no process samples (%s)", index, exc)
                continue
            for sample in got:
                last_seen[index] = max(last_seen[index], int(sample.timeStamp))
                samples.append((index, int(sample.pid), sample.timeStamp / 1e6,
                                int(sample.smUtil)))
        return samples

    return read
