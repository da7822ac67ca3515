"""The process under test in the shim benchmarks: PyTorch with the shim preloaded, driven by
JSON commands on stdin, one JSON answer per line on stdout. Started by paging.py."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import torch

from kiwi_jupyter.shim import Shim

shim = Shim.attach()
tensor: torch.Tensor | None = None


def allocate(nbytes: int) -> None:
    global tensor
    tensor = torch.ones(nbytes // 4, device="cuda")
    torch.cuda.synchronize()


def iterate(count: int) -> list[float]:
    """count passes over the whole working set; each pass's wall time, synchronized."""
    return [end - start for start, end in passes(count)]


def passes(count: int) -> list[tuple[float, float]]:
    """count passes over the whole working set; when each began and ended, synchronized, on
    CLOCK_MONOTONIC (time.monotonic: the clock of the shim's last_grant_at)."""
    assert tensor is not None
    spans = []
    for _ in range(count):
        started = time.monotonic()
        tensor.mul_(1.0000001)
        torch.cuda.synchronize()
        spans.append((started, time.monotonic()))
    return spans


def handle(command: dict[str, Any]) -> Any:
    op = command["op"]
    if op == "allocate":
        return allocate(command["bytes"])
    if op == "iterate":
        return iterate(command["count"])
    if op == "passes":
        return passes(command["count"])
    if op == "cell_begin":
        return shim.cell_begin() if shim else None
    if op == "release":
        return shim.release() if shim else None
    if op == "stats":
        return shim.stats() if shim else {}
    raise ValueError(op)


for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.write(json.dumps({"result": handle(request)}) + "\n")
    sys.stdout.flush()
