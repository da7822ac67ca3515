"""The shim on a real GPU: real CuPy and PyTorch workloads, two processes taking turns with
eviction, CUDA graphs and PyTorch's cudaMallocAsync backend. Skipped without a GPU.

Memory is sized so that managed memory never oversubscribes the card: the daemon is told the
GPU is smaller (--gpu-memory) than it is, so two working sets "do not fit" and must be evicted,
while both together still fit in the real card's free memory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]


def run_python(code: str, *, shim: Path | None, env: dict[str, str] | None = None,
               timeout: float = 300) -> dict[str, Any]:
    """Run code in a fresh Python (with the shim preloaded, or not); its last stdout line is
    JSON."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("KIWI_")}
    environment["PYTHONPATH"] = str(REPO)
    environment["KIWI_IDLE_RELEASE"] = "0"
    if shim:
        environment["LD_PRELOAD"] = str(shim)
    environment.update(env or {})
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environment,
                            capture_output=True, text=True, timeout=timeout, check=False)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture
def gpu_scheduler(start_daemon):
    return start_daemon("--tq", "0.2", "--gpus", "1", "--gpu-memory", "6GiB", "--grace", "30")


CUPY_MATMUL = """
    import json, cupy as cp
    from kiwi_jupyter.shim import Shim
    rng = cp.random.default_rng(7)
    a = rng.random((2048, 2048), dtype=cp.float32)
    b = rng.random((2048, 2048), dtype=cp.float32)
    c = a @ b
    print(json.dumps({"sum": float(c.sum()), "row": c[0, :8].tolist(),
                      "shimmed": Shim.loaded()}))
"""

TORCH_TRAINING = """
    import json, torch
    from kiwi_jupyter.shim import Shim
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
    print(json.dumps({"losses": losses, "shimmed": Shim.loaded()}))
"""


def test_cupy_gives_the_same_results_with_and_without_the_shim(shim_library,
                                                               gpu_scheduler) -> None:
    pytest.importorskip("cupy")
    env = {"KIWI_SOCKET": gpu_scheduler.socket}
    plain = run_python(CUPY_MATMUL, shim=None, env=env)
    shimmed = run_python(CUPY_MATMUL, shim=shim_library, env=env)
    assert shimmed["shimmed"] and not plain["shimmed"]
    assert shimmed["row"] == pytest.approx(plain["row"], rel=1e-5)
    assert shimmed["sum"] == pytest.approx(plain["sum"], rel=1e-5)


def test_pytorch_training_gives_the_same_losses_with_and_without_the_shim(
        shim_library, gpu_scheduler) -> None:
    pytest.importorskip("torch")
    env = {"KIWI_SOCKET": gpu_scheduler.socket}
    plain = run_python(TORCH_TRAINING, shim=None, env=env)
    shimmed = run_python(TORCH_TRAINING, shim=shim_library, env=env)
    assert shimmed["shimmed"]
    assert shimmed["losses"] == pytest.approx(plain["losses"], rel=1e-4)


TAKE_TURNS = """
    import json, os, torch
    from kiwi_jupyter.shim import Shim
    shim = Shim.attach()
    value = float(os.environ["START"])
    n = int(os.environ["WORKING_SET"]) // 4
    shim.cell_begin()
    x = torch.full((n,), value, device="cuda")
    torch.cuda.synchronize()
    shim.release()
    correct = True
    for i in range(int(os.environ["ROUNDS"])):
        shim.cell_begin()
        x.add_(1.0)
        correct &= bool((x[:: 1 << 20] == value + i + 1).all().item())
        shim.release()
    print(json.dumps({"correct": correct, "stats": shim.stats()}))
"""


def test_two_processes_take_turns_with_eviction(shim_library, gpu_scheduler) -> None:
    pytest.importorskip("torch")
    env = {"KIWI_SOCKET": gpu_scheduler.socket, "KIWI_GPU_MEMORY_LIMIT": "6GiB",
           "WORKING_SET": str(4 << 30), "ROUNDS": "6", "PYTHONPATH": str(REPO),
           "LD_PRELOAD": str(shim_library), "KIWI_IDLE_RELEASE": "0"}
    environment = {**{k: v for k, v in os.environ.items() if not k.startswith("KIWI_")}, **env}
    workers = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(TAKE_TURNS)],
                                env={**environment, "START": str(start)},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for start in (0, 1000)]
    reports = []
    for worker in workers:
        out, err = worker.communicate(timeout=300)
        assert worker.returncode == 0, err
        reports.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["correct"] for r in reports)
    assert sum(r["stats"]["evictions"] for r in reports) >= 1
    assert sum(r["stats"]["restores"] for r in reports) >= 1
    moved = sum(r["stats"]["bytes_evicted"] for r in reports)
    assert moved >= 4 << 30


CUDA_GRAPH = """
    import json, torch
    from kiwi_jupyter.shim import Shim
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
    print(json.dumps({"worst": worst, "backend": torch.cuda.get_allocator_backend(),
                      "shimmed": Shim.loaded()}))
"""


@pytest.mark.parametrize("backend", ["native", "cudaMallocAsync"])
def test_cuda_graphs_replay_correctly_under_each_pytorch_allocator(shim_library, gpu_scheduler,
                                                                   backend: str) -> None:
    pytest.importorskip("torch")
    report = run_python(CUDA_GRAPH, shim=shim_library,
                        env={"KIWI_SOCKET": gpu_scheduler.socket,
                             "PYTORCH_CUDA_ALLOC_CONF": f"backend:{backend}"})
    assert report["shimmed"] and report["backend"] == backend
    assert report["worst"] < 1e-2


def test_mem_get_info_shows_the_limit_to_pytorch(shim_library, gpu_scheduler) -> None:
    pytest.importorskip("torch")
    report = run_python("""
        import json, torch
        free, total = torch.cuda.mem_get_info()
        print(json.dumps({"free": free, "total": total}))
    """, shim=shim_library, env={"KIWI_SOCKET": gpu_scheduler.socket,
                                 "KIWI_GPU_MEMORY_LIMIT": "5GiB"})
    assert report["total"] == 5 << 30
    assert report["free"] <= 5 << 30
