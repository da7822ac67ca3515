"""The node's physical GPUs and their health, from NVML or, without a GPU, a fake inventory.

Health is polled: NVML answers for each GPU (a GPU that fell off the bus answers GPU_IS_LOST) and
critical Xid events are drained on each poll. An operator can also take a GPU out of service by
writing its UUID or index into the ``--unhealthy-file``; that file is re-read on every poll, which
is also how the tests change a fake GPU's health.
"""

from __future__ import annotations

import logging
import os
import uuid as uuidlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

#: Xid errors caused by the application, not the GPU (NVIDIA's device plugin skips them too):
#: 13 graphics engine exception, 31 GPU memory page fault, 43 GPU stopped processing,
#: 45 preemptive cleanup, 68 video processor exception, 109 context switch timeout.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


class GpuDiscoveryError(RuntimeError):
    """The GPUs could not be listed (no driver, no NVML); the message says what to check."""


@dataclass(frozen=True)
class PhysicalGpu:
    index: int
    uuid: str
    name: str = "GPU"


class GpuSource(Protocol):
    def discover(self) -> list[PhysicalGpu]: ...

    def unhealthy(self) -> set[str]:
        """UUIDs of the GPUs that are not usable now."""
        ...

    def close(self) -> None: ...


class FakeGpus:
    """``count`` logical GPUs with stable made-up UUIDs, always healthy: for nodes and tests
    without NVIDIA hardware. Their health changes only through the unhealthy file."""

    def __init__(self, count: int) -> None:
        if count < 1:
            raise ValueError("a fake inventory needs at least one GPU")
        self._gpus = [PhysicalGpu(i, f"GPU-{uuidlib.UUID(int=i + 1)}", "Kiwi fake GPU")
                      for i in range(count)]

    def discover(self) -> list[PhysicalGpu]:
        return list(self._gpus)

    def unhealthy(self) -> set[str]:
        return set()

    def close(self) -> None:
        pass


class NvmlGpus:
    """The GPUs NVML reports, with their health."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as exc:
            raise GpuDiscoveryError("nvidia-ml-py is not installed") from exc
        self._nvml: Any = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise GpuDiscoveryError(
                f"NVML did not start ({exc}); is the NVIDIA driver installed and the container "
                f"run with the NVIDIA runtime (NVIDIA_VISIBLE_DEVICES=all)?") from exc
        self._events: Any = None
        self._lost: set[str] = set()

    def discover(self) -> list[PhysicalGpu]:
        nvml = self._nvml
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            gpus.append(PhysicalGpu(index, _text(nvml.nvmlDeviceGetUUID(handle)),
                                    _text(nvml.nvmlDeviceGetName(handle))))
        self._watch_xids(gpus)
        return gpus

    def _watch_xids(self, gpus: list[PhysicalGpu]) -> None:
        nvml = self._nvml
        try:
            self._events = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            log.warning("cannot watch Xid events (%s); health comes from polling only", exc)
            return
        for gpu in gpus:
            handle = nvml.nvmlDeviceGetHandleByIndex(gpu.index)
            try:
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError,
                                              self._events)
            except nvml.NVMLError as exc:
                # Some GPUs (and vGPU guests) do not support events; polling still covers them.
                log.warning("GPU %s: no Xid events (%s)", gpu.uuid, exc)

    def unhealthy(self) -> set[str]:
        nvml = self._nvml
        self._drain_xids()
        bad = set(self._lost)
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            except nvml.NVMLError:
                continue
            try:
                nvml.nvmlDeviceGetMemoryInfo(handle)
            except nvml.NVMLError as exc:
                log.error("GPU %s does not answer NVML (%s): unhealthy", uuid, exc)
                bad.add(uuid)
        return bad

    def _drain_xids(self) -> None:
        nvml = self._nvml
        if self._events is None:
            return
        while True:
            try:
                event = nvml.nvmlEventSetWait(self._events, 0)
            except nvml.NVMLError:  # NVML_ERROR_TIMEOUT: nothing pending
                return
            xid = int(event.eventData)
            if xid in APPLICATION_XIDS:
                continue
            uuid = _text(nvml.nvmlDeviceGetUUID(event.device))
            log.error("GPU %s reported critical Xid %d: unhealthy until restart", uuid, xid)
            # Sticky: a GPU that raised a critical Xid needs a reset, which restarts this plugin.
            self._lost.add(uuid)

    def close(self) -> None:
        try:
            if self._events is not None:
                self._nvml.nvmlEventSetFree(self._events)
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def read_unhealthy_file(path: str | os.PathLike[str] | None, gpus: list[PhysicalGpu]
                        ) -> set[str]:
    """UUIDs named in the operator's unhealthy file: one GPU UUID or index per line, ``#``
    comments. A missing file names none."""
    if path is None:
        return set()
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return set()
    except OSError as exc:
        log.warning("cannot read unhealthy file %s: %s", path, exc.strerror)
        return set()
    by_index = {str(g.index): g.uuid for g in gpus}
    known = {g.uuid for g in gpus}
    named = set()
    for line in text.splitlines():
        word = line.split("#", 1)[0].strip()
        if not word:
            continue
        if word in by_index:
            named.add(by_index[word])
        elif word in known:
            named.add(word)
        else:
            log.warning("unhealthy file %s names %r, which is no GPU of this node", path, word)
    return named
