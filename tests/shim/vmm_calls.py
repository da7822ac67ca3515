"""The CUDA driver's virtual memory management API (and the calls around it) over ctypes, as
the fake driver's tests call it; and, run as a program, a process that evaluates the tests'
expressions against one libcuda.

    python vmm_calls.py path/to/libcuda.so.1

reads one JSON request per line on stdin, ``{"id": 1, "expr": "v.reserve(4 * MiB)"}``,
evaluates it with ``v`` (a ``Calls`` over that library) in scope, and answers one JSON line,
``{"id": 1, "result": ...}`` or ``{"id": 1, "error": "..."}``. Each test gets a process of its
own, so the fake's counts start at zero, and a sanitized build of the fake can be loaded (after
the sanitizer's runtime, in LD_PRELOAD).

Methods named ``*_result`` return the CUresult; the others return what the call produced and
raise ``CudaError`` on a failure.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

MiB = 1 << 20
GiB = 1 << 30
c_u64 = ctypes.c_uint64
c_size = ctypes.c_size_t
c_ptr = ctypes.c_void_p

CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_ACCESS_FLAGS_PROT_NONE = 0
CU_MEM_ACCESS_FLAGS_PROT_READ = 1
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102
#: The fake driver's two kernels (tests/shim/fake_cuda.c).
FAKE_KERNEL_FILL = 0xF111
FAKE_KERNEL_COPY = 0xF222

INVALID_VALUE = 1
OUT_OF_MEMORY = 2
INVALID_DEVICE = 101
NOT_FOUND = 500
ILLEGAL_ADDRESS = 700
HOST_MEMORY_ALREADY_REGISTERED = 712
HOST_MEMORY_NOT_REGISTERED = 713
NOT_SUPPORTED = 801


#: CUpointer_attribute: name -> (number, the ctypes type the driver writes it as).
POINTER_ATTRIBUTES: dict[str, tuple[int, Any]] = {
    "CONTEXT": (1, c_ptr), "MEMORY_TYPE": (2, ctypes.c_uint),
    "DEVICE_POINTER": (3, c_u64), "HOST_POINTER": (4, c_ptr), "SYNC_MEMOPS": (6, ctypes.c_bool),
    "BUFFER_ID": (7, c_u64), "IS_MANAGED": (8, ctypes.c_bool), "DEVICE_ORDINAL": (9, ctypes.c_int),
    "IS_LEGACY_CUDA_IPC_CAPABLE": (10, ctypes.c_bool), "RANGE_START_ADDR": (11, c_u64),
    "RANGE_SIZE": (12, c_size), "MAPPED": (13, ctypes.c_bool),
    "ALLOWED_HANDLE_TYPES": (14, ctypes.c_uint), "IS_GPU_DIRECT_RDMA_CAPABLE": (15, ctypes.c_uint),
    "ACCESS_FLAGS": (16, ctypes.c_uint), "MEMPOOL_HANDLE": (17, c_ptr),
    "MAPPING_SIZE": (18, c_size), "MAPPING_BASE_ADDR": (19, c_u64),
    "MEMORY_BLOCK_ID": (20, c_u64),
}


class EntryPoints:
    """Some of one libcuda's entry points, typed on first use."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib

    def _fn(self, name: str, *argtypes: Any) -> Any:
        function = getattr(self.lib, name)
        function.restype = ctypes.c_int
        function.argtypes = list(argtypes)
        return function


class PointerQueries(EntryPoints):
    """cuPointerGetAttribute(s), cuPointerSetAttribute and cuMemGetAddressRange_v2, each
    returning [CUresult, answer]."""

    def attribute(self, ptr: int, name: str) -> list[Any]:
        number, kind = POINTER_ATTRIBUTES[name]
        value = kind()
        fn = self._fn("cuPointerGetAttribute", c_ptr, ctypes.c_int, c_u64)
        code = int(fn(ctypes.byref(value), number, ptr))
        return [code, value.value if code == 0 else None]

    def attributes(self, ptr: int, names: list[str]) -> list[Any]:
        """[CUresult, {name: value}] of one cuPointerGetAttributes call."""
        values = [POINTER_ATTRIBUTES[n][1]() for n in names]
        numbers = (ctypes.c_int * len(names))(*[POINTER_ATTRIBUTES[n][0] for n in names])
        data = (c_ptr * len(names))(*[ctypes.cast(ctypes.byref(v), c_ptr) for v in values])
        fn = self._fn("cuPointerGetAttributes", ctypes.c_uint, c_ptr, c_ptr, c_u64)
        code = int(fn(len(names), numbers, data, ptr))
        return [code, {n: v.value for n, v in zip(names, values, strict=True)}]

    def sync_memops(self, ptr: int, on: bool = True) -> int:
        value = ctypes.c_uint(int(on))
        fn = self._fn("cuPointerSetAttribute", c_ptr, ctypes.c_int, c_u64)
        return int(fn(ctypes.byref(value), POINTER_ATTRIBUTES["SYNC_MEMOPS"][0], ptr))

    def dma_buf(self, ptr: int, size: int) -> int:
        """cuMemGetHandleForAddressRange's CUresult for a dma-buf of [ptr, ptr + size) (its file
        descriptor closed at once)."""
        fd = ctypes.c_int(-1)
        fn = self._fn("cuMemGetHandleForAddressRange", c_ptr, c_u64, c_size, ctypes.c_int,
                      ctypes.c_ulonglong)
        code = int(fn(ctypes.byref(fd), ptr, size, 1, 0))
        if code == 0:
            os.close(fd.value)
        return code

    def address_range(self, ptr: int) -> list[Any]:
        """[CUresult, base, size]."""
        base, size = c_u64(), c_size()
        fn = self._fn("cuMemGetAddressRange_v2", ctypes.POINTER(c_u64), ctypes.POINTER(c_size),
                      c_u64)
        code = int(fn(ctypes.byref(base), ctypes.byref(size), ptr))
        return [code, base.value, size.value]


def take_fd(pid: int, fd: int) -> int:
    """A duplicate of another process's file descriptor (pidfd_getfd, as an importer takes an
    exported handle)."""
    pidfd = os.pidfd_open(pid)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        taken = libc.syscall(438, pidfd, fd, 0)  # SYS_pidfd_getfd
        if taken < 0:
            raise OSError(ctypes.get_errno(), "pidfd_getfd")
        return int(taken)
    finally:
        os.close(pidfd)


class LegacyIpc(EntryPoints):
    """cuIpcGetMemHandle, cuIpcOpenMemHandle(_v2) and cuIpcCloseMemHandle, the handle as hex."""

    def get(self, ptr: int) -> list[Any]:
        """[CUresult, the 64-byte handle in hex]."""
        handle = ctypes.create_string_buffer(64)
        code = int(self._fn("cuIpcGetMemHandle", c_ptr, c_u64)(handle, ptr))
        return [code, handle.raw.hex()]

    def open(self, handle: str, name: str = "cuIpcOpenMemHandle_v2") -> list[int]:
        """[CUresult, the address it opened at]."""
        ptr = c_u64()
        fn = self._fn(name, ctypes.POINTER(c_u64), IpcHandle, ctypes.c_uint)
        code = int(fn(ctypes.byref(ptr), IpcHandle.from_buffer_copy(bytes.fromhex(handle)), 1))
        return [code, ptr.value]

    def close(self, ptr: int) -> int:
        return int(self._fn("cuIpcCloseMemHandle", c_u64)(ptr))


class IpcHandle(ctypes.Structure):
    """CUipcMemHandle, passed by value."""

    _fields_ = [("reserved", ctypes.c_char * 64)]


class CudaError(RuntimeError):
    def __init__(self, call: str, code: int) -> None:
        super().__init__(f"{call} failed with CUresult {code}")
        self.code = code


class Location(ctypes.Structure):
    """CUmemLocation."""

    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AllocationProp(ctypes.Structure):
    """CUmemAllocationProp (CUDA 10.2 to 13)."""

    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                ("location", Location), ("win32HandleMetaData", c_ptr),
                ("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class AccessDesc(ctypes.Structure):
    """CUmemAccessDesc."""

    _fields_ = [("location", Location), ("flags", ctypes.c_int)]


def pinned_on(device: int = 0, handle_types: int = 0) -> AllocationProp:
    """The properties of device memory as cuMemCreate is asked for it."""
    prop = AllocationProp()
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location = Location(CU_MEM_LOCATION_TYPE_DEVICE, device)
    prop.requestedHandleTypes = handle_types
    return prop


class Calls:
    """One libcuda, called the way the shim will call the real one."""

    def __init__(self, path: str) -> None:
        self.lib = ctypes.CDLL(path)
        self._last_handle = 0
        self.pointer = PointerQueries(self.lib)
        self.ipc = LegacyIpc(self.lib)
        self._kept: list[mmap.mmap] = []

    def _fn(self, name: str, *argtypes: Any, restype: Any = ctypes.c_int) -> Any:
        function = getattr(self.lib, name)
        function.restype = restype
        function.argtypes = list(argtypes)
        return function

    def _check(self, name: str, code: int) -> None:
        if code:
            raise CudaError(name, code)

    # ---- the card ----
    def attribute(self, attribute: int, device: int = 0) -> int:
        value = ctypes.c_int(-1)
        fn = self._fn("cuDeviceGetAttribute", ctypes.POINTER(ctypes.c_int), ctypes.c_int,
                      ctypes.c_int)
        self._check("cuDeviceGetAttribute", fn(ctypes.byref(value), attribute, device))
        return value.value

    def vmm_supported(self) -> bool:
        return bool(self.attribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED))

    def mem_info(self) -> list[int]:
        free, total = c_size(), c_size()
        fn = self._fn("cuMemGetInfo_v2", ctypes.POINTER(c_size), ctypes.POINTER(c_size))
        self._check("cuMemGetInfo_v2", fn(ctypes.byref(free), ctypes.byref(total)))
        return [free.value, total.value]

    def free_bytes(self) -> int:
        return self.mem_info()[0]

    def physical_used(self) -> int:
        """The fake's own count of the card's used bytes (every process's, with
        FAKE_CUDA_DEVICE), as NVML would say it."""
        return int(self._fn("fake_cuda_physical_used", restype=c_u64)())

    def process_used(self) -> int:
        return int(self._fn("fake_cuda_process_used", restype=c_u64)())

    # ---- the virtual memory management API ----
    def granularity_result(self, prop: AllocationProp | None = None, option: int = 0) -> int:
        size = c_size()
        fn = self._fn("cuMemGetAllocationGranularity", ctypes.POINTER(c_size),
                      ctypes.POINTER(AllocationProp), ctypes.c_int)
        return int(fn(ctypes.byref(size), ctypes.byref(prop or pinned_on()), option))

    def granularity(self, option: int = 0) -> int:
        size = c_size()
        fn = self._fn("cuMemGetAllocationGranularity", ctypes.POINTER(c_size),
                      ctypes.POINTER(AllocationProp), ctypes.c_int)
        self._check("cuMemGetAllocationGranularity",
                    fn(ctypes.byref(size), ctypes.byref(pinned_on()), option))
        return size.value

    def reserve_result(self, size: int, alignment: int = 0, hint: int = 0,
                       flags: int = 0) -> int:
        return self._reserve(size, alignment, hint, flags)[0]

    def reserve(self, size: int, alignment: int = 0, hint: int = 0) -> int:
        code, ptr = self._reserve(size, alignment, hint, 0)
        self._check("cuMemAddressReserve", code)
        return ptr

    def _reserve(self, size: int, alignment: int, hint: int, flags: int) -> tuple[int, int]:
        ptr = c_u64()
        fn = self._fn("cuMemAddressReserve", ctypes.POINTER(c_u64), c_size, c_size, c_u64, c_u64)
        return int(fn(ctypes.byref(ptr), size, alignment, hint, flags)), ptr.value

    def free_address(self, ptr: int, size: int) -> int:
        return int(self._fn("cuMemAddressFree", c_u64, c_size)(ptr, size))

    def create_result(self, size: int, device: int = 0, flags: int = 0,
                      prop: bool = True) -> int:
        """The CUresult; a handle made is kept for last_handle()."""
        handle = c_u64()
        fn = self._fn("cuMemCreate", ctypes.POINTER(c_u64), c_size,
                      ctypes.POINTER(AllocationProp), c_u64)
        code = int(fn(ctypes.byref(handle), size,
                      ctypes.byref(pinned_on(device)) if prop else None, flags))
        if code == 0:
            self._last_handle = handle.value
        return code

    def last_handle(self) -> int:
        return self._last_handle

    def create(self, size: int, handle_types: int = 0, rdma: bool = False) -> int:
        handle = c_u64()
        self._check("cuMemCreate", self.create_with(size, handle_types, rdma, handle))
        return handle.value

    def create_with(self, size: int, handle_types: int = 0, rdma: bool = False,
                    handle: Any = None) -> int:
        """cuMemCreate's CUresult, with these handle types and GPUDirect RDMA flag."""
        prop = pinned_on(0, handle_types)
        prop.gpuDirectRDMACapable = int(rdma)
        fn = self._fn("cuMemCreate", ctypes.POINTER(c_u64), c_size,
                      ctypes.POINTER(AllocationProp), c_u64)
        return int(fn(ctypes.byref(handle if handle is not None else c_u64()), size,
                      ctypes.byref(prop), 0))

    def export_fd(self, handle: int) -> list[int]:
        """[CUresult, file descriptor] of cuMemExportToShareableHandle (POSIX file descriptor)."""
        fd = ctypes.c_int(-1)
        fn = self._fn("cuMemExportToShareableHandle", c_ptr, c_u64, ctypes.c_int, c_u64)
        return [int(fn(ctypes.byref(fd), handle, 1, 0)), fd.value]

    def import_fd(self, fd: int) -> list[int]:
        """[CUresult, handle] of cuMemImportFromShareableHandle of a file descriptor."""
        handle = c_u64()
        fn = self._fn("cuMemImportFromShareableHandle", ctypes.POINTER(c_u64), c_ptr, ctypes.c_int)
        return [int(fn(ctypes.byref(handle), fd, 1)), handle.value]

    def release(self, handle: int) -> int:
        return int(self._fn("cuMemRelease", c_u64)(handle))

    def map(self, ptr: int, size: int, handle: int, offset: int = 0, flags: int = 0) -> int:
        return int(self._fn("cuMemMap", c_u64, c_size, c_size, c_u64, c_u64)(
            ptr, size, offset, handle, flags))

    def unmap(self, ptr: int, size: int) -> int:
        return int(self._fn("cuMemUnmap", c_u64, c_size)(ptr, size))

    def set_access(self, ptr: int, size: int, flags: int = CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
                   device: int = 0) -> int:
        desc = AccessDesc(Location(CU_MEM_LOCATION_TYPE_DEVICE, device), flags)
        fn = self._fn("cuMemSetAccess", c_u64, c_size, ctypes.POINTER(AccessDesc), c_size)
        return int(fn(ptr, size, ctypes.byref(desc), 1))

    def get_access(self, ptr: int, device: int = 0) -> list[int]:
        """[CUresult, flags]."""
        flags = c_u64(0xFFFF)
        where = Location(CU_MEM_LOCATION_TYPE_DEVICE, device)
        fn = self._fn("cuMemGetAccess", ctypes.POINTER(c_u64), ctypes.POINTER(Location), c_u64)
        return [int(fn(ctypes.byref(flags), ctypes.byref(where), ptr)), flags.value]

    def properties(self, handle: int) -> dict[str, int]:
        prop = AllocationProp()
        fn = self._fn("cuMemGetAllocationPropertiesFromHandle", ctypes.POINTER(AllocationProp),
                      c_u64)
        self._check("cuMemGetAllocationPropertiesFromHandle", fn(ctypes.byref(prop), handle))
        return {"type": prop.type, "location_type": prop.location.type,
                "device": prop.location.id, "handle_types": prop.requestedHandleTypes}

    def retain(self, ptr: int) -> list[int]:
        """[CUresult, handle]."""
        handle = c_u64()
        fn = self._fn("cuMemRetainAllocationHandle", ctypes.POINTER(c_u64), c_ptr)
        return [int(fn(ctypes.byref(handle), ptr)), handle.value]

    def backed(self, size: int, chunk: int | None = None) -> int:
        """Reserve size bytes and back them, chunk by chunk, with read-write access: the way
        the vmm evictor will back an allocation. Returns the address; the handles are
        released at once (the mappings keep the memory)."""
        chunk = chunk or size
        va = self.reserve(size)
        for offset in range(0, size, chunk):
            handle = self.create(chunk)
            self._check("cuMemMap", self.map(va + offset, chunk, handle))
            self._check("cuMemRelease", self.release(handle))
        self._check("cuMemSetAccess", self.set_access(va, size))
        return va

    # ---- bytes ----
    def _copy(self, call: str, dst: int, src: int, n: int) -> int:
        """Any of the copies: host pointers pass as numbers (unified addressing's way too)."""
        on_stream = "Async" in call
        fn = self._fn(call, c_u64, c_u64, c_size, *([c_ptr] if on_stream else []))
        return int(fn(dst, src, n, *([None] if on_stream else [])))

    def write_result(self, ptr: int, data: bytes, call: str = "cuMemcpyHtoD_v2") -> int:
        buffer = ctypes.create_string_buffer(data, len(data))
        return self._copy(call, ptr, ctypes.addressof(buffer), len(data))

    def write(self, ptr: int, data: bytes, call: str = "cuMemcpyHtoD_v2") -> None:
        self._check(call, self.write_result(ptr, data, call))

    def _read(self, ptr: int, n: int, call: str) -> tuple[int, bytes]:
        buffer = ctypes.create_string_buffer(n)
        return self._copy(call, ctypes.addressof(buffer), ptr, n), buffer.raw

    def read_result(self, ptr: int, n: int, call: str = "cuMemcpyDtoH_v2") -> int:
        return self._read(ptr, n, call)[0]

    def read(self, ptr: int, n: int, call: str = "cuMemcpyDtoH_v2") -> bytes:
        code, data = self._read(ptr, n, call)
        self._check(call, code)
        return data

    def copy_on_device(self, dst: int, src: int, n: int, call: str = "cuMemcpyDtoD_v2") -> int:
        return self._copy(call, dst, src, n)

    def memset8(self, ptr: int, value: int, n: int) -> int:
        return int(self._fn("cuMemsetD8_v2", c_u64, ctypes.c_ubyte, c_size)(ptr, value, n))

    def memset32(self, ptr: int, value: int, count: int) -> int:
        return int(self._fn("cuMemsetD32_v2", c_u64, ctypes.c_uint, c_size)(ptr, value, count))

    def _launch(self, kernel: int, params: list[Any]) -> int:
        array = (c_ptr * len(params))(*[ctypes.cast(ctypes.byref(p), c_ptr) for p in params])
        u = ctypes.c_uint
        fn = self._fn("cuLaunchKernel", c_ptr, u, u, u, u, u, u, u, c_ptr, c_ptr, c_ptr)
        return int(fn(kernel, 1, 1, 1, 1, 1, 1, 0, None, array, None))

    def launch_fill(self, ptr: int, n: int, value: int) -> int:
        """The fake's FILL kernel: writes n bytes of value at ptr."""
        return self._launch(FAKE_KERNEL_FILL, [c_u64(ptr), c_size(n), ctypes.c_ubyte(value)])

    def launch_copy(self, dst: int, src: int, n: int) -> int:
        """The fake's COPY kernel: reads n bytes at src, writes them at dst."""
        return self._launch(FAKE_KERNEL_COPY, [c_u64(dst), c_u64(src), c_size(n)])

    # ---- the other allocations ----
    def alloc(self, size: int) -> int:
        ptr = c_u64()
        self._check("cuMemAlloc_v2", self._fn("cuMemAlloc_v2", ctypes.POINTER(c_u64), c_size)(
            ctypes.byref(ptr), size))
        return ptr.value

    def alloc_managed(self, size: int) -> int:
        ptr = c_u64()
        fn = self._fn("cuMemAllocManaged", ctypes.POINTER(c_u64), c_size, ctypes.c_uint)
        self._check("cuMemAllocManaged", fn(ctypes.byref(ptr), size, 1))
        return ptr.value

    def free(self, ptr: int) -> int:
        return int(self._fn("cuMemFree_v2", c_u64)(ptr))

    def alloc_async(self, size: int, pool: int | None = None, per_thread: bool = False) -> int:
        ptr = c_u64()
        suffix = "_ptsz" if per_thread else ""
        if pool is None:
            fn = self._fn("cuMemAllocAsync" + suffix, ctypes.POINTER(c_u64), c_size, c_ptr)
            code = fn(ctypes.byref(ptr), size, 0x77)
        else:
            fn = self._fn("cuMemAllocFromPoolAsync" + suffix, ctypes.POINTER(c_u64), c_size,
                          c_ptr, c_ptr)
            code = fn(ctypes.byref(ptr), size, pool, 0x77)
        self._check("cuMemAllocAsync", code)
        return ptr.value

    def free_async(self, ptr: int, per_thread: bool = False) -> int:
        name = "cuMemFreeAsync" + ("_ptsz" if per_thread else "")
        return int(self._fn(name, c_u64, c_ptr)(ptr, 0x77))

    def trim(self, pool: int, keep: int = 0) -> int:
        return int(self._fn("cuMemPoolTrimTo", c_ptr, c_size)(pool, keep))

    def synchronize(self, stream: int = 0x77) -> int:
        return int(self._fn("cuStreamSynchronize", c_ptr)(stream))

    # ---- host memory ----
    def alloc_host(self, size: int) -> int:
        host = c_ptr()
        fn = self._fn("cuMemAllocHost_v2", ctypes.POINTER(c_ptr), c_size)
        self._check("cuMemAllocHost_v2", fn(ctypes.byref(host), size))
        return host.value or 0

    def free_host(self, host: int) -> int:
        return int(self._fn("cuMemFreeHost", c_ptr)(host))

    def register(self, host: int, size: int) -> int:
        return int(self._fn("cuMemHostRegister_v2", c_ptr, c_size, ctypes.c_uint)(host, size, 0))

    def unregister(self, host: int) -> int:
        return int(self._fn("cuMemHostUnregister", c_ptr)(host))

    def host_pages(self, size: int) -> int:
        """Anonymous host memory, not pinned (kept until the process ends): its address."""
        pages = mmap.mmap(-1, size)
        self._kept.append(pages)
        return ctypes.addressof(ctypes.c_char.from_buffer(pages))

    def copy_while_pinning(self, log: str, host: int, ptr: int, n: int, pinned: int) -> int:
        """Pins pinned bytes on another thread and, once the fake's log says pinning began,
        queues a copy of n bytes from ptr to host: the copy's CUresult."""
        pages = self.host_pages(pinned)
        before = Path(log).read_text().count("\npinning ")
        pinning = threading.Thread(target=self.register, args=(pages, pinned))
        pinning.start()
        while Path(log).read_text().count("\npinning ") == before:  # the fake's word it began
            time.sleep(0.001)
        result = self.copy_on("cuMemcpyDtoHAsync_v2", host, ptr, n, 0x81)
        pinning.join()
        return result

    def host_write(self, host: int, data: bytes) -> None:
        ctypes.memmove(host, data, len(data))

    def host_read(self, host: int, n: int) -> bytes:
        return ctypes.string_at(host, n)

    def copy_to_host(self, host: int, ptr: int, n: int) -> int:
        return self._copy("cuMemcpyDtoHAsync_v2", host, ptr, n)

    def copy_from_host(self, ptr: int, host: int, n: int) -> int:
        return self._copy("cuMemcpyHtoDAsync_v2", ptr, host, n)

    # ---- streams, events, graph capture ----
    def copy_on(self, call: str, dst: int, src: int, n: int, stream: int) -> int:
        """An asynchronous copy (cuMemcpyDtoHAsync_v2, ...) on stream: the CUresult."""
        fn = self._fn(call, c_u64, c_u64, c_size, c_ptr)
        return int(fn(dst, src, n, stream))

    def memset_async(self, ptr: int, value: int, n: int, stream: int) -> int:
        fn = self._fn("cuMemsetD8Async", c_u64, ctypes.c_ubyte, c_size, c_ptr)
        return int(fn(ptr, value, n, stream))

    def wait_event(self, stream: int, event: int) -> int:
        return int(self._fn("cuStreamWaitEvent", c_ptr, c_ptr, ctypes.c_uint)(stream, event, 0))

    def event(self) -> int:
        event = c_ptr()
        fn = self._fn("cuEventCreate", ctypes.POINTER(c_ptr), ctypes.c_uint)
        self._check("cuEventCreate", fn(ctypes.byref(event), 0))
        return event.value or 0

    def record_event(self, event: int, stream: int) -> int:
        return int(self._fn("cuEventRecord", c_ptr, c_ptr)(event, stream))

    def query(self, event: int) -> int:
        return int(self._fn("cuEventQuery", c_ptr)(event))

    def event_synchronize(self, event: int) -> int:
        return int(self._fn("cuEventSynchronize", c_ptr)(event))

    def context_synchronize(self) -> int:
        return int(self._fn("cuCtxSynchronize")())

    def begin_capture(self, stream: int, mode: int) -> int:
        return int(self._fn("cuStreamBeginCapture_v2", c_ptr, ctypes.c_int)(stream, mode))

    def end_capture(self, stream: int) -> int:
        graph = c_ptr()
        return int(self._fn("cuStreamEndCapture", c_ptr, ctypes.POINTER(c_ptr))(
            stream, ctypes.byref(graph)))

    def exchange_capture_mode(self, mode: int) -> int:
        """Sets this thread's capture mode; returns the one it had."""
        value = ctypes.c_int(mode)
        self._check("cuThreadExchangeStreamCaptureMode",
                    self._fn("cuThreadExchangeStreamCaptureMode",
                             ctypes.POINTER(ctypes.c_int))(ctypes.byref(value)))
        return value.value

    def on_thread(self, method: str, *args: Any, mode: int | None = None) -> Any:
        """Calls one of these methods on a new thread (in capture mode mode, if given) and
        returns what it returned."""
        result: list[Any] = []

        def run() -> None:
            if mode is not None:
                self.exchange_capture_mode(mode)
            result.append(getattr(self, method)(*args))

        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
        return result[0]

    # ---- many threads at once (the sanitizers' test) ----
    def cycles_on_threads(self, threads: int, rounds: int, size: int = 4 * MiB) -> list[str]:
        """Each thread backs its own range, writes, evicts it to host memory (copy, unmap,
        release), restores it at the same address and reads it back, rounds times; another
        thread reads the card's free memory meanwhile. The failures, if any."""
        failures: list[str] = []
        stop = threading.Event()

        def cycle(index: int) -> None:
            try:
                chunk = size // 2
                va = self.backed(size, chunk)
                data = bytes([index + 1]) * size
                self.write(va, data)
                shadow = ctypes.create_string_buffer(size)
                for _ in range(rounds):
                    self._check("cuMemcpyDtoHAsync_v2",
                                self.copy_to_host(ctypes.addressof(shadow), va, size))
                    self._check("cuMemUnmap", self.unmap(va, size))
                    for offset in range(0, size, chunk):
                        handle = self.create(chunk)
                        self._check("cuMemMap", self.map(va + offset, chunk, handle))
                        self._check("cuMemRelease", self.release(handle))
                    self._check("cuMemSetAccess", self.set_access(va, size))
                    self._check("cuMemcpyHtoDAsync_v2",
                                self.copy_from_host(va, ctypes.addressof(shadow), size))
                if self.read(va, size) != data:
                    failures.append(f"thread {index}: the bytes changed")
                self._check("cuMemUnmap", self.unmap(va, size))
                self._check("cuMemAddressFree", self.free_address(va, size))
            except CudaError as exc:
                failures.append(f"thread {index}: {exc}")

        def watch() -> None:
            while not stop.is_set():
                self.mem_info()

        watcher = threading.Thread(target=watch)
        watcher.start()
        workers = [threading.Thread(target=cycle, args=(i,)) for i in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        stop.set()
        watcher.join()
        return failures


def _answer(request_id: int, **reply: Any) -> None:
    sys.stdout.write(json.dumps({"id": request_id, **reply}) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    scope: dict[str, Any] = {**globals(), "v": Calls(sys.argv[1])}
    _answer(0, result="ready")
    for line in sys.stdin:
        request = json.loads(line)
        try:
            _answer(request["id"], result=eval(request["expr"], scope))  # noqa: S307 - tests only
        except Exception as exc:  # the test reads the failure
            _answer(request["id"], error=f"{type(exc).__name__}: {exc}")
