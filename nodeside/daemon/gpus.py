"""What the daemon knows of the node's GPUs: discovered through NVML, or given on the command line.

Without NVML (no driver, no GPU, a laptop, CI) the daemon still runs: it manages ``--gpus``
logical GPUs whose capacity is ``--gpu-memory`` or unknown.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from nodeside.scheduler.core import GpuSpec

log = logging.getLogger("kiwi.gpus")


def discover(count: int | None, memory: int | None) -> tuple[list[GpuSpec], Callable[[], dict]]:
    """The GPUs to schedule, and a function that reads each one's used memory now.

    NVML's view wins when it answers; ``count`` then only limits how many GPUs are taken, and
    ``memory`` overrides their capacity for scheduling (to emulate a smaller GPU).
    """
    nvml = _nvml()
    if nvml is not None:
        try:
            total = nvml.nvmlDeviceGetCount()
            specs = []
            handles = []
            for index in range(total if count is None else min(count, total)):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                name = nvml.nvmlDeviceGetName(handle)
                uuid = nvml.nvmlDeviceGetUUID(handle)
                capacity = nvml.nvmlDeviceGetMemoryInfo(handle).total
                specs.append(GpuSpec(index, _text(name), _text(uuid), memory or int(capacity)))
                handles.append(handle)
            if specs:
                log.info("Found %d GPU(s) through NVML: %s", len(specs),
                         ", ".join(f"{s.index}: {s.name}" for s in specs))
                return specs, _nvml_usage(nvml, handles)
        except Exception as exc:  # any NVML error means: schedule logical GPUs instead
            log.warning("NVML did not answer (%s); scheduling logical GPUs", exc)
    specs = [GpuSpec(i, "logical GPU", None, memory) for i in range(count or 1)]
    return specs, dict


def _nvml():  # type: ignore[no-untyped-def]
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    return pynvml


def _nvml_usage(nvml, handles: list) -> Callable[[], dict]:  # type: ignore[no-untyped-def]
    def usage() -> dict[int, int | None]:
        out: dict[int, int | None] = {}
        for index, handle in enumerate(handles):
            try:
                out[index] = int(nvml.nvmlDeviceGetMemoryInfo(handle).used)
            except Exception:
                out[index] = None
        return out

    return usage


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def nvml_handles(gpus: Sequence[GpuSpec], what: str) -> tuple[Any, dict[int, Any]] | None:
    """pynvml and a handle for each of ``gpus`` that NVML found, for a reader of ``what``; None
    (said once in the log) without NVML or without such GPUs (logical GPUs have no UUID)."""
    if not any(spec.uuid for spec in gpus):
        return None
    try:
        import pynvml
        pynvml.nvmlInit()  # counted: the daemon's discovery holds it open already
        return pynvml, {spec.index: pynvml.nvmlDeviceGetHandleByIndex(spec.index)
                        for spec in gpus if spec.uuid}
    except Exception as exc:  # noqa: BLE001 - any NVML failure means: nothing to read
        log.info("NVML gives no %s (%s)", what, exc)
        return None
