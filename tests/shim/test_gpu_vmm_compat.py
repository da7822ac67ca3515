"""The vmm evictor meets real programs on a real GPU (issue 39, defects 1, 7, 9, 11): what each
does after its memory was evicted, or with memory it shares, as it would without the shim.

Skipped without a GPU (marked ``gpu``; ``make gpu-check`` runs them with the other GPU tests,
``-k vmm`` among them). In each, a worker under ``KIWI_EVICT=vmm`` holds the GPU, gives it up, and
another client that needs the whole GPU (as the daemon is told it) takes it, so the worker's
memory is evicted; the other gives it back a moment after the worker asks again.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from test_gpu import PRELUDE, environment, last_json, took_part

pytestmark = pytest.mark.gpu

#: Evicts this worker's memory: another client takes the GPU (6 GiB, the daemon's whole card)
#: and gives it back half a second after the next call below asks for it.
EVICTED = """
import threading
from nodeside.client import Client

def evicted():
    shim.release()
    other = Client(os.environ["KIWI_SOCKET"], name="next")
    other.report_working_set(6 << 30)
    other.acquire(timeout=120)
    while not shim.stats()["evicted"]:
        time.sleep(0.01)
    threading.Timer(0.5, other.release).start()
    shim.cell_begin()
"""


@pytest.fixture
def gpu_scheduler(start_daemon):
    return start_daemon("--tq", "0.2", "--gpus", "1", "--gpu-memory", "6GiB", "--grace", "30")


def run_vmm(code: str, shim_library: Path, gpu_scheduler, tmp_path: Path,
            **env: str) -> tuple[dict[str, Any], str]:
    """PRELUDE, EVICTED and code as a script of its own (torch.multiprocessing's spawned
    workers import it), under vmm; its last stdout line (JSON), and its stderr."""
    script = tmp_path / "worker.py"
    script.write_text(PRELUDE + EVICTED + textwrap.dedent(code))
    result = subprocess.run([sys.executable, str(script)], env=environment(shim_library, {
        "KIWI_SOCKET": gpu_scheduler.socket, "KIWI_EVICT": "vmm", **env}),
        capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    return last_json(result.stdout), result.stderr


def test_vmm_a_compiled_function_launches_on_tensors_evicted_before(
        shim_library, gpu_scheduler, tmp_path: Path) -> None:
    """Triton's launcher asks cuPointerGetAttribute of each tensor before it launches; on
    evicted memory the driver says INVALID_VALUE ("cannot be accessed from Triton")."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    result, _ = run_vmm("""
        import torch
        shim.cell_begin()
        x = torch.randn(1 << 22, device="cuda")
        twice = torch.compile(lambda t: t * 2 + 1)
        expected = float(twice(x).sum())
        evicted()
        report(got=float(twice(x).sum()), expected=expected)
    """, shim_library, gpu_scheduler, tmp_path)
    assert result["got"] == pytest.approx(result["expected"], rel=1e-5)
    took_part(result["stats"])
    assert result["stats"]["evictions"] >= 1


def test_vmm_torch_takes_a_cupy_array_evicted_before(shim_library, gpu_scheduler,
                                                    tmp_path: Path) -> None:
    """torch.as_tensor of a CuPy array finds its device with cudaPointerGetAttributes
    (getDeviceFromPtr): evicted memory read as host memory before."""
    pytest.importorskip("torch")
    pytest.importorskip("cupy")
    result, _ = run_vmm("""
        import cupy as cp
        import torch
        shim.cell_begin()
        a = cp.arange(1 << 20, dtype=cp.float32)
        evicted()
        t = torch.as_tensor(a, device="cuda")
        back = cp.asarray(t)
        report(same=bool((back == a).all()), ptr_same=t.data_ptr() == a.data.ptr)
    """, shim_library, gpu_scheduler, tmp_path)
    assert result["same"] and result["ptr_same"]
    assert result["stats"]["evictions"] >= 1


def test_vmm_torch_multiprocessing_shares_a_cuda_tensor(shim_library, gpu_scheduler,
                                                       tmp_path: Path) -> None:
    """torch.multiprocessing sends a CUDA tensor by legacy IPC; its worker runs the shim too
    (it inherits the preload) and writes back through the shared memory."""
    pytest.importorskip("torch")
    result, _ = run_vmm("""
        import torch
        import torch.multiprocessing as mp

        def add_one(t):
            t.add_(1)
            torch.cuda.synchronize()

        if __name__ == "__main__":
            mp.set_start_method("spawn")
            shim.cell_begin()
            t = torch.zeros(1 << 20, device="cuda")
            worker = mp.Process(target=add_one, args=(t,))
            worker.start()
            worker.join()
            report(code=worker.exitcode, total=float(t.sum()))
    """, shim_library, gpu_scheduler, tmp_path)
    assert result["code"] == 0 and result["total"] == float(1 << 20)
    assert result["stats"]["evictable"] < result["stats"]["working_set"]  # shared: pinned


def test_vmm_cuda_malloc_async_takes_back_its_streams_memory(shim_library, gpu_scheduler,
                                                             tmp_path: Path) -> None:
    """PyTorch's cudaMallocAsync backend frees every tensor to the driver: after the first
    step, each allocation is one its stream freed (the shim's log says so), not a new map."""
    pytest.importorskip("torch")
    _, stderr = run_vmm("""
        import torch
        shim.cell_begin()
        model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                                    torch.nn.Linear(4096, 1024)).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(512, 1024, device="cuda")
        for _ in range(30):
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()
        torch.cuda.synchronize()
        report()
    """, shim_library, gpu_scheduler, tmp_path,
        PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync", KIWI_SHIM_LOG="1")
    lines = stderr.splitlines()
    reused = sum("(its stream's, reused)" in line for line in lines)
    fresh = sum("vmm allocation of" in line and "reused" not in line for line in lines)
    assert reused > 10 * fresh, (reused, fresh)
