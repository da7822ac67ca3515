"""A stand-in for a GPU where there is none: NumPy arrays that Kiwi counts as GPU memory.

The demo notebooks (binder/) run on a laptop or on Binder, without a GPU. There, their
workload allocates its arrays here, and this module plays the part the CUDA shim plays on a GPU
(docs/shim.md), so that the scheduling and the memory can be watched anywhere:

- **memory**: each array lives in a mapping of its own, counted as this kernel's memory on the
  GPU. The kernel's client speaks the ``memory`` feature for it: the daemon hears the working
  set, what is "on the GPU" and what is in host memory (``nodeside.client.memory``);
- **moving out and back**: asked to make room (an ``evict`` while idle, or a ``drop`` with
  ``evict`` at the end of a quantum), the arrays are copied into host buffers and their pages
  are given back to the system (``MADV_DONTNEED``), as the vmm evictor copies a kernel's memory
  to host shadows and releases it from the card; the next grant copies them back. The copies
  run at a modelled link speed (``KIWI_STANDIN_LINK``, default 4 MiB/s), slow on purpose, so
  that "moving out" and "moving in" can be seen in the panel: a real GPU's link moves such a
  working set in well under a millisecond;
- **the gate**: each NumPy operation on a stand-in array is a "GPU call" (``__array_ufunc__``,
  ``__array_function__``, indexing). It takes the GPU if the cell does not hold it, hands the
  GPU back when the scheduler asked for it (a quantum ended with another notebook waiting) and
  waits for its turn again, and brings the arrays back when they were moved out, as the shim's
  gate does at a CUDA call.

It is a stand-in, not a GPU: what reads an array's memory without an operation (``astype``,
the buffer protocol) is not gated, and results of operations are plain NumPy arrays in host
memory. Outside a Kiwi kernel (no ``%load_ext kiwi_jupyter``), or where the CUDA shim is the
kernel's client, the arrays are plain NumPy arrays that nobody moves.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from nodeside.client import KiwiError
from nodeside.client.memory import MemoryFigures
from nodeside.config.values import parse_size

#: The modelled link between host memory and the stand-in GPU, in bytes a second.
LINK_ENV = "KIWI_STANDIN_LINK"
DEFAULT_LINK = "4MiB"
#: How often a move reports its progress to the daemon (the protocol asks for no more than one
#: report each 50 ms).
_REPORT_EVERY = 0.25
#: Bytes copied in one step of a move.
_STEP = 256 * 1024


class _Allocation:
    """One array's memory: on the stand-in GPU (``mapping``), in host memory (``host``), or
    part here, part there while it moves (``on_host`` bytes of it in host memory)."""

    __slots__ = ("mapping", "nbytes", "host", "on_host")

    def __init__(self, nbytes: int) -> None:
        # Private and anonymous: MADV_DONTNEED frees its pages, and they read as zeros after.
        self.mapping = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.nbytes = nbytes
        self.host: bytearray | None = None
        self.on_host = 0


class StandInArray(np.ndarray):
    """A NumPy array in stand-in GPU memory; every operation on it passes the stand-in's gate.
    Marked ``__kiwi_gpu__`` so that eager mode gates the cells that use it."""

    __kiwi_gpu__ = True
    _device: StandInGPU | None = None

    def __array_finalize__(self, obj: Any) -> None:
        self._device = getattr(obj, "_device", None)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        self._gate()
        out = kwargs.get("out")
        if out is not None:
            kwargs["out"] = tuple(_plain(o) for o in out)
        result = getattr(ufunc, method)(*(_plain(i) for i in inputs), **kwargs)
        return out[0] if out is not None and len(out) == 1 else result

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        self._gate()
        return func(*_plain_all(args), **{k: _plain_all(v) for k, v in kwargs.items()})

    def __getitem__(self, key: Any) -> Any:
        self._gate()
        return super().__getitem__(key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._gate()
        super().__setitem__(key, _plain(value))

    def _gate(self) -> None:
        if self._device is not None:
            self._device.gate()


def _plain(value: Any) -> Any:
    return value.view(np.ndarray) if isinstance(value, StandInArray) else value


def _plain_all(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return type(value)(_plain_all(v) for v in value)
    return _plain(value)


class StandInGPU:
    """Arrays counted as this kernel's GPU memory, moved to host memory when Kiwi asks.

    ``link``: the modelled speed of a move, bytes a second or a size such as ``"4MiB"`` (per
    second); default ``$KIWI_STANDIN_LINK``, else 4 MiB/s.
    """

    __kiwi_gpu__ = True

    def __init__(self, link: str | int | None = None) -> None:
        self.link = parse_size(link if link is not None
                               else os.environ.get(LINK_ENV) or DEFAULT_LINK)
        if self.link <= 0:
            raise ValueError("the stand-in's link speed must be positive")
        self._allocations: dict[int, _Allocation] = {}
        self._lock = threading.RLock()  # moves and the table; never held while waiting
        self._dirty = False
        self._reported_at = 0.0
        #: Moves so far, each way (the demo prints them; tests read them).
        self.moves_out = 0
        self.moves_in = 0
        #: Whether the kernel's client speaks for this memory (a Kiwi kernel without the shim).
        self.managed = _extension_serving(self)

    # -- allocations ----------------------------------------------------------------------

    def rand(self, *shape: int, dtype: Any = np.float32) -> StandInArray:
        """Uniform random numbers in [0, 1), as ``numpy.random.rand`` (float32 by default)."""
        array = self.empty(shape, dtype)
        array.view(np.ndarray)[...] = np.random.random_sample(shape)
        return array

    def zeros(self, shape: int | tuple[int, ...], dtype: Any = np.float32) -> StandInArray:
        return self.empty(shape, dtype)  # a fresh mapping reads as zeros

    def asarray(self, values: Any, dtype: Any = None) -> StandInArray:
        """A copy of ``values`` in stand-in GPU memory."""
        source = np.asarray(_plain(values), dtype=dtype)
        array = self.empty(source.shape, source.dtype)
        array.view(np.ndarray)[...] = source
        return array

    def empty(self, shape: int | tuple[int, ...], dtype: Any = np.float32) -> StandInArray:
        """An allocation: like a CUDA allocation, it waits for the GPU first."""
        self.gate()
        kind = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        allocation = _Allocation(count * kind.itemsize)
        base = np.frombuffer(allocation.mapping, dtype=kind, count=count)
        array = base.reshape(shape).view(StandInArray)
        array._device = self
        with self._lock:
            self._allocations[id(allocation)] = allocation
            self._dirty = True
        # The memory goes when the last array viewing it does (its buffer is the mapping).
        weakref.finalize(base, self._freed, id(allocation))
        self._report()
        return array

    def _freed(self, key: int) -> None:
        # From the garbage collector, on any thread: no I/O here; the next gate reports it.
        with self._lock:
            allocation = self._allocations.pop(key, None)
            self._dirty = True
        if allocation is not None:
            # The mapping closes with its last user; an evicted array's host copy goes now.
            allocation.host = None

    # -- where the memory is ----------------------------------------------------------------

    def figures(self) -> MemoryFigures:
        with self._lock:
            total = sum(a.nbytes for a in self._allocations.values())
            host = sum(a.on_host for a in self._allocations.values())
        return MemoryFigures(working_set=total, resident=total - host, host=host)

    def evict_asked(self, nbytes: int, for_name: str) -> None:
        """The scheduler wants room for ``for_name`` while this kernel is idle: move out."""
        started = time.monotonic()
        try:
            moved = self._move_out()
        except OSError as exc:
            self._tell_evicted(0, started, failed=f"the stand-in could not move out: {exc}")
            return
        self._tell_evicted(moved, started)

    # -- the gate -----------------------------------------------------------------------------

    def gate(self) -> None:
        """What every operation on a stand-in array passes first: the GPU, held (asked for if
        the cell does not hold it, handed back and asked for again if the scheduler wants it
        back), and the arrays on it."""
        arbiter = _arbiter() if self.managed else None
        if arbiter is not None and arbiter.mode != "off":
            if arbiter.holding and arbiter.drop_asked():
                arbiter.hand_back(self._hand_back_moves())
            elif not arbiter.holding:
                arbiter.acquire()
        if self.figures().host:
            self._move_in()
        if self._dirty:
            self._report()

    def _hand_back_moves(self) -> Callable[[], None] | None:
        """What handing the GPU back involves: moving out first, when the scheduler said the
        next holder needs the room (the drop's ``evict``)."""
        arbiter = _arbiter()
        if arbiter is None or not arbiter.drop_evicts() or not self.figures().resident:
            return None

        def move_out() -> None:
            started = time.monotonic()
            self._tell_evicted(self._move_out(), started)

        return move_out

    # -- moving -------------------------------------------------------------------------------

    def _move_out(self) -> int:
        """Copy every array on the stand-in GPU to host memory and free its pages there;
        returns the bytes moved."""
        with self._lock:
            moving = [a for a in self._allocations.values() if a.on_host < a.nbytes]
            moved = self._paced(moving, out=True)
            self.moves_out += 1 if moving else 0
            self._report()
            return moved

    def _move_in(self) -> None:
        """Copy every array in host memory back onto the stand-in GPU."""
        with self._lock:
            moving = [a for a in self._allocations.values() if a.on_host]
            self._paced(moving, out=False)
            self.moves_in += 1 if moving else 0
            self._report()  # host 0: the daemon counts it back in

    def _paced(self, moving: list[_Allocation], out: bool) -> int:
        """Copy ``moving`` step by step at the link's speed, reporting as it goes; returns the
        bytes copied. Moving out, each step's pages are freed once copied (the daemon may let
        the next holder in before the move ends); moving in, the host copy goes at the end."""
        started, done = time.monotonic(), 0
        for allocation in moving:
            if out:
                allocation.host = bytearray(allocation.nbytes)
            host = allocation.host
            assert host is not None
            with memoryview(allocation.mapping) as device:
                for offset in range(0, allocation.nbytes, _STEP):
                    end = min(offset + _STEP, allocation.nbytes)
                    if out:
                        host[offset:end] = device[offset:end]
                        # The step's pages leave the "card" (_STEP is a multiple of a page).
                        allocation.mapping.madvise(mmap.MADV_DONTNEED, offset, end - offset)
                        allocation.on_host = end
                    else:
                        device[offset:end] = host[offset:end]
                        allocation.on_host = allocation.nbytes - end
                    done += end - offset
                    self._dirty = True
                    self._progress()
                    time.sleep(max(0.0, started + done / self.link - time.monotonic()))
            if not out:
                allocation.host = None
        return done

    # -- telling the daemon -------------------------------------------------------------------

    def _progress(self) -> None:
        """A move's progress, told at most every ``_REPORT_EVERY`` seconds."""
        if time.monotonic() - self._reported_at >= _REPORT_EVERY:
            self._report()

    def _report(self) -> None:
        """Tell the daemon where the memory is now."""
        client = _client() if self.managed else None
        if client is None or not client.speaks_memory or not client.connected:
            return
        self._dirty = False
        self._reported_at = time.monotonic()
        try:
            client.report_memory()
        except (ConnectionError, TimeoutError, KiwiError):
            self._dirty = True  # the next register (or report) carries the figures

    def _tell_evicted(self, moved: int, started: float, failed: str | None = None) -> None:
        client = _client() if self.managed else None
        if client is None:
            return
        # A daemon that went away learns where the memory is from the next register.
        with contextlib.suppress(ConnectionError, TimeoutError, KiwiError):
            client.evicted(moved=moved, seconds=time.monotonic() - started, failed=failed)


def _extension() -> Any:
    from kiwi_jupyter.kernel import extension

    return extension._loaded  # noqa: SLF001 - the one extension of this kernel, if loaded


def _extension_serving(device: StandInGPU) -> bool:
    loaded = _extension()
    return loaded is not None and bool(loaded.serve_pages(device))


def _arbiter() -> Any:
    loaded = _extension()
    return None if loaded is None else loaded.arbiter


def _client() -> Any:
    loaded = _extension()
    return None if loaded is None else loaded.link.current
