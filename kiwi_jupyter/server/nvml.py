"""What NVML says about this machine's GPUs, for the panel: memory used and utilization.

jupyterlab-nvdashboard users know a GPU by these two figures, read through NVML (pynvml) on the
server's side; the panel shows them next to Kiwi's own view (holders, queue, working sets),
which comes from the scheduler. They are the device's figures, every process on it counted.

Where NVML cannot be loaded or finds no GPU (a laptop, CI, a CPU-only notebook pod) the answer
says so and why, and the panel shows nothing in their place: no figure is better than a made-up
one. NVML is asked on a worker thread; its first call loads the driver's library, which can
take a moment.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any


class GpuReadings:
    """Reads every GPU NVML sees; initialises NVML once, and again after it failed."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._lock = threading.Lock()

    def read(self) -> dict[str, Any]:
        """``{"nvml": true, "gpus": [...]}``, or ``{"nvml": false, "reason": "..."}``."""
        with self._lock:
            try:
                nvml = self._nvml or self._start()
                gpus = [self._device(nvml, index) for index in range(nvml.nvmlDeviceGetCount())]
            except Exception as exc:  # noqa: BLE001 - any NVML failure: say why, show nothing
                self.close()
                return {"nvml": False, "reason": _reason(exc)}
        if not gpus:
            return {"nvml": False, "reason": "NVML finds no GPU on this machine"}
        return {"nvml": True, "gpus": gpus}

    def close(self) -> None:
        nvml, self._nvml = self._nvml, None
        if nvml is not None:
            with contextlib.suppress(Exception):
                nvml.nvmlShutdown()

    def _start(self) -> Any:
        import pynvml  # nvidia-ml-py, a dependency: the import itself needs no driver

        pynvml.nvmlInit()
        self._nvml = pynvml
        return pynvml

    @staticmethod
    def _device(nvml: Any, index: int) -> dict[str, Any]:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        try:
            rates = nvml.nvmlDeviceGetUtilizationRates(handle)
            utilization: dict[str, int | None] = {"gpu": int(rates.gpu),
                                                  "memory": int(rates.memory)}
        except nvml.NVMLError:  # some devices (MIG instances) do not report it
            utilization = {"gpu": None, "memory": None}
        return {
            "index": index,
            "name": _text(nvml.nvmlDeviceGetName(handle)),
            "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
            "memory_used": int(memory.used),
            "memory_total": int(memory.total),
            # Percent of the last sample period in which a kernel ran, and in which device
            # memory was read or written: nvdashboard's "GPU Utilization" and its memory twin.
            "utilization": utilization["gpu"],
            "memory_utilization": utilization["memory"],
        }


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if isinstance(exc, ImportError):
        return f"pynvml is not installed ({text})"
    return f"NVML is not available here: {text}"
