"""The shim on a real GPU, with PyTorch and CuPy: tests that fail when the feature is broken.

Skipped without a GPU (marked ``gpu``; ``make gpu-check`` runs them). Each test proves its claim
from outside the shim's own counters where it can: the driver says a framework's tensor is
managed memory (CU_POINTER_ATTRIBUTE_IS_MANAGED); NVML says an evicted process's memory left
the card. Counters only show that the shim took part (grants and allocations above zero).

Memory is sized so that managed memory never oversubscribes the card: the daemon is told the
GPU is smaller (--gpu-memory) than it is, so two working sets "do not fit" and must be evicted,
while both together would still fit in the real card. So if the eviction did not happen, NVML
would show both working sets on the card at once, and the test fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
GiB = 1 << 30

#: What every worker has: the shim's API, the driver's word on a pointer, NVML's on memory.
PRELUDE = """
import ctypes, json, os, sys, time
from kiwi_jupyter.shim import Shim
shim = Shim.attach()
_driver = ctypes.CDLL("libcuda.so.1")
CU_POINTER_ATTRIBUTE_IS_MANAGED = 8

def is_managed(ptr):
    value = ctypes.c_uint(0)
    result = _driver.cuPointerGetAttribute(ctypes.byref(value), CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                           ctypes.c_uint64(ptr))
    assert result == 0, f"cuPointerGetAttribute: CUDA error {result}"
    return bool(value.value)

def gpu_memory(pid=None):
    '''NVML: the bytes used on GPU 0, in all or by process pid (None where NVML cannot say).'''
    import pynvml
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    if pid is None:
        return pynvml.nvmlDeviceGetMemoryInfo(handle).used
    for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
        if process.pid == pid:
            return process.usedGpuMemory
    return 0

def barrier(name):
    '''Both workers start together: each says it is ready and waits for the other.'''
    directory = os.environ["BARRIER"]
    open(os.path.join(directory, name), "w").close()
    while len(os.listdir(directory)) < 2:
        time.sleep(0.01)

def report(**fields):
    print(json.dumps({**fields, "stats": shim.stats() if shim else None}), flush=True)
"""


#: The evictors that page the process themselves: the eviction tests run under each
#: (``pytest -m gpu -k vmm`` picks the vmm ones).
SELF_PAGING = ["managed", "vmm"]


def environment(shim: Path | None, env: dict[str, str] | None = None) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("KIWI_")}
    # Managed unless a test names another: the conversion tests prove the managed evictor (on
    # an r570+ driver the default, auto, picks another, which converts nothing to managed).
    environ.update({"PYTHONPATH": str(REPO), "KIWI_IDLE_RELEASE": "0", "KIWI_EVICT": "managed"})
    if shim:
        environ["LD_PRELOAD"] = str(shim)
    environ.update(env or {})
    return environ


def last_json(out: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def run_python(code: str, *, shim: Path | None, env: dict[str, str] | None = None,
               timeout: float = 300) -> dict[str, Any]:
    """Run PRELUDE + code in a fresh Python; its last stdout line is JSON."""
    result = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
                            env=environment(shim, env), capture_output=True, text=True,
                            timeout=timeout, check=False)
    assert result.returncode == 0, result.stderr
    return last_json(result.stdout)


def run_together(codes: dict[str, str], *, shim: Path, env: dict[str, str], tmp_path: Path,
                 timeout: float = 600) -> dict[str, dict[str, Any]]:
    """Run workers at once, each PRELUDE + its code, started together (barrier)."""
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    workers = {name: subprocess.Popen(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
        env=environment(shim, {**env, "BARRIER": str(barrier), "WORKER": name}),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name, code in codes.items()}
    # Each waits on the other, so one that dies would leave the other waiting for ever: wait
    # on them all at once, and fail with the first one's error as soon as it exits badly.
    outputs = {name: Drained(worker) for name, worker in workers.items()}
    deadline = time.monotonic() + timeout
    try:
        while any(worker.poll() is None for worker in workers.values()):
            for name, worker in workers.items():
                if worker.poll() not in (None, 0):
                    outputs[name].join(5)
                    raise AssertionError(f"{name} exited {worker.returncode}:\n"
                                         f"{outputs[name].stderr}")
            assert time.monotonic() < deadline, f"workers still running after {timeout} s"
            time.sleep(0.05)
    finally:
        for worker in workers.values():
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    reports = {}
    for name, worker in workers.items():
        outputs[name].join(5)
        assert worker.returncode == 0, f"{name}:\n{outputs[name].stderr}"
        reports[name] = last_json(outputs[name].stdout)
    return reports


class Drained(threading.Thread):
    """Drains a worker's pipes as it runs, so that a full pipe never stalls it."""

    def __init__(self, worker: subprocess.Popen[str]) -> None:
        super().__init__(daemon=True)
        self.worker, self.stdout, self.stderr = worker, "", ""
        self.start()

    def run(self) -> None:
        self.stdout, self.stderr = self.worker.communicate()


def took_part(stats: dict[str, Any]) -> None:
    """The shim gated and counted this process's work."""
    assert stats["grants"] > 0 and stats["allocations"] > 0, stats


@pytest.fixture
def gpu_scheduler(start_daemon):
    return start_daemon("--tq", "0.2", "--gpus", "1", "--gpu-memory", "6GiB", "--grace", "30")


CUPY_MATMUL = """
    import cupy as cp
    rng = cp.random.default_rng(7)
    a = rng.random((2048, 2048), dtype=cp.float32)
    b = rng.random((2048, 2048), dtype=cp.float32)
    c = a @ b
    report(sum=float(c.sum()), row=c[0, :8].tolist(), managed=is_managed(c.data.ptr))
"""


def test_cupy_arrays_are_managed_memory_and_give_the_same_results(shim_library,
                                                                  gpu_scheduler) -> None:
    pytest.importorskip("cupy")
    env = {"KIWI_SOCKET": gpu_scheduler.socket}
    plain = run_python(CUPY_MATMUL, shim=None, env=env)
    shimmed = run_python(CUPY_MATMUL, shim=shim_library, env=env)
    assert shimmed["managed"] and not plain["managed"]
    took_part(shimmed["stats"])
    assert shimmed["row"] == pytest.approx(plain["row"], rel=1e-5)
    assert shimmed["sum"] == pytest.approx(plain["sum"], rel=1e-5)


TORCH_TRAINING = """
    import torch
    torch.manual_seed(0)
    torch.backends.cudnn.deterministic = True
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10)).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(1024, 256, device="cuda")
    y = torch.randint(0, 10, (1024,), device="cuda")
    losses = []
    for _ in range(20):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    report(losses=losses, managed=is_managed(model[0].weight.data_ptr()))
"""


def test_pytorch_tensors_are_managed_memory_and_training_gives_the_same_losses(
        shim_library, gpu_scheduler) -> None:
    pytest.importorskip("torch")
    env = {"KIWI_SOCKET": gpu_scheduler.socket}
    plain = run_python(TORCH_TRAINING, shim=None, env=env)
    shimmed = run_python(TORCH_TRAINING, shim=shim_library, env=env)
    assert shimmed["managed"] and not plain["managed"]
    took_part(shimmed["stats"])
    assert shimmed["losses"] == pytest.approx(plain["losses"], rel=1e-4)


TAKE_TURNS = """
    import torch
    value = {"a": 0.0, "b": 1000.0}[os.environ["WORKER"]]
    n = int(os.environ["WORKING_SET"]) // 4
    shim.cell_begin()
    x = torch.full((n,), value, device="cuda")
    torch.cuda.synchronize()
    managed = is_managed(x.data_ptr())
    shim.release()
    barrier(os.environ["WORKER"])
    correct, in_cell = True, []
    for i in range(int(os.environ["ROUNDS"])):
        shim.cell_begin()
        x.add_(1.0)
        correct &= bool((x[:: 1 << 20] == value + i + 1).all().item())
        torch.cuda.synchronize()
        in_cell.append(gpu_memory())  # while this one holds: the other's set must be out
        shim.release()
    report(correct=correct, managed=managed, in_cell=in_cell, pid=os.getpid())
"""


def converted(report: dict[str, Any], evictor: str) -> bool:
    """The shim ran the evictor asked for, and the tensor is its memory: managed memory by the
    driver's word under managed, device memory (the vmm evictor's mapping) under vmm."""
    return report["stats"]["evict"] == evictor and report["managed"] == (evictor == "managed")


@pytest.mark.parametrize("evictor", SELF_PAGING)
@pytest.mark.parametrize("backend", ["native", "cudaMallocAsync"])
def test_an_evicted_process_leaves_the_card_to_the_holder(shim_library, gpu_scheduler,
                                                          tmp_path: Path, backend: str,
                                                          evictor: str) -> None:
    """Two 4 GiB working sets that the daemon is told do not fit together (6 GiB): each takes
    turns, and whenever one holds, NVML must show only one working set on the card."""
    pytest.importorskip("torch")
    pytest.importorskip("pynvml")
    working_set = 4 * GiB
    idle = run_python("report(used=gpu_memory())", shim=None)["used"]
    env = {"KIWI_SOCKET": gpu_scheduler.socket, "KIWI_GPU_MEMORY_LIMIT": "6GiB",
           "WORKING_SET": str(working_set), "ROUNDS": "6", "KIWI_EVICT": evictor,
           "PYTORCH_CUDA_ALLOC_CONF": f"backend:{backend}"}
    reports = run_together({"a": TAKE_TURNS, "b": TAKE_TURNS}, shim=shim_library,
                           env=env, tmp_path=tmp_path)
    for name, report in reports.items():
        assert report["correct"] and converted(report, evictor), (name, report)
        took_part(report["stats"])
        assert report["stats"]["evictions"] >= 1 and report["stats"]["restores"] >= 1
        # Both sets on the card at once would be 8 GiB over idle; one set and two contexts
        # stay well under 6.
        assert max(report["in_cell"]) - idle < working_set + 2 * GiB, (name, report)


def test_the_checkpoint_evictor_leaves_the_card_to_the_holder(shim_library, gpu_scheduler,
                                                              tmp_path: Path) -> None:
    """The same turns under the evictor ``auto`` picks on an r570+ driver: nothing converted,
    the daemon checkpoints the one that leaves, and NVML shows one working set at a time."""
    pytest.importorskip("torch")
    pytest.importorskip("pynvml")
    working_set = 4 * GiB
    idle = run_python("report(used=gpu_memory())", shim=None)["used"]
    env = {"KIWI_SOCKET": gpu_scheduler.socket, "KIWI_GPU_MEMORY_LIMIT": "6GiB",
           "WORKING_SET": str(working_set), "ROUNDS": "4", "KIWI_EVICT": "checkpoint"}
    reports = run_together({"a": TAKE_TURNS, "b": TAKE_TURNS}, shim=shim_library,
                           env=env, tmp_path=tmp_path)
    used = {report["stats"]["evict"] for report in reports.values()}
    if used != {"checkpoint"}:
        pytest.skip(f"the daemon cannot checkpoint here (the shim used {used}); its log says why")
    for name, report in reports.items():
        assert report["correct"] and not report["managed"], (name, report)
        took_part(report["stats"])
        assert max(report["in_cell"]) - idle < working_set + 2 * GiB, (name, report)


@pytest.mark.parametrize("evictor", SELF_PAGING)
def test_an_evicted_process_keeps_only_its_context_on_the_card(shim_library, gpu_scheduler,
                                                               tmp_path: Path,
                                                               evictor: str) -> None:
    """NVML's own view of the evicted process: about its context, not its working set."""
    pytest.importorskip("torch")
    pytest.importorskip("pynvml")
    holder = """
        import torch
        from nodeside.client import Client
        shim.cell_begin()
        x = torch.ones(int(os.environ["WORKING_SET"]) // 4, device="cuda")
        torch.cuda.synchronize()
        barrier("holder")
        def next_waits():  # with its working set known, so that it needs the room
            with Client(os.environ["KIWI_SOCKET"], register=False) as admin:
                return any(c["state"] == "waiting" and (c["working_set"] or 0) > 0
                           for c in admin.status()["clients"])
        while not next_waits():
            time.sleep(0.01)
        shim.release()  # the daemon asks for the room: evicted before the next is granted
        while not os.path.exists(os.environ["BARRIER"] + "/../next-holds"):
            time.sleep(0.01)
        report(pid=os.getpid())
    """
    next_one = """
        import torch
        barrier("next")
        shim.cell_begin()
        y = torch.ones(int(os.environ["WORKING_SET"]) // 4, device="cuda")
        torch.cuda.synchronize()
        import pynvml
        pynvml.nvmlInit()
        others = [p for p in pynvml.nvmlDeviceGetComputeRunningProcesses(
            pynvml.nvmlDeviceGetHandleByIndex(0)) if p.pid != os.getpid()]
        open(os.environ["BARRIER"] + "/../next-holds", "w").close()
        shim.release()
        report(others=[(p.pid, p.usedGpuMemory) for p in others])
    """
    env = {"KIWI_SOCKET": gpu_scheduler.socket, "KIWI_GPU_MEMORY_LIMIT": "6GiB",
           "WORKING_SET": str(4 * GiB), "KIWI_EVICT": evictor}
    reports = run_together({"holder": holder, "next": next_one}, shim=shim_library, env=env,
                           tmp_path=tmp_path)
    assert reports["holder"]["stats"]["evict"] == evictor
    holder_pid = reports["holder"]["pid"]
    used = dict(tuple(pair) for pair in reports["next"]["others"]).get(holder_pid)
    assert reports["holder"]["stats"]["evictions"] == 1
    if used is None:
        pytest.skip("NVML does not list per-process memory here (MIG, or a container)")
    assert used < 1 * GiB, f"the evicted process still has {used / GiB:.2f} GiB on the card"


CAPTURE_LOOP = """
    import torch
    barrier(os.environ["WORKER"])
    static_in = torch.randn(512, 512, device="cuda")
    weight = torch.randn(512, 512, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            out = static_in @ weight
    torch.cuda.current_stream().wait_stream(side)
    failures, worst, deadline = [], 0.0, time.monotonic() + float(os.environ["SECONDS"])
    while time.monotonic() < deadline:
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):  # global capture mode, PyTorch's default
                out = static_in
                for _ in range(200):
                    out = torch.tanh(out @ weight)
            graph.replay()
            expected = static_in
            for _ in range(200):
                expected = torch.tanh(expected @ weight)
            worst = max(worst, float((out - expected).abs().max()))
        except RuntimeError as exc:
            failures.append(str(exc)[:200])
    report(failures=failures, worst=worst)
"""

CONTEND = """
    import torch
    barrier(os.environ["WORKER"])
    a = torch.randn(2048, 2048, device="cuda")
    deadline = time.monotonic() + float(os.environ["SECONDS"])
    while time.monotonic() < deadline:
        a = torch.tanh(a @ a)
        torch.cuda.synchronize()
    report()
"""


def test_graph_capture_under_a_50ms_quantum_never_fails(shim_library, start_daemon,
                                                        tmp_path: Path) -> None:
    """Drops arrive every 50 ms while captures are open: synchronizing then would invalidate
    them; the shim defers the release until the capture ends."""
    pytest.importorskip("torch")
    scheduler = start_daemon("--tq", "0.05", "--gpus", "1", "--grace", "30")
    env = {"KIWI_SOCKET": scheduler.socket, "SECONDS": "10"}
    reports = run_together({"capture": CAPTURE_LOOP, "contend": CONTEND}, shim=shim_library,
                           env=env, tmp_path=tmp_path)
    capture = reports["capture"]
    assert capture["failures"] == []
    assert capture["worst"] < 1e-2
    took_part(capture["stats"])
    assert capture["stats"]["drops"] > 0  # the quantum really ended during the run


CUDA_GRAPH = """
    import torch
    static_in = torch.randn(1024, 1024, device="cuda")
    weight = torch.randn(1024, 1024, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            static_out = static_in @ weight + 1
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = static_in @ weight + 1
    worst = 0.0
    for _ in range(5):
        static_in.copy_(torch.randn(1024, 1024, device="cuda"))
        graph.replay()
        expected = static_in @ weight + 1
        worst = max(worst, float((static_out - expected).abs().max()))
    report(worst=worst, backend=torch.cuda.get_allocator_backend(),
           managed=is_managed(weight.data_ptr()))
"""


@pytest.mark.parametrize("evictor", SELF_PAGING)
@pytest.mark.parametrize("backend", ["native", "cudaMallocAsync"])
def test_cuda_graphs_replay_correctly_under_each_pytorch_allocator(shim_library, gpu_scheduler,
                                                                   backend: str,
                                                                   evictor: str) -> None:
    pytest.importorskip("torch")
    report = run_python(CUDA_GRAPH, shim=shim_library,
                        env={"KIWI_SOCKET": gpu_scheduler.socket, "KIWI_EVICT": evictor,
                             "PYTORCH_CUDA_ALLOC_CONF": f"backend:{backend}"})
    assert report["backend"] == backend and converted(report, evictor)
    took_part(report["stats"])
    assert report["worst"] < 1e-2


def test_the_cudamallocasync_backend_gets_managed_pool_memory_and_true_pool_figures(
        shim_library, gpu_scheduler) -> None:
    """Its tensors are managed (pageable), and the pool PyTorch reads its figures from is the
    one they come from: reserved memory covers them."""
    pytest.importorskip("torch")
    report = run_python("""
        import torch
        x = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        x.fill_(1)
        torch.cuda.synchronize()
        report(managed=is_managed(x.data_ptr()), reserved=torch.cuda.memory_reserved(),
               backend=torch.cuda.get_allocator_backend())
    """, shim=shim_library, env={"KIWI_SOCKET": gpu_scheduler.socket,
                                 "PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"})
    assert report["backend"] == "cudaMallocAsync" and report["managed"]
    assert report["reserved"] >= 256 << 20
    took_part(report["stats"])
    assert report["stats"]["evictable"] >= 256 << 20


def test_expandable_segments_are_counted_and_reported_not_evictable(shim_library,
                                                                    gpu_scheduler) -> None:
    """cuMemCreate memory cannot be paged out yet: the daemon must hear so (the kernel turns
    expandable segments off; a plain process may not)."""
    pytest.importorskip("torch")
    report = run_python("""
        import torch
        x = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
        x.fill_(1)
        torch.cuda.synchronize()
        report(managed=is_managed(x.data_ptr()))
    """, shim=shim_library, env={"KIWI_SOCKET": gpu_scheduler.socket,
                                 "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    stats = report["stats"]
    assert not report["managed"]
    assert stats["working_set"] - stats["evictable"] >= 512 << 20


def test_mem_get_info_and_device_properties_show_the_limit_to_pytorch(shim_library,
                                                                      gpu_scheduler) -> None:
    pytest.importorskip("torch")
    report = run_python("""
        import torch
        free, total = torch.cuda.mem_get_info()
        report(free=free, total=total,
               properties=torch.cuda.get_device_properties(0).total_memory)
    """, shim=shim_library, env={"KIWI_SOCKET": gpu_scheduler.socket,
                                 "KIWI_GPU_MEMORY_LIMIT": "5GiB"})
    assert report["total"] == report["properties"] == 5 << 30
    assert 0 < report["free"] <= 5 << 30


CACHED_FREE_BLOCK = """
    import subprocess, torch
    from nodeside.client import Client
    from kiwi_jupyter.kernel.free_blocks import FreeBlocks
    shim.cell_begin()
    keep = torch.full(((512 << 20) // 4,), 3.0, device="cuda")
    big = torch.ones((2 << 30) // 4, device="cuda")
    torch.cuda.synchronize()
    del big  # PyTorch keeps its segment: 2 GiB free in the cache
    told = FreeBlocks(shim).tell() if os.environ["TELL"] == "1" else None
    # The next holder, another process whose working set needs the room.
    next_holder = subprocess.Popen([sys.executable, "-c", (
        "import os; from nodeside.client import Client\\n"
        "with Client(os.environ['KIWI_SOCKET'], name='next') as c:\\n"
        "    c.report_working_set(5 << 30); c.acquire(timeout=120); c.release()\\n")],
        env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})
    def next_waits():
        with Client(os.environ["KIWI_SOCKET"], register=False) as admin:
            return any(c["name"] == "next" and c["state"] == "waiting"
                       for c in admin.status()["clients"])
    while not next_waits():
        time.sleep(0.01)
    shim.release()  # the next holder needs the room: evicted first
    assert next_holder.wait(timeout=120) == 0
    shim.cell_begin()
    again = torch.ones((2 << 30) // 4, device="cuda")  # the free block, handed out again
    correct = bool((keep == 3.0).all().item()) and bool((again == 1.0).all().item())
    shim.release()
    report(told=told, correct=correct)
"""


@pytest.mark.parametrize("evictor", SELF_PAGING)
def test_an_eviction_does_not_copy_what_pytorchs_cache_holds_free(shim_library,
                                                                  gpu_scheduler,
                                                                  evictor: str) -> None:
    """A 2 GiB tensor freed inside PyTorch's cache: told to the shim, the eviction moves about
    2 GiB less than without, and the live tensor comes back intact."""
    pytest.importorskip("torch")
    env = {"KIWI_SOCKET": gpu_scheduler.socket, "KIWI_GPU_MEMORY_LIMIT": "6GiB",
           "KIWI_EVICT": evictor}
    plain = run_python(CACHED_FREE_BLOCK, shim=shim_library, env={**env, "TELL": "0"})
    told = run_python(CACHED_FREE_BLOCK, shim=shim_library, env={**env, "TELL": "1"})
    for run in (plain, told):
        assert run["correct"] and run["stats"]["evictions"] == 1, run
    assert told["told"] >= 2 * GiB - 4 * (1 << 20)  # whole 2 MiB pages of the free block
    assert told["stats"]["bytes_skipped"] == told["told"]
    assert plain["stats"]["bytes_skipped"] == 0
    assert told["stats"]["bytes_evicted"] <= plain["stats"]["bytes_evicted"] - told["told"]
