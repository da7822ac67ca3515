"""The CUDA driver calls the GPU probes make, over ctypes on ``libcuda.so.1``: no PyTorch, no
shim, so what they measure is the driver alone. The same code runs against the tests' fake
driver (``tests/shim/fake_cuda.c``, put first on ``LD_LIBRARY_PATH``), which is how the probes
are checked on a machine without a GPU.

A failed call raises ``DriverError`` naming the call and its CUresult.
"""

from __future__ import annotations

import ctypes
import time
from typing import Any

CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102
CU_MEMHOSTREGISTER_PORTABLE = 1
CU_STREAM_NON_BLOCKING = 1
CU_MEM_ATTACH_GLOBAL = 1
CU_DEVICE_CPU = -1
CU_MEM_LOCATION_TYPE_HOST = 2
CU_EVENT_DISABLE_TIMING = 2
CUDA_ERROR_OUT_OF_MEMORY = 2

Ptr = ctypes.c_uint64  # CUdeviceptr
Stream = ctypes.c_void_p
Event = ctypes.c_void_p


class DriverError(RuntimeError):
    def __init__(self, call: str, result: int) -> None:
        super().__init__(f"{call} failed with CUresult {result}")
        self.call, self.result = call, result


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocationProp(ctypes.Structure):
    """CUmemAllocationProp."""

    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                ("location", _Location), ("win32HandleMetaData", ctypes.c_void_p),
                ("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


class Driver:
    """One primary context on one device, current on whichever thread calls ``bind``."""

    def __init__(self, ordinal: int = 0, library: str = "libcuda.so.1") -> None:
        self.lib = ctypes.CDLL(library)
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
        self._prop = _AllocationProp()
        self._prop.type = CU_MEM_ALLOCATION_TYPE_PINNED
        self._prop.location = _Location(CU_MEM_LOCATION_TYPE_DEVICE, self.device)
        self._access = _AccessDesc(_Location(CU_MEM_LOCATION_TYPE_DEVICE, self.device),
                                   CU_MEM_ACCESS_FLAGS_PROT_READWRITE)

    def _call(self, name: str, *args: Any) -> None:
        result = getattr(self.lib, name)(*args)
        if result != 0:
            raise DriverError(name, result)

    def bind(self) -> None:
        self._call("cuCtxSetCurrent", self.context)

    # ---- the device ----
    def name(self) -> str:
        buffer = ctypes.create_string_buffer(256)
        function = getattr(self.lib, "cuDeviceGetName", None)
        if function is None or function(buffer, 256, self.device) != 0:
            return "unknown GPU"
        return buffer.value.decode(errors="replace")

    def vmm_supported(self) -> bool:
        value = ctypes.c_int(0)
        self._call("cuDeviceGetAttribute", ctypes.byref(value),
                   CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, self.device)
        return bool(value.value)

    def mem_info(self) -> tuple[int, int]:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self._call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value

    # ---- plain memory ----
    def alloc_device(self, nbytes: int) -> int:
        ptr = Ptr()
        self._call("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(nbytes))
        return ptr.value

    def free(self, ptr: int) -> None:
        self._call("cuMemFree_v2", Ptr(ptr))

    def alloc_managed(self, nbytes: int) -> int:
        ptr = Ptr()
        self._call("cuMemAllocManaged", ctypes.byref(ptr), ctypes.c_size_t(nbytes),
                   CU_MEM_ATTACH_GLOBAL)
        return ptr.value

    def prefetch(self, ptr: int, nbytes: int, device: int, stream: Stream) -> None:
        """CUDA 12.2's _v2 (a location) where the driver has it, else the first form."""
        if getattr(self.lib, "cuMemPrefetchAsync_v2", None) is not None:
            where = (_Location(CU_MEM_LOCATION_TYPE_HOST, 0) if device == CU_DEVICE_CPU
                     else _Location(CU_MEM_LOCATION_TYPE_DEVICE, device))
            self._call("cuMemPrefetchAsync_v2", Ptr(ptr), ctypes.c_size_t(nbytes), where,
                       ctypes.c_uint(0), stream)
        else:
            self._call("cuMemPrefetchAsync", Ptr(ptr), ctypes.c_size_t(nbytes), device, stream)

    def alloc_pinned(self, nbytes: int) -> int:
        host = ctypes.c_void_p()
        self._call("cuMemAllocHost_v2", ctypes.byref(host), ctypes.c_size_t(nbytes))
        return host.value or 0

    def free_pinned(self, host: int) -> None:
        self._call("cuMemFreeHost", ctypes.c_void_p(host))

    def register(self, host: int, nbytes: int) -> None:
        self._call("cuMemHostRegister_v2", ctypes.c_void_p(host), ctypes.c_size_t(nbytes),
                   CU_MEMHOSTREGISTER_PORTABLE)

    def unregister(self, host: int) -> None:
        self._call("cuMemHostUnregister", ctypes.c_void_p(host))

    # ---- streams, events, copies ----
    def stream(self) -> Stream:
        stream = Stream()
        self._call("cuStreamCreate", ctypes.byref(stream), CU_STREAM_NON_BLOCKING)
        return stream

    def sync(self, stream: Stream) -> None:
        self._call("cuStreamSynchronize", stream)

    def event(self) -> Event:
        event = Event()
        self._call("cuEventCreate", ctypes.byref(event), CU_EVENT_DISABLE_TIMING)
        return event

    def record(self, event: Event, stream: Stream) -> None:
        self._call("cuEventRecord", event, stream)

    def wait_event(self, event: Event) -> None:
        self._call("cuEventSynchronize", event)

    def destroy_event(self, event: Event) -> None:
        self._call("cuEventDestroy_v2", event)

    def to_host(self, host: int, ptr: int, nbytes: int, stream: Stream) -> None:
        self._call("cuMemcpyDtoHAsync_v2", ctypes.c_void_p(host), Ptr(ptr),
                   ctypes.c_size_t(nbytes), stream)

    def to_device(self, ptr: int, host: int, nbytes: int, stream: Stream) -> None:
        self._call("cuMemcpyHtoDAsync_v2", Ptr(ptr), ctypes.c_void_p(host),
                   ctypes.c_size_t(nbytes), stream)

    def read_word(self, ptr: int) -> int:
        word = ctypes.c_uint32()
        self._call("cuMemcpyDtoH_v2", ctypes.byref(word), Ptr(ptr), ctypes.c_size_t(4))
        return word.value

    def memset32(self, ptr: int, value: int, count: int, stream: Stream) -> None:
        self._call("cuMemsetD32Async", Ptr(ptr), ctypes.c_uint(value), ctypes.c_size_t(count),
                   stream)

    # ---- virtual memory management ----
    def granularity(self) -> int:
        size = ctypes.c_size_t()
        self._call("cuMemGetAllocationGranularity", ctypes.byref(size), ctypes.byref(self._prop),
                   0)
        return size.value

    def reserve(self, nbytes: int, alignment: int = 0) -> int:
        ptr = Ptr()
        self._call("cuMemAddressReserve", ctypes.byref(ptr), ctypes.c_size_t(nbytes),
                   ctypes.c_size_t(alignment), Ptr(0), ctypes.c_uint64(0))
        return ptr.value

    def free_reservation(self, ptr: int, nbytes: int) -> None:
        self._call("cuMemAddressFree", Ptr(ptr), ctypes.c_size_t(nbytes))

    def create(self, nbytes: int) -> int:
        handle = ctypes.c_uint64()
        self._call("cuMemCreate", ctypes.byref(handle), ctypes.c_size_t(nbytes),
                   ctypes.byref(self._prop), ctypes.c_uint64(0))
        return handle.value

    def release(self, handle: int) -> None:
        self._call("cuMemRelease", ctypes.c_uint64(handle))

    def map(self, ptr: int, nbytes: int, handle: int) -> None:
        self._call("cuMemMap", Ptr(ptr), ctypes.c_size_t(nbytes), ctypes.c_size_t(0),
                   ctypes.c_uint64(handle), ctypes.c_uint64(0))

    def unmap(self, ptr: int, nbytes: int) -> None:
        self._call("cuMemUnmap", Ptr(ptr), ctypes.c_size_t(nbytes))

    def set_access(self, ptr: int, nbytes: int) -> None:
        self._call("cuMemSetAccess", Ptr(ptr), ctypes.c_size_t(nbytes),
                   ctypes.byref(self._access), ctypes.c_size_t(1))

    def back(self, ptr: int, nbytes: int) -> None:
        """Physical memory at ptr: created, mapped, accessible; the mapping keeps the handle."""
        handle = self.create(nbytes)
        try:
            self.map(ptr, nbytes, handle)
        finally:
            self.release(handle)
        self.set_access(ptr, nbytes)


class Nvml:
    """NVML's used memory of the GPU, where pynvml and a driver are present; None elsewhere
    (the fake driver has no NVML: the probe then says so)."""

    def __init__(self, index: int = 0) -> None:
        self._handle: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._pynvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:  # no pynvml, no library, no device: no figure, said in the report
            self._handle = None

    @property
    def present(self) -> bool:
        return self._handle is not None

    def used(self) -> int | None:
        if self._handle is None:
            return None
        return int(self._pynvml.nvmlDeviceGetMemoryInfo(self._handle).used)


def seconds_of(action: Any) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started
