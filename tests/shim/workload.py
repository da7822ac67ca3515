"""The process under test: a Python that has the shim preloaded and drives the fake libcuda.

Started by harness.Workload. It reads one JSON request per line on stdin, evaluates its
expression with ``d`` (a Driver over the fake libcuda) and ``shim`` (kiwi_jupyter.shim.Shim)
in scope, and answers one JSON line on stdout. A request with "background" runs on a thread
of its own and answers when it finishes, so a test can start a GPU call that must block at the
gate and see it finish later.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading
from typing import Any

from vmm_calls import FAKE_KERNEL_FILL, AllocationProp, LegacyIpc, PointerQueries, pinned_on

from kiwi_jupyter.shim import Shim

CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2
c_ptr = ctypes.c_void_p
c_u64 = ctypes.c_uint64


class Driver:
    """Calls into libcuda the ways real runtimes do: dlsym by name, or cuGetProcAddress."""

    def __init__(self, path: str) -> None:
        self.lib = ctypes.CDLL(path)  # dlopen by path, RTLD_LOCAL: only dlsym reaches it
        #: cuPointerGetAttribute(s), cuPointerSetAttribute, cuMemGetAddressRange_v2 (by dlsym)
        self.pointer = PointerQueries(self.lib)
        #: cuIpcGetMemHandle, cuIpcOpenMemHandle(_v2), cuIpcCloseMemHandle (by dlsym)
        self.ipc = LegacyIpc(self.lib)

    # ---- finding entry points ----
    def dlsym(self, name: str, *argtypes: Any) -> Any:
        function = getattr(self.lib, name)  # ctypes looks the name up with dlsym(handle, name)
        function.restype = ctypes.c_int
        function.argtypes = list(argtypes)
        return function

    def proc(self, name: str, *argtypes: Any, version: int = 12000, per_thread: bool = False,
             v2: bool = True) -> Any:
        """An entry point fetched through cuGetProcAddress (v2 by default, as CUDA 12 does)."""
        flags = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM if per_thread else 0
        pfn = c_ptr()
        if v2:
            get = self.dlsym("cuGetProcAddress_v2", ctypes.c_char_p, ctypes.POINTER(c_ptr),
                             ctypes.c_int, c_u64, ctypes.POINTER(ctypes.c_int))
            result = get(name.encode(), ctypes.byref(pfn), version, flags, None)
        else:
            get = self.dlsym("cuGetProcAddress", ctypes.c_char_p, ctypes.POINTER(c_ptr),
                             ctypes.c_int, c_u64)
            result = get(name.encode(), ctypes.byref(pfn), version, flags)
        if result != 0:
            raise LookupError(f"cuGetProcAddress({name}) = {result}")
        return ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)(pfn.value)

    def entry(self, name: str, *argtypes: Any, via: str = "dlsym", **kw: Any) -> Any:
        return self.dlsym(name, *argtypes) if via == "dlsym" else self.proc(
            _base(name), *argtypes, v2=(via == "proc_v2"), **kw)

    # ---- memory ----
    def alloc(self, size: int, via: str = "dlsym") -> int:
        ptr = c_u64()
        fn = self.entry("cuMemAlloc_v2", ctypes.POINTER(c_u64), ctypes.c_size_t, via=via)
        result = fn(ctypes.byref(ptr), size)
        if result != 0:
            raise MemoryError(result)
        return ptr.value

    def alloc_result(self, size: int) -> int:
        ptr = c_u64()
        return int(self.dlsym("cuMemAlloc_v2", ctypes.POINTER(c_u64), ctypes.c_size_t)(
            ctypes.byref(ptr), size))

    def alloc_pitch(self, width: int, height: int, element: int = 4) -> tuple[int, int]:
        ptr, pitch = c_u64(), ctypes.c_size_t()
        fn = self.dlsym("cuMemAllocPitch_v2", ctypes.POINTER(c_u64),
                        ctypes.POINTER(ctypes.c_size_t), ctypes.c_size_t, ctypes.c_size_t,
                        ctypes.c_uint)
        result = fn(ctypes.byref(ptr), ctypes.byref(pitch), width, height, element)
        if result != 0:
            raise MemoryError(result)
        return ptr.value, pitch.value

    def alloc_managed(self, size: int) -> int:
        """Managed memory asked for by the program itself (as a UVM user would)."""
        ptr = c_u64()
        fn = self.dlsym("cuMemAllocManaged", ctypes.POINTER(c_u64), ctypes.c_size_t,
                        ctypes.c_uint)
        result = fn(ctypes.byref(ptr), size, 1)
        if result != 0:
            raise MemoryError(result)
        return ptr.value

    def alloc_async(self, size: int, stream: int = 0x77, name: str = "cuMemAllocAsync") -> int:
        ptr = c_u64()
        fn = self.dlsym(name, ctypes.POINTER(c_u64), ctypes.c_size_t, c_ptr)
        if fn(ctypes.byref(ptr), size, stream) != 0:
            raise MemoryError
        return ptr.value

    def alloc_from_pool(self, size: int, pool: int = 0x99, stream: int = 0x77) -> int:
        ptr = c_u64()
        fn = self.dlsym("cuMemAllocFromPoolAsync", ctypes.POINTER(c_u64), ctypes.c_size_t,
                        c_ptr, c_ptr)
        if fn(ctypes.byref(ptr), size, pool, stream) != 0:
            raise MemoryError
        return ptr.value

    def device_pool(self, name: str = "cuDeviceGetMemPool", device: int = 0) -> int:
        pool = c_ptr()
        if self.dlsym(name, ctypes.POINTER(c_ptr), ctypes.c_int)(ctypes.byref(pool), device):
            raise RuntimeError(name)
        return pool.value or 0

    def alloc_vmm(self, size: int) -> int:
        """A physical handle of the VMM API, as an application's own cuMemCreate makes it."""
        handle = c_u64()
        fn = self.dlsym("cuMemCreate", ctypes.POINTER(c_u64), ctypes.c_size_t,
                        ctypes.POINTER(AllocationProp), c_u64)
        if fn(ctypes.byref(handle), size, ctypes.byref(pinned_on(0)), 0) != 0:
            raise MemoryError
        return handle.value

    def release_vmm(self, handle: int) -> int:
        return int(self.dlsym("cuMemRelease", c_u64)(handle))

    def retain(self, ptr: int) -> int:
        """cuMemRetainAllocationHandle of ptr (as an export or an NCCL registration asks);
        the CUresult."""
        handle = c_u64()
        return int(self.dlsym("cuMemRetainAllocationHandle", ctypes.POINTER(c_u64), c_ptr)(
            ctypes.byref(handle), ptr))

    def pool_attribute(self, pool: int, attribute: int) -> int:
        value = c_u64()
        fn = self.dlsym("cuMemPoolGetAttribute", c_ptr, ctypes.c_int, c_ptr)
        if fn(pool, attribute, ctypes.byref(value)) != 0:
            raise RuntimeError("cuMemPoolGetAttribute")
        return value.value

    def reset_pool_high(self, pool: int, attribute: int) -> int:
        zero = c_u64(0)
        return int(self.dlsym("cuMemPoolSetAttribute", c_ptr, ctypes.c_int, c_ptr)(
            pool, attribute, ctypes.byref(zero)))

    def enable_peer(self, peer: int) -> int:
        return int(self.dlsym("cuCtxEnablePeerAccess", c_ptr, ctypes.c_uint)(peer, 0))

    def free(self, ptr: int) -> int:
        return int(self.dlsym("cuMemFree_v2", c_u64)(ptr))

    def free_async(self, ptr: int, stream: int = 0x77, name: str = "cuMemFreeAsync") -> int:
        return int(self.dlsym(name, c_u64, c_ptr)(ptr, stream))

    def mem_info(self, via: str = "dlsym", **kw: Any) -> tuple[int, int]:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        fn = self.entry("cuMemGetInfo_v2", ctypes.POINTER(ctypes.c_size_t),
                        ctypes.POINTER(ctypes.c_size_t), via=via, **kw)
        if fn(ctypes.byref(free), ctypes.byref(total)) != 0:
            raise RuntimeError
        return free.value, total.value

    # ---- contexts ----
    def set_context(self, ctx: int) -> int:
        return int(self.dlsym("cuCtxSetCurrent", c_ptr)(ctx))

    def destroy_context(self, ctx: int, name: str = "cuCtxDestroy_v2") -> int:
        return int(self.dlsym(name, c_ptr)(ctx))

    def retain_primary(self, device: int = 0) -> int:
        ctx = c_ptr()
        if self.dlsym("cuDevicePrimaryCtxRetain", ctypes.POINTER(c_ptr), ctypes.c_int)(
                ctypes.byref(ctx), device) != 0:
            raise RuntimeError("cuDevicePrimaryCtxRetain")
        self.set_context(ctx.value or 0)
        return ctx.value or 0

    def end_primary(self, name: str, device: int = 0) -> int:
        return int(self.dlsym(name, ctypes.c_int)(device))

    # ---- graph capture ----
    def begin_capture(
        self, stream: int, mode: int = 0, name: str = "cuStreamBeginCapture_v2"
    ) -> int:
        return int(self.dlsym(name, c_ptr, ctypes.c_int)(stream, mode))

    def end_capture(self, stream: int, name: str = "cuStreamEndCapture") -> int:
        graph = c_ptr()
        return int(self.dlsym(name, c_ptr, ctypes.POINTER(c_ptr))(stream, ctypes.byref(graph)))

    def device_total(self, via: str = "dlsym") -> int:
        total = ctypes.c_size_t()
        fn = self.entry("cuDeviceTotalMem_v2", ctypes.POINTER(ctypes.c_size_t), ctypes.c_int,
                        via=via)
        if fn(ctypes.byref(total), 0) != 0:
            raise RuntimeError("cuDeviceTotalMem_v2")
        return total.value

    # ---- work ----
    def launch(self, via: str = "dlsym", per_thread: bool = False, grid: int = 1) -> int:
        name = "cuLaunchKernel_ptsz" if per_thread and via == "dlsym" else "cuLaunchKernel"
        u = ctypes.c_uint
        fn = self.entry(name, c_ptr, u, u, u, u, u, u, u, c_ptr, c_ptr, c_ptr, via=via,
                        **({"per_thread": per_thread} if via != "dlsym" else {}))
        return int(fn(0xF00, grid, 1, 1, 32, 1, 1, 0, None, None, None))

    def launch_ex(self) -> int:
        return int(self.dlsym("cuLaunchKernelEx", c_ptr, c_ptr, c_ptr, c_ptr)(
            0xC0F, 0xF00, None, None))

    def launch_cooperative(self) -> int:
        u = ctypes.c_uint
        fn = self.dlsym("cuLaunchCooperativeKernel", c_ptr, u, u, u, u, u, u, u, c_ptr, c_ptr)
        return int(fn(0xF00, 1, 1, 1, 32, 1, 1, 0, None, None))

    def graph_launch(self) -> int:
        return int(self.dlsym("cuGraphLaunch", c_ptr, c_ptr)(0x6A, None))

    def memset(self, ptr: int, n: int = 16) -> int:
        return int(self.dlsym("cuMemsetD8_v2", c_u64, ctypes.c_ubyte, ctypes.c_size_t)(ptr, 7, n))

    def bare(self, name: str) -> int:
        """Calls an entry point with zeros for arguments: enough to see whether the gate lets
        it through, as the fake driver's recorded work ignores its arguments."""
        return int(self.dlsym(name)(*[c_u64(0)] * 11))

    def copy_to_device(self, ptr: int, n: int = 16) -> int:
        data = ctypes.create_string_buffer(n)
        return int(self.dlsym("cuMemcpyHtoD_v2", c_u64, c_ptr, ctypes.c_size_t)(ptr, data, n))

    # ---- bytes (the fake driver keeps real ones for VMM memory only) ----
    def write(self, ptr: int, data: bytes) -> int:
        buffer = ctypes.create_string_buffer(data, len(data))
        return int(self.dlsym("cuMemcpyHtoD_v2", c_u64, c_ptr, ctypes.c_size_t)(
            ptr, buffer, len(data)))

    def read(self, ptr: int, n: int) -> bytes:
        buffer = ctypes.create_string_buffer(n)
        result = self.dlsym("cuMemcpyDtoH_v2", c_ptr, c_u64, ctypes.c_size_t)(buffer, ptr, n)
        if result != 0:
            raise RuntimeError(f"cuMemcpyDtoH_v2 = {result}")
        return buffer.raw

    def launch_fill(self, ptr: int, n: int, value: int) -> int:
        """The fake driver's FILL kernel (a gated launch that writes n bytes at ptr)."""
        params = [c_u64(ptr), ctypes.c_size_t(n), ctypes.c_ubyte(value)]
        array = (c_ptr * 3)(*[ctypes.cast(ctypes.byref(p), c_ptr) for p in params])
        u = ctypes.c_uint
        fn = self.dlsym("cuLaunchKernel", c_ptr, u, u, u, u, u, u, u, c_ptr, c_ptr, c_ptr)
        return int(fn(FAKE_KERNEL_FILL, 1, 1, 1, 1, 1, 1, 0, None, array, None))


def _base(name: str) -> str:
    for suffix in ("_ptsz", "_ptds", "_v2"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


def mapped_file(function: Any) -> str:
    """The file whose mapping holds this function's code (/proc/self/maps)."""
    address = ctypes.cast(function, c_ptr).value or 0
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end and len(fields) >= 6:
                return os.path.basename(fields[5])
    return ""


def _err(function: Any) -> BaseException | None:
    """The exception function() raises, or None."""
    try:
        function()
    except BaseException as exc:  # the test inspects it
        return exc
    return None


def fork_and_launch() -> dict[str, Any]:
    """Fork; the child launches one kernel (through the shim it inherited) and exits."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        code = d.launch()
        os.write(write_end, json.dumps({"pid": os.getpid(), "launch": code}).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        report = json.loads(pipe.read() or "{}")
    _, status = os.waitpid(pid, 0)
    report["status"] = status
    return report


def on_a_thread(expression: str) -> Any:
    """expression's value, evaluated on a thread of its own (another per-thread default
    stream)."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(eval(expression, globals())))  # noqa: S307
    thread.start()
    thread.join()
    return result[0]


def training_steps(steps: int, sizes: list[int], stream: int = 0x77) -> list[int]:
    """steps steps of a training loop under a stream-ordered allocator (PyTorch's
    cudaMallocAsync backend): each allocates sizes on stream, writes each tensor's first bytes,
    and frees them on stream. The addresses of the last step."""
    pointers: list[int] = []
    for step in range(steps):
        pointers = [d.alloc_async(size, stream=stream) for size in sizes]
        for i, ptr in enumerate(pointers):
            if d.write(ptr, bytes([step & 0xFF, i])) != 0:
                raise RuntimeError(f"writing {ptr:#x} failed")
        for ptr in reversed(pointers):
            if d.free_async(ptr, stream=stream) != 0:
                raise RuntimeError(f"freeing {ptr:#x} failed")
    return pointers


def mapped_in_a_forked_child(addresses: list[int]) -> list[int]:
    """Fork; the child says which of addresses are mapped in it (/proc/self/maps) and exits
    without touching the GPU, as a DataLoader worker does."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        with open("/proc/self/maps") as maps:
            ranges = [tuple(int(end, 16) for end in line.split()[0].split("-")) for line in maps]
        mapped = [a for a in addresses if any(low <= a < high for low, high in ranges)]
        os.write(write_end, json.dumps(mapped).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        mapped = json.loads(pipe.read() or "null")
    os.waitpid(pid, 0)
    return list(mapped)


def launch_from_threads(count: int) -> list[int]:
    """count threads launch at the same moment; the launch results, in thread order."""
    results = [-1] * count
    barrier = threading.Barrier(count)

    def one(i: int) -> None:
        barrier.wait()
        results[i] = d.launch(grid=i + 1)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def launch_storm(threads: int, launches: int) -> list[int]:
    """threads threads each launch launches kernels as fast as they can; the failures."""
    failures: list[int] = []

    def one(i: int) -> None:
        for _ in range(launches):
            code = d.launch(grid=i + 1)
            if code:
                failures.append(code)

    workers = [threading.Thread(target=one, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return failures


def interrupted_launch() -> dict[str, Any]:
    """On the main thread, as a notebook cell does: a launch that waits for the GPU, and a
    Ctrl-C (SIGINT) once it waits. Python's default handler raises KeyboardInterrupt."""
    import signal
    import time

    signal.signal(signal.SIGINT, signal.default_int_handler)
    shim.catch_interrupts()
    sent: list[float] = []

    def interrupt_once_waiting() -> None:
        while shim.stats()["state"] != "waiting":
            time.sleep(0.005)
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_once_waiting, daemon=True).start()
    code = None
    try:
        code = d.launch()
        time.sleep(5)  # the KeyboardInterrupt noted by Python's handler arrives here at once
    except KeyboardInterrupt:
        return {"code": code, "interrupted": True, "seconds": time.monotonic() - sent[0]}
    return {"code": code, "interrupted": False, "seconds": None}


#: churn's allocations: pointer -> size, kept across requests.
LIVE: dict[int, int] = {}
CHURN_SIZES = (1, 100, 512, 4096, 70_000, 600_000, 1 << 20, 3 * (1 << 20) + 5, 8 << 20)


def tag(ptr: int, size: int) -> bytes:
    """What churn writes at both ends of an allocation: its own, so a moved byte shows."""
    import hashlib

    return hashlib.sha256(f"{ptr}:{size}".encode()).digest()[:min(16, size)]


def churn(seed: int, operations: int) -> int:
    """Random allocations of every size (slabs, regions, several chunks) and frees, each new
    one tagged at both ends, none overlapping another; returns how many are live."""
    import random

    rng = random.Random(seed)
    for _ in range(operations):
        if LIVE and rng.random() < 0.4:
            ptr = rng.choice(sorted(LIVE))
            LIVE.pop(ptr)
            if d.free(ptr) != 0:
                raise RuntimeError(f"free of {ptr:#x} failed")
            continue
        size = rng.choice(CHURN_SIZES)
        ptr = d.alloc(size)
        for other, other_size in LIVE.items():
            if ptr < other + other_size and other < ptr + size:
                raise RuntimeError(f"{ptr:#x}+{size} overlaps {other:#x}+{other_size}")
        LIVE[ptr] = size
        mark = tag(ptr, size)
        if d.write(ptr, mark) or d.write(ptr + size - len(mark), mark):
            raise RuntimeError(f"writing {ptr:#x} failed")
    return len(LIVE)


def unchanged() -> list[int]:
    """The live allocations whose tags are not what churn wrote."""
    return [ptr for ptr, size in LIVE.items()
            if d.read(ptr, len(tag(ptr, size))) != tag(ptr, size)
            or d.read(ptr + size - len(tag(ptr, size)), len(tag(ptr, size))) != tag(ptr, size)]


def free_all() -> None:
    while LIVE:
        ptr, _ = LIVE.popitem()
        if d.free(ptr) != 0:
            raise RuntimeError(f"free of {ptr:#x} failed")


_out = threading.Lock()


def _answer(request_id: int, **reply: Any) -> None:
    with _out:
        sys.stdout.write(json.dumps({"id": request_id, **reply}) + "\n")
        sys.stdout.flush()


def _evaluate(request: dict[str, Any], scope: dict[str, Any]) -> None:
    try:
        result = eval(request["expr"], scope)  # noqa: S307 - the test is the only client
        _answer(request["id"], result=result)
    except Exception as exc:  # the test reads the failure
        _answer(request["id"], error=f"{type(exc).__name__}: {exc}")


d = Driver(sys.argv[1])
shim = Shim.attach()

#: The id of the one line the workload writes unasked, once it has started: the harness's
#: deadline for a call starts there, not at the interpreter's start.
READY_ID = 0

if __name__ == "__main__":
    scope = dict(globals())
    _answer(READY_ID, result="ready")
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("background"):
            threading.Thread(target=_evaluate, args=(request, scope), daemon=True).start()
        else:
            _evaluate(request, scope)
