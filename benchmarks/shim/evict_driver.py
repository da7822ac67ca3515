"""The few CUDA driver calls ``evict_variants`` needs, through ctypes on libcuda.so.1: no
PyTorch, no CuPy, no shim, so what is measured is the driver alone.

Each call raises ``DriverError`` naming the call and the CUresult. Optional calls (the _v2
location forms, CUDA 13's discards) are looked up once; ``None`` when this driver lacks them.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

CU_DEVICE_CPU = -1
CU_MEM_ATTACH_GLOBAL = 1
CU_STREAM_NON_BLOCKING = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_LOCATION_TYPE_HOST = 2
CU_MEM_ADVISE_SET_PREFERRED_LOCATION = 3
CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION = 4
CUDA_ERROR_NOT_SUPPORTED = 801

Ptr = ctypes.c_uint64  # CUdeviceptr


class DriverError(RuntimeError):
    def __init__(self, call: str, result: int) -> None:
        super().__init__(f"{call} failed with CUresult {result}")
        self.result = result


class Location(ctypes.Structure):
    """CUmemLocation, passed by value to the _v2 calls."""

    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


def location(device: int) -> Location:
    if device == CU_DEVICE_CPU:
        return Location(CU_MEM_LOCATION_TYPE_HOST, 0)
    return Location(CU_MEM_LOCATION_TYPE_DEVICE, device)


class Driver:
    """One primary context on one device, current on whichever thread calls ``bind``."""

    def __init__(self, ordinal: int = 0) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self._call("cuInit", 0)
        device = ctypes.c_int()
        self._call("cuDeviceGet", ctypes.byref(device), ordinal)
        self.device = device.value
        self.context = ctypes.c_void_p()
        self._call("cuDevicePrimaryCtxRetain", ctypes.byref(self.context), self.device)
        self.bind()
        version = ctypes.c_int()
        self._call("cuDriverGetVersion", ctypes.byref(version))
        self.version = version.value
        self.prefetch_v2 = self._optional("cuMemPrefetchAsync_v2")
        self.advise_v2 = self._optional("cuMemAdvise_v2")
        self.discard_batch = self._optional("cuMemDiscardBatchAsync")
        self.discard_and_prefetch_batch = self._optional("cuMemDiscardAndPrefetchBatchAsync")

    def _optional(self, name: str) -> object | None:
        return getattr(self.lib, name, None)

    def _call(self, name: str, *args: object) -> None:
        result = getattr(self.lib, name)(*args)
        if result != 0:
            raise DriverError(name, result)

    def bind(self) -> None:
        """Make the context current on the calling thread (each worker thread calls it)."""
        self._call("cuCtxSetCurrent", self.context)

    def mem_info(self) -> tuple[int, int]:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self._call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value

    def alloc_managed(self, nbytes: int) -> int:
        ptr = Ptr()
        self._call("cuMemAllocManaged", ctypes.byref(ptr), ctypes.c_size_t(nbytes),
                   CU_MEM_ATTACH_GLOBAL)
        return ptr.value

    def alloc_device(self, nbytes: int) -> int:
        ptr = Ptr()
        self._call("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(nbytes))
        return ptr.value

    def free(self, ptr: int) -> None:
        self._call("cuMemFree_v2", Ptr(ptr))

    def alloc_pinned(self, nbytes: int) -> int:
        host = ctypes.c_void_p()
        self._call("cuMemAllocHost_v2", ctypes.byref(host), ctypes.c_size_t(nbytes))
        return host.value or 0

    def free_pinned(self, host: int) -> None:
        self._call("cuMemFreeHost", ctypes.c_void_p(host))

    def stream(self) -> ctypes.c_void_p:
        stream = ctypes.c_void_p()
        self._call("cuStreamCreate", ctypes.byref(stream), CU_STREAM_NON_BLOCKING)
        return stream

    def sync(self, stream: ctypes.c_void_p) -> None:
        self._call("cuStreamSynchronize", stream)

    def memset32(self, ptr: int, value: int, count: int, stream: ctypes.c_void_p) -> None:
        self._call("cuMemsetD32Async", Ptr(ptr), ctypes.c_uint(value), ctypes.c_size_t(count),
                   stream)

    def to_host(self, host: int, ptr: int, nbytes: int, stream: ctypes.c_void_p) -> None:
        self._call("cuMemcpyDtoHAsync_v2", ctypes.c_void_p(host), Ptr(ptr),
                   ctypes.c_size_t(nbytes), stream)

    def to_device(self, ptr: int, host: int, nbytes: int, stream: ctypes.c_void_p) -> None:
        self._call("cuMemcpyHtoDAsync_v2", Ptr(ptr), ctypes.c_void_p(host),
                   ctypes.c_size_t(nbytes), stream)

    def prefetch(self, ptr: int, nbytes: int, device: int, stream: ctypes.c_void_p) -> None:
        if self.prefetch_v2 is not None:
            self._call("cuMemPrefetchAsync_v2", Ptr(ptr), ctypes.c_size_t(nbytes),
                       location(device), ctypes.c_uint(0), stream)
        else:
            self._call("cuMemPrefetchAsync", Ptr(ptr), ctypes.c_size_t(nbytes), device, stream)

    def advise(self, ptr: int, nbytes: int, advice: int, device: int) -> None:
        if self.advise_v2 is not None:
            self._call("cuMemAdvise_v2", Ptr(ptr), ctypes.c_size_t(nbytes), advice,
                       location(device))
        else:
            self._call("cuMemAdvise", Ptr(ptr), ctypes.c_size_t(nbytes), advice, device)

    def discard(self, ranges: Sequence[tuple[int, int]], stream: ctypes.c_void_p) -> None:
        ptrs, sizes = _arrays(ranges)
        self._call("cuMemDiscardBatchAsync", ptrs, sizes, ctypes.c_size_t(len(ranges)),
                   ctypes.c_ulonglong(0), stream)

    def discard_and_prefetch(self, ranges: Sequence[tuple[int, int]], device: int,
                             stream: ctypes.c_void_p) -> None:
        """Drop the contents and populate fresh pages at ``device`` (nothing is copied)."""
        ptrs, sizes = _arrays(ranges)
        where, first = location(device), ctypes.c_size_t(0)
        self._call("cuMemDiscardAndPrefetchBatchAsync", ptrs, sizes,
                   ctypes.c_size_t(len(ranges)), ctypes.byref(where), ctypes.byref(first),
                   ctypes.c_size_t(1), ctypes.c_ulonglong(0), stream)


def _arrays(ranges: Sequence[tuple[int, int]]) -> tuple[ctypes.Array[Ptr],
                                                        ctypes.Array[ctypes.c_size_t]]:
    ptrs = (Ptr * len(ranges))(*(ptr for ptr, _ in ranges))
    sizes = (ctypes.c_size_t * len(ranges))(*(size for _, size in ranges))
    return ptrs, sizes
