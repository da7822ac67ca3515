"""A one-minute smoke of the vmm evictor on a GPU, through what real programs do (issue 39,
Must-work 4): ``python -m benchmarks.shim.vmm_smoke``, the ``smoke`` step of ``make gpu-check``.

A PyTorch process with the shim preloaded (``KIWI_EVICT=vmm``) and a real daemon; between each
step and its check, the process is evicted (another client that needs the whole card takes the
GPU; the process waits until its shim says its way out has ended), so every check runs on memory
that left the card and came back:

- ``torch.compile``: a compiled function's result, again after a restore (Triton's launcher asks
  the driver about every pointer argument: defect 1);
- a CUDA graph captured, replayed after a restore (its addresses must hold);
- ``backend:cudaMallocAsync`` tensors (stream-ordered allocations), in a process of their own;
- ``torch.as_tensor`` of a CuPy array and back (both ask the driver about the pointer);
- a forked ``DataLoader`` (its workers must not get a copy of the pinned shadows: defect 2);
- a global-mode capture right after a large allocation, while the shadows are being built (the
  builder must not pin meanwhile: defect 2b).

Each step's row says ok or what failed, and a verdict line closes it. Without a GPU or PyTorch
it says so and exits 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile

from benchmarks.common import REPO, start_daemon, without_kiwi

GiB = 1 << 30
STEP_TIMEOUT = 90.0

#: What the worker shares across its steps: the shim, an eviction on demand, a row per step.
PRELUDE = r'''
import json, os, subprocess, sys, time, traceback
import torch
from kiwi_jupyter.shim import Shim
shim = Shim.attach()
TOTAL = torch.cuda.get_device_properties(0).total_memory

def evicted_now():
    """Another client that needs the whole card takes the GPU: this process leaves it, and
    this returns once its shim says the way out has ended."""
    before = shim.stats()["evictions"]
    shim.release()
    taker = subprocess.Popen([sys.executable, "-c", (
        "import os; from nodeside.client import Client\n"
        "with Client(os.environ['KIWI_SOCKET'], name='taker') as c:\n"
        f"    c.report_working_set({TOTAL}); c.acquire(timeout=60); c.release()\n")],
        env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        stats = shim.stats()
        if stats["evictions"] > before and stats["evicted"]:
            break
        time.sleep(0.02)
    else:
        raise RuntimeError("not evicted within 60 s")
    taker.wait(timeout=60)
    shim.cell_begin()

def step(name, body):
    started = time.monotonic()
    try:
        shim.cell_begin()
        detail = body()
        ok = True
    except Exception as exc:
        ok, detail = False, f"{type(exc).__name__}: {str(exc)[:300]}"
    finally:
        shim.release()
    print(json.dumps({"step": name, "ok": ok, "detail": detail or "",
                      "seconds": round(time.monotonic() - started, 2)}), flush=True)
'''

MAIN_STEPS = r'''
def compiled():
    f = torch.compile(lambda x: torch.sin(x) * 2 + 1)
    x = torch.randn(1 << 20, device="cuda")
    first = f(x)
    evicted_now()
    again = f(x)
    assert torch.allclose(first, again) and torch.allclose(again, torch.sin(x) * 2 + 1)
    return "same result after a restore"

def graph():
    static_in = torch.randn(1024, 1024, device="cuda")
    weight = torch.randn(1024, 1024, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            out = static_in @ weight
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = static_in @ weight + 1
    evicted_now()
    static_in.copy_(torch.randn(1024, 1024, device="cuda"))
    g.replay()
    worst = float((out - (static_in @ weight + 1)).abs().max())
    assert worst < 1e-2, f"replay off by {worst}"
    return f"replayed after a restore (off by {worst:.1e})"

def cupy_both_ways():
    import cupy
    a = cupy.arange(1 << 20, dtype=cupy.float32)
    t = torch.as_tensor(a, device="cuda")
    evicted_now()
    b = cupy.asarray(t)
    assert float((b - cupy.arange(1 << 20, dtype=cupy.float32)).max()) == 0.0
    assert float(t[12345].item()) == 12345.0
    return "same values after a restore"

def dataloader():
    keep = torch.ones(1 << 28, device="cuda")  # 1 GiB: its shadow is pinned
    deadline = time.monotonic() + 30
    while shim.stats()["host_shadow_pinned"] < (1 << 30) and time.monotonic() < deadline:
        time.sleep(0.05)
    pinned = shim.stats()["host_shadow_pinned"]
    assert pinned >= 1 << 30, f"only {pinned / 2**30:.2f} GiB of shadows pinned after 30 s"
    evicted_now()

    def rss():
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status
                        if line.startswith("VmRSS"))

    class Rss(torch.utils.data.Dataset):
        def __len__(self):
            return 4
        def __getitem__(self, i):
            return torch.tensor([rss()])

    mine = rss()  # the shadows are in it: a child that got them would show about as much
    loader = torch.utils.data.DataLoader(Rss(), num_workers=2, multiprocessing_context="fork")
    most = int(torch.cat(list(loader)).max())
    assert float(keep[-1].item()) == 1.0
    assert most < mine - pinned // 2, (f"a worker's RSS is {most / 2**30:.2f} GiB beside the "
                                       f"parent's {mine / 2**30:.2f} GiB")
    return (f"workers' RSS at most {most / 2**30:.2f} GiB, the parent's {mine / 2**30:.2f} GiB "
            f"with {pinned / 2**30:.2f} GiB of shadows pinned")

def capture_while_building():
    fresh = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")  # the builder starts
    fresh.fill_(7)
    static_in = torch.randn(512, 512, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):  # global mode, PyTorch's default
        out = torch.tanh(static_in @ static_in)
    g.replay()
    torch.cuda.synchronize()
    evicted_now()
    g.replay()
    assert int(fresh[-1].item()) == 7
    return "captured and replayed; shadows pinned after: " \
           f"{shim.stats()['host_shadow_pinned'] / 2**30:.2f} GiB"

for name, body in (("torch.compile'd function", compiled),
                   ("CUDA graph replayed after a restore", graph),
                   ("torch.as_tensor of a CuPy array and back", cupy_both_ways),
                   ("forked DataLoader", dataloader),
                   ("global capture while shadows are built", capture_while_building)):
    step(name, body)
'''

ASYNC_STEP = r'''
def stream_ordered():
    xs = [torch.full((1 << 20,), float(i), device="cuda") for i in range(64)]
    assert torch.cuda.get_allocator_backend() == "cudaMallocAsync"
    evicted_now()
    assert all(float(x[-1].item()) == float(i) for i, x in enumerate(xs))
    del xs[::2]
    evicted_now()
    assert all(float(x[0].item()) == float(2 * i + 1) for i, x in enumerate(xs))
    return "64 tensors, half freed, through two restores"

step("backend:cudaMallocAsync tensors", stream_ordered)
'''


def say(*lines: str) -> None:
    for line in lines:
        print(line, flush=True)


def usable() -> str:
    """Why there is nothing to smoke here ("" when there is)."""
    done = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                          env=without_kiwi(), capture_output=True, text=True)
    if done.returncode != 0:
        return "no PyTorch"
    return "" if done.stdout.strip() == "True" else "no GPU"


def worker(shim: str, socket: str, code: str, env: dict[str, str] | None = None
           ) -> list[dict[str, object]]:
    """Runs PRELUDE + code shimmed; its rows (a worker that died gets a row saying so)."""
    environment = {**without_kiwi(), "LD_PRELOAD": shim, "KIWI_SOCKET": socket,
                   "KIWI_EVICT": "vmm", "KIWI_IDLE_RELEASE": "0", "PYTHONPATH": str(REPO),
                   **(env or {})}
    try:
        done = subprocess.run([sys.executable, "-c", PRELUDE + code], env=environment,
                              capture_output=True, text=True, timeout=STEP_TIMEOUT * 5)
        out, why = done.stdout, (f"exit status {done.returncode}: "
                                 f"{' / '.join(done.stderr.strip().splitlines()[-2:])}"
                                 if done.returncode else "")
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        why = "stopped: it ran too long"
    rows = [json.loads(line) for line in out.splitlines() if line.startswith('{"step"')]
    if why:
        rows.append({"step": "(the worker)", "ok": False, "detail": why, "seconds": 0})
    return rows


def main() -> int:
    say("## The vmm evictor through real programs (smoke)", "")
    why = usable()
    if why:
        say(f"Skipped: {why}.")
        return 0
    from kiwi_jupyter.shim import library_path

    shim = str(library_path())
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="kiwi-smoke-", dir="/tmp") as directory:
        daemon, socket = start_daemon(directory, "--tq", "0.05", "--grace", "60", "--gpus", "1")
        try:
            rows += worker(shim, socket, MAIN_STEPS)
            rows += worker(shim, socket, ASYNC_STEP,
                           {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"})
        finally:
            daemon.terminate()
            daemon.wait(10)
    say("| step, an eviction before its check | result | seconds | detail |",
        "| --- | --- | --- | --- |")
    for row in rows:
        say(f"| {row['step']} | {'ok' if row['ok'] else '**FAILED**'} | {row['seconds']} | "
            f"{str(row['detail']).replace('|', '/')} |")
    failed = [str(row["step"]) for row in rows if not row["ok"]]
    say("", f"- verdict smoke: {'FAIL' if failed or not rows else 'PASS'}"
        + (f" ({', '.join(failed)})" if failed else f" ({len(rows)} steps)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
