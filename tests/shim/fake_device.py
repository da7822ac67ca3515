"""The fake driver's card, read from outside as NVML reads a real one.

Processes that load tests/shim/fake_cuda.c with the same ``FAKE_CUDA_DEVICE`` file share one
card: the file holds the bytes in use on it, and one row per process (its pid, its bytes on the
card, the bytes a checkpoint moved off it). A test reads it to prove, by the fake driver's own
count, that an evicted process's memory left the card.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

#: struct device_memory in fake_cuda.c: used, then DEVICE_PROCESSES rows of (pid, bytes,
#: checkpointed), 8 bytes each, native byte order.
DEVICE_PROCESSES = 64
_USED = struct.Struct("=Q")
_ROW = struct.Struct("=qQQ")


@dataclass(frozen=True)
class ProcessMemory:
    pid: int
    bytes: int
    checkpointed: int


class FakeCard:
    """The card of the processes started with ``FAKE_CUDA_DEVICE=<path>``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def env(self) -> dict[str, str]:
        """What a process needs in its environment to use this card."""
        return {"FAKE_CUDA_DEVICE": str(self.path)}

    def _data(self) -> bytes:
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return b""

    def used(self) -> int:
        """Bytes in use on the card, every process's (FAKE_CUDA_OTHERS_USED left out)."""
        data = self._data()
        return _USED.unpack_from(data)[0] if data else 0

    def processes(self) -> dict[int, ProcessMemory]:
        """The processes on the card, by pid, as nvmlDeviceGetComputeRunningProcesses lists
        them (here with the bytes a checkpoint took off, too)."""
        data = self._data()
        rows = {}
        for i in range(DEVICE_PROCESSES if data else 0):
            pid, used, checkpointed = _ROW.unpack_from(data, _USED.size + i * _ROW.size)
            if pid > 0:
                rows[pid] = ProcessMemory(pid, used, checkpointed)
        return rows

    def used_by(self, pid: int) -> int:
        row = self.processes().get(pid)
        return row.bytes if row else 0
