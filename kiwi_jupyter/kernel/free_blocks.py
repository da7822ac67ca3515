"""What the framework's cache holds free, told to the CUDA shim as each GPU cell ends.

PyTorch's caching allocator keeps freed blocks inside the big segments it allocated; to the shim
a segment is one managed allocation, live from end to end, so an eviction would copy the free
blocks to host memory and back for nothing. At a cell's end, before the GPU is released, the
kernel reads them from ``torch.cuda.memory_snapshot()`` and hands them to the shim, which
discards them on eviction (or leaves them out) and skips them on restore (docs/shim.md).

Only frameworks the cell's code already imported are read (``sys.modules``): the kernel never
imports one itself. CuPy's memory pool is not read: it counts its free bytes
(``free_bytes()``) but does not say where its free chunks are, short of its Cython internals.

It must never cost a cell anything: it is skipped while the process has little managed memory
or the cache holds little free, and any failure turns it off for the kernel's life after one
warning line.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

#: Below this much managed memory (the shim's ``evictable``) an eviction is quick anyway.
MIN_EVICTABLE = 256 << 20
#: Blocks smaller than this cannot hold a whole 2 MiB page: the shim would not believe them.
MIN_BLOCK = 2 << 20
#: Read the blocks only when the cache holds at least this much free.
MIN_CACHED_FREE = 64 << 20

FreeRanges = list[tuple[int, int]]


class FreeRangesShim(Protocol):
    """What this uses of ``kiwi_jupyter.shim.Shim``."""

    def stats(self) -> Mapping[str, Any]: ...

    def free_ranges_begin(self) -> None: ...

    def set_free_ranges(self, ranges: Sequence[tuple[int, int]]) -> int: ...


def torch_free_blocks(segments: Iterable[Mapping[str, Any]]) -> FreeRanges:
    """The (address, size) of each block PyTorch's caching allocator holds free, from the
    segments ``torch.cuda.memory_snapshot()`` returns.

    A block is free when its state is ``inactive`` (``active_awaiting_free`` is still in use by
    another stream). Segments of CUDA graphs' private pools are left alone: a graph's replays
    use their blocks without the allocator's say. Expandable segments are VMM memory, which the
    shim does not page. Blocks carry their address since PyTorch 2.1; before, they tile their
    segment in order, which gives the address.
    """
    ranges: FreeRanges = []
    for segment in segments:
        if segment.get("is_expandable") or tuple(segment.get("segment_pool_id") or (0, 0)) != (
                0, 0):
            continue
        address = int(segment["address"])
        for block in segment["blocks"]:
            size = int(block["size"])
            start = int(block.get("address", address))
            if block["state"] == "inactive" and size >= MIN_BLOCK:
                ranges.append((start, size))
            address = start + size
    return ranges


def torch_free_blocks_now() -> FreeRanges | None:
    """PyTorch's free blocks in this process now; None when PyTorch is not imported, has not
    initialised CUDA, uses another allocator, or holds little free."""
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_initialized():
        return None
    if getattr(cuda, "get_allocator_backend", lambda: "native")() != "native":
        return None  # cudaMallocAsync: the shim's managed pools are trimmed instead
    cached_free = sum(cuda.memory_reserved(device) - cuda.memory_allocated(device)
                      for device in range(cuda.device_count()))
    if cached_free < MIN_CACHED_FREE:
        return None
    try:
        segments = cuda.memory_snapshot(include_traces=False)
    except TypeError:  # before PyTorch 2.8
        segments = cuda.memory_snapshot()
    return torch_free_blocks(segments)


class FreeBlocks:
    """Tells the shim, as a GPU cell ends, which blocks the frameworks' caches hold free."""

    def __init__(self, shim: FreeRangesShim,
                 sources: Sequence[Callable[[], FreeRanges | None]] = (torch_free_blocks_now,),
                 warn: Callable[[str], None] | None = None) -> None:
        self.shim = shim
        self.sources = sources
        self.warn = warn or (lambda line: print(line, file=sys.stderr, flush=True))
        self.off = False

    def tell(self) -> int | None:
        """Read the free blocks and tell the shim; the bytes it believes, or None when nothing
        was read. Call it before the cell's release: the release evicts."""
        if self.off:
            return None
        try:
            if int(self.shim.stats().get("evictable") or 0) < MIN_EVICTABLE:
                return None
            # Before reading: GPU work from here on (another thread's) voids what is read.
            self.shim.free_ranges_begin()
            ranges: FreeRanges = []
            found = False
            for source in self.sources:
                blocks = source()
                if blocks is not None:
                    found = True
                    ranges.extend(blocks)
            return self.shim.set_free_ranges(ranges) if found else None
        except Exception as exc:  # never a cell's failure: evictions copy everything instead
            self.off = True
            self.warn(f"kiwi: reading the free blocks of the framework's cache failed "
                      f"({type(exc).__name__}: {exc}); evictions copy them from now on")
            return None
