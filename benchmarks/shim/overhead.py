"""Shim overhead benchmarks (GPU): ``python -m benchmarks.shim.overhead``.

The same workload runs in a process without the shim and in processes with it preloaded (the
gate, a daemon that grants at once), once under each evictor: ``vmm`` (allocations are physical
memory the shim maps itself; what ``KIWI_EVICT=auto`` picks where the device supports VMM),
``managed`` (allocations become managed memory) and ``checkpoint`` (device memory stays device
memory). Each figure is the ratio shimmed / plain, the median of several alternating runs in
the same session. The table's last row is the evictor the shim really used (``vmm`` falls back
to ``managed`` on a device without VMM, ``checkpoint`` where the driver or the daemon cannot
checkpoint).

- a PyTorch training step (a small MLP, batch 4096): target <= 1.02;
- a CuPy matmul (8192 x 8192 float32): target <= 1.02;
- a launch-bound microbenchmark (PyTorch in-place add on one element, 20,000 launches):
  target <= 1.03.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, report_row, start_daemon, without_kiwi

WORKLOADS = {
    "torch_training_step": """
import time, torch
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                            torch.nn.Linear(4096, 1024)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(4096, 1024, device="cuda")
def step():
    opt.zero_grad(); model(x).square().mean().backward(); opt.step()
for _ in range(20): step()
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(200): step()
torch.cuda.synchronize(); print((time.perf_counter() - t) / 200)
""",
    "cupy_matmul": """
import time, cupy as cp
a = cp.random.rand(8192, 8192, dtype=cp.float32); b = cp.random.rand(8192, 8192, dtype=cp.float32)
for _ in range(3): a @ b
cp.cuda.Device().synchronize(); t = time.perf_counter()
for _ in range(30): a @ b
cp.cuda.Device().synchronize(); print((time.perf_counter() - t) / 30)
""",
    "launch_bound": """
import time, torch
x = torch.zeros(1, device="cuda")
for _ in range(1000): x.add_(1)
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(20000): x.add_(1)
torch.cuda.synchronize(); print((time.perf_counter() - t) / 20000)
""",
}


EVICTORS = ("vmm", "managed", "checkpoint")

#: What the shim says it did in a process that allocated once.
EVICTOR_PROBE = """
import json, torch
from kiwi_jupyter.shim import Shim
x = torch.ones(1, device="cuda"); torch.cuda.synchronize()
shim = Shim.attach()
print(json.dumps(shim.stats()["evict"] if shim else None))
"""


def last_line(code: str, env: dict[str, str]) -> str:
    """The last line ``code`` prints, run in a Python process of its own with ``env``."""
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True).stdout
    return out.strip().splitlines()[-1]


def evictor_used(env: dict[str, str]) -> str:
    return str(json.loads(last_line(EVICTOR_PROBE, env)))


def run(code: str, env: dict[str, str]) -> float:
    return float(last_line(code, env))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", choices=sorted(WORKLOADS), action="append")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    from kiwi_jupyter.shim import library_path

    shim = str(library_path())
    base = without_kiwi()
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d")}
    with tempfile.TemporaryDirectory(prefix="kiwi-", dir="/tmp") as directory:
        daemon, socket = start_daemon(directory, "--gpus", "1")
        try:
            envs = {evict: {**base, "LD_PRELOAD": shim, "KIWI_SOCKET": socket,
                            "KIWI_IDLE_RELEASE": "0", "PYTHONPATH": str(REPO),
                            "KIWI_EVICT": evict} for evict in EVICTORS}
            used = {evict: evictor_used(env) for evict, env in envs.items()}
            results["evictor_used"] = used
            report_row("workload", "plain (s)", *(f"{e} (s) | ratio" for e in EVICTORS))
            report_row("---", "---", *("--- | ---" for _ in EVICTORS))
            for name in args.only or sorted(WORKLOADS):
                times: dict[str, list[float]] = {"plain": [], **{e: [] for e in EVICTORS}}
                for _ in range(args.repeats):  # alternate, so drift hits all alike
                    times["plain"].append(run(WORKLOADS[name], base))
                    for evict, env in envs.items():
                        times[evict].append(run(WORKLOADS[name], env))
                medians = {key: statistics.median(values) for key, values in times.items()}
                p = medians["plain"]
                results[name] = {"plain_s": p, **{f"{e}_s": medians[e] for e in EVICTORS},
                                 **{f"{e}_ratio": medians[e] / p for e in EVICTORS}}
                report_row(name, f"{p:.6g}",
                           *(f"{medians[e]:.6g} | {medians[e] / p:.3f}" for e in EVICTORS))
            # Asked is not always got: checkpoint falls back to managed where it cannot act.
            report_row("(the evictor the shim used)", "", *(f"{used[e]} | " for e in EVICTORS))
        finally:
            daemon.terminate()
            daemon.wait(10)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
