"""The CUDA driver's checkpoint API (r570 and later), over ctypes.

Every call takes the pid of another process and blocks: lock waits for the process's submitted
work (up to a timeout), checkpoint copies its device memory to host memory and releases its GPU
resources, restore maps them back at the same addresses, unlock lets its CUDA calls run again.
The daemon calls them on worker threads, never on its event loop.

The entry points are fetched through ``cuGetProcAddress``, as a CUDA runtime would: a driver
older than r570 answers "not found" there, which is how ``load`` tells that the API is missing.
"""

from __future__ import annotations

import ctypes
import enum
import threading
from typing import Any

_ENTRY_POINTS = ("cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint",
                 "cuCheckpointProcessRestore", "cuCheckpointProcessUnlock",
                 "cuCheckpointProcessGetState")

# The CUresult values the API documents; the others are reported by number.
_ERRORS = {1: "invalid value (no such CUDA process)", 3: "driver not initialized",
           401: "illegal state", 600: "not ready (lock timed out)", 801: "not supported"}
NOT_READY = 600
INVALID_VALUE = 1


class ProcessState(enum.IntEnum):
    """CUprocessState."""

    RUNNING = 0
    LOCKED = 1
    CHECKPOINTED = 2
    FAILED = 3


class CheckpointError(Exception):
    """A checkpoint API call failed; ``code`` is the CUresult, ``step`` the call."""

    def __init__(self, step: str, code: int) -> None:
        super().__init__(f"{step} failed: CUDA error {code} ({_ERRORS.get(code, 'unknown')})")
        self.step = step
        self.code = code


class CheckpointUnavailable(Exception):
    """The driver has no checkpoint API (or no driver could be loaded); the message says why."""


class _LockArgs(ctypes.Structure):
    _fields_ = [("timeoutMs", ctypes.c_uint), ("reserved0", ctypes.c_uint),
                ("reserved1", ctypes.c_uint64 * 7)]


class _ReservedArgs(ctypes.Structure):
    # CUcheckpointCheckpointArgs, CUcheckpointUnlockArgs and (without GPU remapping)
    # CUcheckpointRestoreArgs: 64 bytes that must be zero.
    _fields_ = [("reserved", ctypes.c_uint64 * 8)]


class CheckpointApi:
    """The five entry points of one loaded driver."""

    def __init__(self, library: str = "libcuda.so.1") -> None:
        try:
            driver = ctypes.CDLL(library)
        except OSError as exc:
            raise CheckpointUnavailable(f"cannot load the CUDA driver {library}: {exc}") from None
        try:
            init = driver.cuInit
            get_proc = driver.cuGetProcAddress_v2
        except AttributeError as exc:
            raise CheckpointUnavailable(f"{library} is not a CUDA 12 driver: {exc}") from None
        init.argtypes, init.restype = [ctypes.c_uint], ctypes.c_int
        # Restore needs the calling process to have initialized the driver (cuda.h).
        code = init(0)
        if code != 0:
            raise CheckpointUnavailable(f"cuInit failed with CUDA error {code}")
        get_proc.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                             ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)]
        get_proc.restype = ctypes.c_int
        # Asked for at the driver's own version: each entry point is found from the version
        # that introduced it on, so the newest variant comes back.
        version = ctypes.c_int(0)
        driver.cuDriverGetVersion.argtypes = [ctypes.POINTER(ctypes.c_int)]
        if driver.cuDriverGetVersion(ctypes.byref(version)) != 0:
            raise CheckpointUnavailable("cuDriverGetVersion failed")
        self.library = library
        self._calls: dict[str, Any] = {}
        for name in _ENTRY_POINTS:
            address = ctypes.c_void_p()
            found = get_proc(name.encode(), ctypes.byref(address), version.value, 0, None)
            if found != 0 or not address.value:
                raise CheckpointUnavailable(f"the CUDA driver has no {name} (it needs r570 or "
                                            "later)")
            argument = ctypes.POINTER(ctypes.c_int) if name.endswith("GetState") \
                else ctypes.c_void_p
            self._calls[name] = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, argument)(
                address.value)

    def _call(self, name: str, pid: int, args: Any) -> None:
        code = self._calls[name](pid, args)
        if code != 0:
            raise CheckpointError(name, code)

    def lock(self, pid: int, timeout: float) -> None:
        """Block the process's CUDA calls once its submitted work is done; CheckpointError
        with code NOT_READY when that takes longer than ``timeout`` (the process runs on)."""
        args = _LockArgs(timeoutMs=max(1, min(int(timeout * 1000), 2**32 - 1)))
        self._call("cuCheckpointProcessLock", pid, ctypes.addressof(args))

    def checkpoint(self, pid: int) -> None:
        args = _ReservedArgs()
        self._call("cuCheckpointProcessCheckpoint", pid, ctypes.addressof(args))

    def restore(self, pid: int) -> None:
        args = _ReservedArgs()
        self._call("cuCheckpointProcessRestore", pid, ctypes.addressof(args))

    def unlock(self, pid: int) -> None:
        args = _ReservedArgs()
        self._call("cuCheckpointProcessUnlock", pid, ctypes.addressof(args))

    def state(self, pid: int) -> ProcessState:
        value = ctypes.c_int(-1)
        self._call("cuCheckpointProcessGetState", pid, ctypes.byref(value))
        return ProcessState(value.value)


_loaded: dict[str, CheckpointApi | str] = {}
_loading = threading.Lock()


def load(library: str = "libcuda.so.1") -> CheckpointApi:
    """The API of ``library``, loaded once per process; CheckpointUnavailable says why not."""
    with _loading:
        api = _loaded.get(library)
        if api is None:
            try:
                api = CheckpointApi(library)
            except CheckpointUnavailable as exc:
                api = str(exc)
            _loaded[library] = api
    if isinstance(api, str):
        raise CheckpointUnavailable(api)
    return api
