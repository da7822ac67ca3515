"""The CUDA shim: a preloaded C library that gates a process's GPU work and pages its memory.

The library (C sources beside this file, docs/shim.md) does its work by itself once it is in
``LD_PRELOAD``. This module finds or builds it, and wraps the small C API the kernel hook calls:

    from kiwi_jupyter.shim import Shim
    shim = Shim.attach()          # None unless the library is preloaded in this process
    if shim:
        shim.cell_begin(); ...; shim.release()

The C functions never need the GIL; ctypes releases it around each call, so a cell blocked in
the shim never stops the kernel's other threads.
"""

from __future__ import annotations

import ctypes
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kiwi_jupyter.shim.build import (
    LIBRARY_NAME,
    BuildError,
    compile_library,
    is_current,
    sources_hash,
)

__all__ = ["BuildError", "NoRoomError", "Shim", "ShimPolicyError", "cache_dir", "library_path"]

_HERE = Path(__file__).resolve().parent


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kiwi-jupyter" / "shim"


def library_path(*, build: bool = True) -> Path:
    """The shim library for the sources installed now.

    The wheel ships it built (hatch_build.py); an editable install builds it in place when it is
    installed. When that copy is missing or older than the C sources, it is built on demand into
    ``~/.cache/kiwi-jupyter/shim/<hash>/`` (``build=False`` raises instead).
    """
    packaged = _HERE / LIBRARY_NAME
    if is_current(packaged):
        return packaged
    cached = cache_dir() / sources_hash()[:16] / LIBRARY_NAME
    if is_current(cached):
        return cached
    if not build:
        raise FileNotFoundError(f"the CUDA shim is not built for these sources ({packaged})")
    return compile_library(cached)


class ShimPolicyError(ValueError):
    """A fail policy the shim does not accept (a negative timeout)."""


class NoRoomError(MemoryError):
    """The scheduler could not make room on the GPU for this process for ``KIWI_ROOM_TIMEOUT``
    seconds: the wait for the GPU gave up (docs/shim.md, "When the daemon cannot make room")."""


class Shim:
    """The C API of a shim library loaded in this process."""

    def __init__(self, library: ctypes.CDLL) -> None:
        self._lib = library
        lib = library
        lib.kiwi_shim_active.restype = ctypes.c_int
        lib.kiwi_shim_active.argtypes = []
        lib.kiwi_shim_cell_begin.restype = None
        lib.kiwi_shim_cell_begin.argtypes = []
        lib.kiwi_shim_acquire.restype = ctypes.c_int
        lib.kiwi_shim_acquire.argtypes = [ctypes.c_double]
        lib.kiwi_shim_release.restype = ctypes.c_int
        lib.kiwi_shim_release.argtypes = []
        lib.kiwi_shim_holding.restype = ctypes.c_int
        lib.kiwi_shim_holding.argtypes = []
        lib.kiwi_shim_set_policy.restype = ctypes.c_int
        lib.kiwi_shim_set_policy.argtypes = [ctypes.c_int, ctypes.c_double]
        lib.kiwi_shim_catch_interrupts.restype = ctypes.c_int
        lib.kiwi_shim_catch_interrupts.argtypes = []
        lib.kiwi_shim_interrupt.restype = None
        lib.kiwi_shim_interrupt.argtypes = []
        lib.kiwi_shim_stats_json.restype = ctypes.c_int
        lib.kiwi_shim_stats_json.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        lib.kiwi_shim_free_ranges_begin.restype = None
        lib.kiwi_shim_free_ranges_begin.argtypes = []
        lib.kiwi_shim_set_free_ranges.restype = ctypes.c_longlong
        lib.kiwi_shim_set_free_ranges.argtypes = [ctypes.POINTER(ctypes.c_ulonglong),
                                                  ctypes.POINTER(ctypes.c_ulonglong),
                                                  ctypes.c_size_t]

    @staticmethod
    def loaded() -> bool:
        """Is the shim preloaded into this process?"""
        return Shim.attach() is not None

    @classmethod
    def attach(cls) -> Shim | None:
        """The shim loaded in this process (by LD_PRELOAD), or None when there is none."""
        process = ctypes.CDLL(None)
        try:
            process.kiwi_shim_active  # noqa: B018 - looking the symbol up is the test
        except AttributeError:
            return None
        return cls(process)

    def active(self) -> bool:
        """True when the shim gates and pages GPU work (KIWI_SHIM is not 0)."""
        return bool(self._lib.kiwi_shim_active())

    def cell_begin(self) -> None:
        """A cell starts: the cell's end, not an idle timer, gives the GPU back."""
        self._lib.kiwi_shim_cell_begin()

    def acquire(self, timeout: float | None = None) -> bool:
        """Wait until this process holds its GPU (eager mode). False on timeout.

        Raises ConnectionError when the daemon is unreachable and the policy is closed, and
        NoRoomError when the scheduler could not make room for it for ``KIWI_ROOM_TIMEOUT``.
        """
        result = self._lib.kiwi_shim_acquire(float(timeout or 0.0))
        if result < 0:
            raise ConnectionError("the Kiwi scheduler is unreachable and the fail policy is closed")
        if result == 3:
            why = self.stats().get("room_last_refusal") or "it gave no reason"
            raise NoRoomError(f"the Kiwi scheduler could not make room on the GPU for this "
                              f"process within KIWI_ROOM_TIMEOUT: {why}")
        # 2: interrupted. Ctrl-C's KeyboardInterrupt is raised by Python itself as this returns.
        return result == 0

    def catch_interrupts(self) -> None:
        """Let Ctrl-C end a wait for the GPU inside a CUDA call (which Python's own handler
        cannot reach until the call returns). Call it on the main thread after the kernel has
        installed its SIGINT handler, which the shim's then hands each signal on to."""
        if self._lib.kiwi_shim_catch_interrupts() != 0:
            raise OSError("could not install the shim's SIGINT handler")

    def interrupt(self) -> None:
        """End the waits for the GPU in progress now, as Ctrl-C does."""
        self._lib.kiwi_shim_interrupt()

    def release(self) -> None:
        """A cell ends: synchronize, evict if the next holder needs the room, release."""
        self._lib.kiwi_shim_release()

    @property
    def holding(self) -> bool:
        return bool(self._lib.kiwi_shim_holding())

    def free_ranges_begin(self) -> None:
        """Call before reading which blocks the framework's cache holds free: any GPU call
        from here on makes what is read untrustworthy, and the shim then ignores it."""
        self._lib.kiwi_shim_free_ranges_begin()

    def set_free_ranges(self, ranges: Sequence[tuple[int, int]]) -> int:
        """The (address, size) blocks the framework's cache holds free, read since
        free_ranges_begin(): an eviction discards (or leaves out) what the shim believes of
        them instead of copying it. Returns the bytes believed; ValueError without a begin."""
        count = len(ranges)
        ptrs = (ctypes.c_ulonglong * count)(*(int(ptr) for ptr, _ in ranges))
        sizes = (ctypes.c_ulonglong * count)(*(int(size) for _, size in ranges))
        believed = int(self._lib.kiwi_shim_set_free_ranges(ptrs, sizes, count))
        if believed < 0:
            raise ValueError("set_free_ranges() needs free_ranges_begin() first")
        return believed

    def set_policy(self, *, fail_closed: bool, timeout: float) -> None:
        """What to do while the daemon is unreachable, after ``timeout`` seconds of outage:
        run GPU work unscheduled (fail open) or fail it (fail closed)."""
        if self._lib.kiwi_shim_set_policy(int(fail_closed), float(timeout)) != 0:
            raise ShimPolicyError(f"timeout must not be negative: {timeout}")

    def stats(self) -> dict[str, Any]:
        """State and counters: hold state, queue position, working set, bytes moved, ..."""
        size = 1024
        while True:
            buffer = ctypes.create_string_buffer(size)
            needed = self._lib.kiwi_shim_stats_json(buffer, size)
            if needed < size:
                result: dict[str, Any] = json.loads(buffer.value)
                return result
            size = needed + 1
