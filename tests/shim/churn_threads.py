"""Many threads of a shimmed workload allocating and freeing at once, for the one table of
allocations (mechanisms/memory.c) under contention: run inside the workload process, as
`__import__("churn_threads").churn_on_threads(d, ...)`, with the workload's driver d.

Each thread allocates every size (slab units, regions, several chunks), plainly and in stream
order on a stream of its own, tags both ends of each allocation with bytes of its own, and frees
about two in five again, plainly or in stream order. What is live stays in LIVE for the test's
next call."""

from __future__ import annotations

import hashlib
import random
import threading
from typing import Any

#: The live allocations, by pointer: (size, the stream of a stream-ordered one or None).
LIVE: dict[int, tuple[int, int | None]] = {}
_live_lock = threading.Lock()
SIZES = (1, 100, 512, 4096, 70_000, 600_000, 1 << 20, 3 * (1 << 20) + 5, 8 << 20)


def _tag(ptr: int, size: int) -> bytes:
    return hashlib.sha256(f"{ptr}:{size}".encode()).digest()[:min(16, size)]


def _one(d: Any, seed: int, operations: int, failures: list[str]) -> None:
    try:
        _churn(d, seed, operations, failures)
    except Exception as exc:  # a thread's failure, for the test to read
        failures.append(f"thread {seed}: {type(exc).__name__}: {exc}")


def _churn(d: Any, seed: int, operations: int, failures: list[str]) -> None:
    rng = random.Random(seed)
    stream = 0x1000 + seed
    mine: dict[int, tuple[int, int | None]] = {}
    for _ in range(operations):
        if mine and rng.random() < 0.4:
            ptr = rng.choice(sorted(mine))
            size, on = mine.pop(ptr)
            with _live_lock:
                LIVE.pop(ptr)
            code = d.free(ptr) if on is None else d.free_async(ptr, stream=on)
            if code:
                failures.append(f"free of {ptr:#x}: {code}")
            continue
        size = rng.choice(SIZES)
        ordered = rng.random() < 0.5
        ptr = d.alloc_async(size, stream=stream) if ordered else d.alloc(size)
        with _live_lock:
            clash = [p for p, (s, _) in LIVE.items() if ptr < p + s and p < ptr + size]
            LIVE[ptr] = (size, stream if ordered else None)
        if clash:
            failures.append(f"{ptr:#x}+{size} overlaps {clash[0]:#x}")
        mine[ptr] = LIVE[ptr]
        mark = _tag(ptr, size)
        if d.write(ptr, mark) or d.write(ptr + size - len(mark), mark):
            failures.append(f"writing {ptr:#x} failed")


def churn_on_threads(d: Any, threads: int, operations: int, first_seed: int = 0) -> list[str]:
    """threads threads churn at once (seeds from first_seed on); what failed."""
    failures: list[str] = []
    workers = [threading.Thread(target=_one, args=(d, seed, operations, failures))
               for seed in range(first_seed, first_seed + threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return failures


def live() -> int:
    return len(LIVE)


def unchanged(d: Any) -> list[int]:
    """The live allocations whose tags are not what their thread wrote."""
    def intact(ptr: int, size: int) -> bool:
        mark = _tag(ptr, size)
        return d.read(ptr, len(mark)) == mark and d.read(ptr + size - len(mark), len(mark)) == mark
    return [ptr for ptr, (size, _) in LIVE.items() if not intact(ptr, size)]


def free_all(d: Any) -> list[str]:
    """Frees every live allocation as it was made; what failed."""
    failures = []
    while LIVE:
        ptr, (_, on) = LIVE.popitem()
        code = d.free(ptr) if on is None else d.free_async(ptr, stream=on)
        if code:
            failures.append(f"free of {ptr:#x}: {code}")
    return failures
