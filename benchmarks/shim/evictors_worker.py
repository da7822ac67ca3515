"""The process under test in ``benchmarks.shim.evictors``: PyTorch with the shim preloaded,
driven by JSON commands on stdin, one JSON answer per line on stdout.

Its working set is one int64 tensor with a pattern that differs per element; the check sums it
per 2 MiB row and weighs each row by its index, so a row lost, zeroed or moved changes the sum.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import torch

from kiwi_jupyter.shim import Shim

ROW = (2 << 20) // 8  # int64 elements in 2 MiB
shim = Shim.attach()
working: torch.Tensor | None = None
small: torch.Tensor | None = None
expected: int | None = None


def checksum() -> int:
    assert working is not None
    rows = working.view(-1, ROW).sum(dim=1)
    weights = torch.arange(1, rows.numel() + 1, device=rows.device, dtype=torch.int64)
    return int((rows * weights).sum().item())


def fill(nbytes: int) -> float:
    """The working set, allocated and written: seconds."""
    global working, expected
    started = time.monotonic()
    working = torch.arange(nbytes // 8, device="cuda", dtype=torch.int64)
    working.mul_(2654435761).remainder_(1 << 31)
    expected = checksum()
    torch.cuda.synchronize()
    return time.monotonic() - started


def check() -> dict[str, Any]:
    """One pass over the working set (it waits for the GPU and the restore first): whether it
    came back as it was, and the seconds from asking to the answer."""
    started = time.monotonic()
    intact = checksum() == expected
    return {"intact": intact, "seconds": time.monotonic() - started}


def allocate_small(nbytes: int) -> None:
    """Memory to ask for room with: allocated (which waits for nothing), not yet touched."""
    global small
    small = torch.empty(nbytes, dtype=torch.uint8, device="cuda")


def touch() -> float:
    """A GPU call on the small memory: it waits for the GPU (and for the holder's eviction)."""
    assert small is not None
    started = time.monotonic()
    small.fill_(1)
    torch.cuda.synchronize()
    return time.monotonic() - started


def handle(command: dict[str, Any]) -> Any:
    op = command["op"]
    if op == "fill":
        return fill(command["bytes"])
    if op == "check":
        return check()
    if op == "small":
        return allocate_small(command["bytes"])
    if op == "touch":
        return touch()
    if op == "cell_begin":
        return shim.cell_begin() if shim else None
    if op == "release":
        return shim.release() if shim else None
    if op == "stats":
        return {**(shim.stats() if shim else {}), "pid": os.getpid()}
    raise ValueError(op)


if __name__ == "__main__":
    for line in sys.stdin:
        request = json.loads(line)
        try:
            reply = {"result": handle(request)}
        except Exception as exc:  # the benchmark reports it in its table
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
