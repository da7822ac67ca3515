"""The process under test in ``benchmarks.shim.evictors``: the shim preloaded, driven by JSON
commands on stdin, one JSON answer per line on stdout.

Its working set is one allocation with a pattern that differs per element; the check sums it
per 2 MiB row and weighs each row by its index, so a row lost, zeroed or moved changes the sum.
``change`` alters every row between rounds, so a shadow left from an earlier round fails the
check. Two backends: PyTorch on a GPU (an int64 tensor), or, with
``KIWI_EVICTORS_BACKEND=driver``, the CUDA driver API through ctypes (the pattern written and
read back with cuMemcpy through a pinned buffer), which runs over the tests' fake driver as well
as over a GPU.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import sys
import time
from typing import Any

from kiwi_jupyter.shim import Shim

ROW = 2 << 20
shim = Shim.attach()


class TorchSet:
    """The working set as a PyTorch tensor on the GPU."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.working: Any = None
        self.small: Any = None

    def fill(self, nbytes: int) -> None:
        torch = self.torch
        self.working = torch.arange(nbytes // 8, device="cuda", dtype=torch.int64)
        self.working.mul_(2654435761).remainder_(1 << 31)

    def checksum(self) -> int:
        torch = self.torch
        rows = self.working.view(-1, ROW // 8).sum(dim=1)
        weights = torch.arange(1, rows.numel() + 1, device=rows.device, dtype=torch.int64)
        return int((rows * weights).sum().item())

    def allocate_small(self, nbytes: int) -> None:
        self.small = self.torch.empty(nbytes, dtype=self.torch.uint8, device="cuda")

    def change(self, round_: int) -> None:
        self.working.add_(round_)

    def poke(self) -> None:
        int(self.working[0].item())

    def touch(self) -> None:
        self.small.fill_(1)
        self.torch.cuda.synchronize()

    def synchronize(self) -> None:
        self.torch.cuda.synchronize()


class DriverSet:
    """The working set as one cuMemAlloc, written and read with the driver's copies."""

    def __init__(self) -> None:
        self.cuda = ctypes.CDLL("libcuda.so.1")
        self.cuda.cuInit(0)
        ctx = ctypes.c_void_p()
        self.call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), 0)
        self.call("cuCtxSetCurrent", ctx)
        self.working = 0
        self.nbytes = 0
        self.small = 0
        self.small_bytes = 0
        # Copies to and from pinned memory: pageable ones are staged by the driver, slowly.
        buffer = ctypes.c_void_p()
        self.call("cuMemAllocHost_v2", ctypes.byref(buffer), ctypes.c_size_t(ROW))
        self.pinned = (ctypes.c_char * ROW).from_address(buffer.value or 0)

    def call(self, name: str, *args: Any) -> None:
        result = getattr(self.cuda, name)(*args)
        if result != 0:
            raise RuntimeError(f"{name} failed with CUresult {result}")

    def allocate(self, nbytes: int) -> int:
        ptr = ctypes.c_uint64()
        self.call("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(nbytes))
        return ptr.value

    def fill(self, nbytes: int) -> None:
        self.working, self.nbytes = self.allocate(nbytes), nbytes
        row = bytes((i * 2654435761 >> 7) & 0xFF for i in range(ROW))
        for offset in range(0, nbytes, ROW):
            size = min(ROW, nbytes - offset)
            data = (row[offset // ROW % 251:] + row)[:size]  # each row its own
            ctypes.memmove(self.pinned, data, size)
            self.call("cuMemcpyHtoD_v2", ctypes.c_uint64(self.working + offset), self.pinned,
                      ctypes.c_size_t(size))

    def checksum(self) -> int:
        total = 0
        for index, offset in enumerate(range(0, self.nbytes, ROW)):
            size = min(ROW, self.nbytes - offset)
            self.call("cuMemcpyDtoH_v2", self.pinned, ctypes.c_uint64(self.working + offset),
                      ctypes.c_size_t(size))
            digest = hashlib.blake2b(self.pinned.raw[:size], digest_size=8).digest()
            total += (index + 1) * int.from_bytes(digest, "little")
        return total

    def allocate_small(self, nbytes: int) -> None:
        self.small, self.small_bytes = self.allocate(nbytes), nbytes

    def touch(self) -> None:
        self.call("cuMemsetD8_v2", ctypes.c_uint64(self.small), ctypes.c_ubyte(1),
                  ctypes.c_size_t(self.small_bytes))
        self.call("cuCtxSynchronize")

    def synchronize(self) -> None:
        self.call("cuCtxSynchronize")

    def change(self, round_: int) -> None:
        """Every row's first 8 bytes become the round's."""
        mark = round_.to_bytes(8, "little")
        for offset in range(0, self.nbytes, ROW):
            self.call("cuMemcpyHtoD_v2", ctypes.c_uint64(self.working + offset),
                      ctypes.c_char_p(mark), ctypes.c_size_t(len(mark)))

    def poke(self) -> None:
        """A GPU call that needs the working set: it waits for the GPU, and for the restore."""
        self.call("cuMemcpyDtoH_v2", self.pinned, ctypes.c_uint64(self.working),
                  ctypes.c_size_t(8))


working_set: TorchSet | DriverSet
expected: int | None = None


def fill(nbytes: int) -> float:
    """The working set, allocated and written: seconds."""
    global expected
    started = time.monotonic()
    working_set.fill(nbytes)
    expected = working_set.checksum()
    working_set.synchronize()
    return time.monotonic() - started


def check() -> dict[str, Any]:
    """One pass over the working set (it waits for the GPU and the restore first): whether it
    came back as it was, and the seconds from asking to the answer."""
    started = time.monotonic()
    intact = working_set.checksum() == expected
    return {"intact": intact, "seconds": time.monotonic() - started}


def change(round_: int) -> float:
    """The working set altered (and the checksum it must come back with): seconds."""
    global expected
    started = time.monotonic()
    working_set.change(round_)
    expected = working_set.checksum()
    return time.monotonic() - started


def poke() -> float:
    """A GPU call that needs the working set back on the card: seconds from asking to done."""
    started = time.monotonic()
    working_set.poke()
    return time.monotonic() - started


def touch() -> float:
    """A GPU call on the small memory: it waits for the GPU (and for the holder's eviction)."""
    started = time.monotonic()
    working_set.touch()
    return time.monotonic() - started


def handle(command: dict[str, Any]) -> Any:
    op = command["op"]
    if op == "fill":
        return fill(command["bytes"])
    if op == "check":
        return check()
    if op == "small":
        return working_set.allocate_small(command["bytes"])
    if op == "touch":
        return touch()
    if op == "change":
        return change(command["round"])
    if op == "poke":
        return poke()
    if op == "env":  # the fake driver reads its settings as it goes (tests/shim/fake_cuda.c)
        os.environ[command["name"]] = command["value"]
        return None
    if op == "cell_begin":
        return shim.cell_begin() if shim else None
    if op == "release":
        return shim.release() if shim else None
    if op == "stats":
        return {**(shim.stats() if shim else {}), "pid": os.getpid()}
    raise ValueError(op)


if __name__ == "__main__":
    driver = os.environ.get("KIWI_EVICTORS_BACKEND") == "driver"
    working_set = DriverSet() if driver else TorchSet()
    for line in sys.stdin:
        request = json.loads(line)
        try:
            reply = {"result": handle(request)}
        except Exception as exc:  # the benchmark reports it in its table
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
