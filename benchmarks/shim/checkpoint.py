"""Checkpoint evictor benchmarks (GPU, PyTorch, driver r570+):
``python -m benchmarks.shim.checkpoint``.

    python -m benchmarks.shim.checkpoint [--sizes 1,10]   # --sizes 1,10,40 for the large one

It prints its Markdown as it goes, each line flushed (so a step cut off by ``make gpu-check``'s
time limit keeps what was measured), returns the whole of it from ``main()``, and skips cleanly,
saying why, without a GPU, PyTorch or the driver's checkpoint API. The default fits in about four
minutes on an H100. Each figure is set against a floor measured in the same run on the same GPU:

- checkpoint and restore of a process holding each of ``--sizes`` GiB of device memory (the driver's
  cuCheckpointProcessCheckpoint / Restore, called from this process as the daemon does), as
  time and bandwidth against a pinned-host cudaMemcpy of the same bytes in a process without
  the shim;
- a 10 GiB handoff end to end under each evictor (``managed``, ``checkpoint``): two shimmed
  workers that never fit together take turns through a real daemon; the handoff is the
  waiting worker's first pass after asking, less one steady pass;
- the steady-state cost of each evictor on a PyTorch training step, against no shim (the
  checkpoint evictor converts nothing, so its target is 1.00).

A size that does not fit in the GPU's free memory (or, checkpointed, in host memory) is skipped,
never allocated.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks.common import REPO, without_kiwi

GiB = 1 << 30
#: Checkpoint round sizes by default; 40 GiB (a 40 GiB pinned floor too) costs minutes more.
SIZES_GIB = (1, 10)
HANDOFF_GIB = 10
#: Room left free on the card and in host memory beside what a figure needs.
HEADROOM = 2 * GiB

HOLDER = """
import sys, torch
tensor = torch.ones({nbytes} // 4, device="cuda")
torch.cuda.synchronize()
print("ready", flush=True)
sys.stdin.readline()
assert float(tensor[-1]) == 1.0  # the memory came back as it was
print("intact", flush=True)
"""


def _gpu_free() -> int | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    free, _total = torch.cuda.mem_get_info(0)
    return int(free)


def _host_available() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def checkpoint_round(api: Any, nbytes: int) -> dict[str, float]:
    """A plain PyTorch process holds nbytes; this process checkpoints and restores it."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER.format(nbytes=nbytes)],
                              env=without_kiwi(), text=True, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    try:
        assert holder.stdout and holder.stdin
        if holder.stdout.readline().strip() != "ready":
            raise RuntimeError("the holder process did not start")
        api.lock(holder.pid, timeout=60)
        started = time.perf_counter()
        api.checkpoint(holder.pid)
        checkpoint_s = time.perf_counter() - started
        started = time.perf_counter()
        api.restore(holder.pid)
        restore_s = time.perf_counter() - started
        api.unlock(holder.pid)
        holder.stdin.write("\n")
        holder.stdin.flush()
        intact = holder.stdout.readline().strip() == "intact"
    finally:
        holder.kill()
        holder.wait()
    return {"checkpoint_s": checkpoint_s, "restore_s": restore_s, "intact": float(intact)}


def handoff(socket: str, shim: str, nbytes: int, evict: str) -> float:
    """Seconds of one handoff between two workers of nbytes each, under ``evict``."""
    from benchmarks.shim.paging import Worker

    a = Worker(socket, shim, KIWI_EVICT=evict, KIWI_CLIENT_NAME=f"bench-a-{evict}")
    b = Worker(socket, shim, KIWI_EVICT=evict, KIWI_CLIENT_NAME=f"bench-b-{evict}")
    try:
        a("cell_begin")
        a("allocate", bytes=nbytes)
        steady = sorted(a("iterate", count=10))[5]
        b("cell_begin")
        b("allocate", bytes=nbytes)  # waits for A's drop: A leaves, B runs
        b("iterate", count=3)
        first = a("iterate", count=1)[0]  # waits for B's drop: B leaves, A comes back
        a("release")
        b("release")
    finally:
        a.close()
        b.close()
    return first - steady


def training_step(env: dict[str, str], repeats: int = 3) -> float:
    from benchmarks.shim.overhead import WORKLOADS, run

    return statistics.median(run(WORKLOADS["torch_training_step"], env) for _ in range(repeats))


class Report:
    """The Markdown, printed line by line as it is known (flushed) and kept for main()."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, *lines: str) -> None:
        for line in lines:
            self.lines.append(line)
            print(line, flush=True)

    def table_header(self, *header: str) -> None:
        self("| " + " | ".join(header) + " |", "|" + " --- |" * len(header))

    def table_row(self, *cells: str) -> None:
        self("| " + " | ".join(cells) + " |")

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def parse_sizes(text: str) -> tuple[int, ...]:
    """``"1,10,40"`` -> (1, 10, 40); argparse reports a bad one."""
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"sizes are whole GiB, comma-separated: {text!r}") from None
    if not sizes or min(sizes) <= 0:
        raise argparse.ArgumentTypeError(f"sizes are whole GiB above 0: {text!r}")
    return sizes


def main(argv: list[str] | None = None) -> str:
    """Run what this machine allows; prints the Markdown as it goes and returns all of it."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shim.checkpoint",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=parse_sizes, default=SIZES_GIB,
                        help="checkpoint round sizes in GiB, comma-separated (default 1,10)")
    args = parser.parse_args(argv or [])
    out = Report()
    out("## Checkpoint evictor", "")
    free = _gpu_free()
    if free is None:
        out("Skipped: no GPU (or no PyTorch with CUDA).")
        return out.text
    import torch

    from benchmarks.common import start_daemon
    from benchmarks.shim.paging import pinned_copy_bandwidth
    from kiwi_jupyter.shim import library_path
    from nodeside.evict.checkpoint import CheckpointUnavailable, load

    out(f"{torch.cuda.get_device_name(0)}, {time.strftime('%Y-%m-%d')}, "
        f"{free / GiB:.1f} GiB free at the start.", "")
    try:
        api = load()
    except CheckpointUnavailable as exc:
        out(f"Skipped: {exc}.")
        return out.text

    floors: dict[int, dict[str, float]] = {}  # one pinned floor per size: each costs seconds

    def floor(nbytes: int) -> dict[str, float]:
        if nbytes not in floors:
            floors[nbytes] = pinned_copy_bandwidth(nbytes)
        return floors[nbytes]

    out.table_header("size", "checkpoint", "vs memcpy D->H", "restore", "vs memcpy H->D",
                     "memory intact")
    for gib in args.sizes:
        nbytes = gib * GiB
        if nbytes + HEADROOM > free or nbytes + HEADROOM > _host_available():
            out.table_row(f"{gib} GiB", "skipped: does not fit", "", "", "", "")
            continue
        link = floor(nbytes)
        times = checkpoint_round(api, nbytes)
        out_bw, in_bw = nbytes / times["checkpoint_s"], nbytes / times["restore_s"]
        out.table_row(f"{gib} GiB", f"{times['checkpoint_s']:.3f} s / {out_bw / 1e9:.1f} GB/s",
                      f"{out_bw / link['to_host']:.2f}",
                      f"{times['restore_s']:.3f} s / {in_bw / 1e9:.1f} GB/s",
                      f"{in_bw / link['to_device']:.2f}", "yes" if times["intact"] else "NO")
    out("")

    shim = str(library_path())
    nbytes = HANDOFF_GIB * GiB
    with tempfile.TemporaryDirectory(prefix="kiwi-", dir="/tmp") as directory:
        # The daemon is told the GPU holds 1.5 x N, so two N working sets never fit.
        daemon, socket = start_daemon(directory, "--tq", "0.05", "--grace", "120", "--gpus",
                                      "1", "--gpu-memory", str(int(nbytes * 1.5)))
        try:
            out(f"Handoff of {HANDOFF_GIB} GiB each way (floor: out and back at pinned memcpy "
                "speed):", "")
            out.table_header("evictor", "handoff (s)", "floor / handoff")
            fits = 2 * nbytes + HEADROOM <= (_gpu_free() or 0)
            for evict in ("managed", "checkpoint"):
                if not fits:
                    out.table_row(evict, "skipped: two working sets do not fit", "")
                    continue
                link = floor(nbytes)
                seconds = handoff(socket, shim, nbytes, evict)
                ideal = 2 * nbytes / ((link["to_host"] + link["to_device"]) / 2)
                out.table_row(evict, f"{seconds:.3f}", f"{ideal / seconds:.2f}")
            out("", "PyTorch training step (small MLP, batch 4096), steady state:", "")
            out.table_header("evictor", "step (ms)", "vs no shim")
            plain = training_step(without_kiwi())
            out.table_row("no shim", f"{plain * 1e3:.3f}", "1.00")
            for evict in ("managed", "checkpoint"):
                env = {**without_kiwi(), "LD_PRELOAD": shim, "KIWI_SOCKET": socket,
                       "KIWI_IDLE_RELEASE": "0", "KIWI_EVICT": evict, "PYTHONPATH": str(REPO)}
                step = training_step(env)
                out.table_row(evict, f"{step * 1e3:.3f}", f"{step / plain:.3f}")
        finally:
            daemon.terminate()
            daemon.wait(10)
    return out.text


if __name__ == "__main__":
    main(sys.argv[1:])
