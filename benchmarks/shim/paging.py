"""Shim paging benchmarks (GPU, PyTorch): ``python -m benchmarks.shim.paging [--gib 10]``.

Each figure is a ratio against a floor measured in the same run on the same GPU:

- eviction and restore bandwidth (the shim's prefetches, from its own statistics) against a
  pinned-host cudaMemcpy of the same bytes in a process without the shim (target >= 0.8), and
  the eviction of the same working set a second time (with ``--evict-copy``, into the host
  buffers the first one kept);
- a handoff between two holders of N GiB each: from the waiting one's first GPU call until that
  call has run (the other evicts N, it restores N), less one steady iteration, against
  2 x N / measured memcpy bandwidth (out and back in: the floor of any handoff);
- the time the new holder needs to reach full-speed iterations after its grant, restoring by
  prefetch (the shim) against demand paging (KIWI_RESTORE=fault, nvshare's way), same workload:
  from the moment the grant reached the shim (its ``last_grant_at``, before any restore) to the
  start of the first pass that runs at full speed. The other holder's eviction, which comes
  before the grant, is left out of both.

The daemon is told the GPU holds 1.5 x N, so two N working sets never fit and the holder is asked
to evict; the real card must have 2 x N + a few GiB free (managed memory never oversubscribes).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.common import REPO, report_row

GiB = 1 << 30


def pinned_copy_bandwidth(nbytes: int) -> dict[str, float]:
    """Bytes/s of a pinned host <-> device cudaMemcpy, in a process without the shim."""
    code = f"""
import json, torch
n = {nbytes}
host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
device = torch.empty(n, dtype=torch.uint8, device="cuda")
def timed(copy):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    copy(); torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        start.record(); copy(); end.record(); end.synchronize()
        best = min(best, start.elapsed_time(end) / 1000)
    return n / best
print(json.dumps({{"to_host": timed(lambda: host.copy_(device, non_blocking=True)),
                   "to_device": timed(lambda: device.copy_(host, non_blocking=True))}}))
"""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


class Worker:
    def __init__(self, socket: str, shim: str, **env: str) -> None:
        environment = {**common.without_kiwi(), "LD_PRELOAD": shim, "KIWI_SOCKET": socket,
                       "KIWI_IDLE_RELEASE": "0", "PYTHONPATH": str(REPO),
                       # The managed pager is what these figures are of (auto would pick
                       # the checkpoint evictor on an r570+ driver); **env may say otherwise.
                       "KIWI_EVICT": "managed", **env}
        self.process = subprocess.Popen([sys.executable, "-m", "benchmarks.shim.worker"],
                                        cwd=REPO, env=environment, text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def __call__(self, op: str, **fields: Any) -> Any:
        assert self.process.stdin and self.process.stdout
        self.process.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())["result"]

    def close(self) -> None:
        if self.process.stdin:
            self.process.stdin.close()
        self.process.wait(60)


def start_daemon(directory: str, gpu_memory: int) -> tuple[subprocess.Popen[bytes], str]:
    return common.start_daemon(directory, "--tq", "0.05", "--grace", "120", "--gpus", "1",
                               "--gpu-memory", str(gpu_memory))


def handoff_round(socket: str, shim: str, nbytes: int, restore: str,
                  evict_copy: str = "off") -> dict[str, Any]:
    """Two shimmed workers with nbytes each take turns; they never fit together, so each
    handoff evicts one and restores the other. Returns the handoff to A (B evicts, A restores),
    measured as A's first iteration after asking minus a steady iteration, and A's iteration
    times after the grant."""
    a = Worker(socket, shim, KIWI_RESTORE=restore, KIWI_CLIENT_NAME="bench-a",
               KIWI_EVICT_COPY=evict_copy)
    b = Worker(socket, shim, KIWI_RESTORE=restore, KIWI_CLIENT_NAME="bench-b",
               KIWI_EVICT_COPY=evict_copy)
    try:
        a("cell_begin")
        a("allocate", bytes=nbytes)
        steady = sorted(a("iterate", count=10))[5]
        b("cell_begin")
        b("allocate", bytes=nbytes)  # waits for A's drop: A evicts, B runs
        b("iterate", count=3)
        # Every grant restores (the first one too, which only populates A's pages): A's
        # figures for this handoff are what grew from here.
        before = a("stats")
        spans = a("passes", count=20)  # waits for B's drop: B evicts, A restores
        stats_a, stats_b = a("stats"), b("stats")
        for counter in ("restores", "bytes_restored", "seconds_restoring"):
            stats_a[counter] -= before[counter]
        # A second eviction of the same working set: with KIWI_EVICT_COPY it copies into the
        # host buffers the first one kept (B's above paid for fresh ones).
        b("iterate", count=3)  # waits for A's drop: A evicts again, B restores
        again = a("stats")
        again_bytes = again["bytes_evicted"] - stats_a["bytes_evicted"]
        again_seconds = again["seconds_evicting"] - stats_a["seconds_evicting"]
        a("release")
        b("release")
    finally:
        a.close()
        b.close()
    after_grant = [end - start for start, end in spans]
    granted = stats_a["grants"] > before["grants"]
    to_full_speed = (full_speed_after(spans, steady, stats_a["last_grant_at"])
                     if granted else None)
    return {"restorer": stats_a, "evicter": stats_b, "handoff": after_grant[0] - steady,
            "evict_again_bps": again_bytes / again_seconds if again_seconds > 0 else None,
            "steady": steady, "to_full_speed": to_full_speed, "after_grant": after_grant}


def full_speed_after(spans: list[tuple[float, float]], steady: float,
                     granted_at: float) -> float | None:
    """Seconds from the grant to the start of the first pass at full speed (within 10 % of a
    steady pass); None when none of the passes got there. ``spans`` are (start, end) on the
    grant's clock; a pass that began before the grant (it was waiting for it) counts from it."""
    for start, end in spans:
        if end - start <= 1.1 * steady and end > granted_at:
            return max(0.0, start - granted_at)
    return None


def seconds(value: float | None, passes: int = 20) -> str:
    return f"{value:.3f}" if value is not None else f"not within {passes} passes"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=10.0, help="working set size in GiB")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--evict-copy", choices=("off", "pinned", "pageable"), default="off",
                        help="KIWI_EVICT_COPY for the prefetch round: evict by copy and discard "
                        "(docs/shim.md); the fault round always evicts by prefetch")
    args = parser.parse_args(argv)
    import torch

    from kiwi_jupyter.shim import library_path

    nbytes = int(args.gib * GiB)
    shim = str(library_path())
    floor = pinned_copy_bandwidth(nbytes)
    with tempfile.TemporaryDirectory(prefix="kiwi-", dir="/tmp") as directory:
        daemon, socket = start_daemon(directory, int(nbytes * 1.5))
        try:
            prefetch = handoff_round(socket, shim, nbytes, "prefetch", args.evict_copy)
            fault = handoff_round(socket, shim, nbytes, "fault")
        finally:
            daemon.terminate()
            daemon.wait(10)
    evicter, restorer = prefetch["evicter"], prefetch["restorer"]
    evict_bw = evicter["bytes_evicted"] / evicter["seconds_evicting"]
    restore_bw = restorer["bytes_restored"] / restorer["seconds_restoring"]
    handoff_floor = 2 * nbytes / ((floor["to_host"] + floor["to_device"]) / 2)
    results = {
        "gpu": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%d"),
        "working_set_gib": args.gib, "evict_copy": args.evict_copy,
        "memcpy_to_host_gbps": floor["to_host"] / 1e9,
        "memcpy_to_device_gbps": floor["to_device"] / 1e9,
        "evict_gbps": evict_bw / 1e9, "evict_ratio": evict_bw / floor["to_host"],
        "evict_again_gbps": (prefetch["evict_again_bps"] or 0.0) / 1e9,
        "evict_again_ratio": (prefetch["evict_again_bps"] or 0.0) / floor["to_host"],
        "restore_gbps": restore_bw / 1e9, "restore_ratio": restore_bw / floor["to_device"],
        "handoff_s": prefetch["handoff"], "handoff_floor_s": handoff_floor,
        "handoff_ratio": handoff_floor / prefetch["handoff"],
        "full_speed_prefetch_s": prefetch["to_full_speed"],
        "full_speed_fault_s": fault["to_full_speed"],
        "steady_iteration_s": prefetch["steady"],
    }
    report_row("metric", "value", "floor", "ratio")
    report_row("---", "---", "---", "---")
    how = "" if args.evict_copy == "off" else f" (KIWI_EVICT_COPY={args.evict_copy})"
    report_row(f"eviction GB/s{how}", f"{results['evict_gbps']:.1f}",
               f"{results['memcpy_to_host_gbps']:.1f}", f"{results['evict_ratio']:.2f}")
    report_row(f"eviction GB/s, the same working set again{how}",
               f"{results['evict_again_gbps']:.1f}", f"{results['memcpy_to_host_gbps']:.1f}",
               f"{results['evict_again_ratio']:.2f}")
    report_row("restore GB/s", f"{results['restore_gbps']:.1f}",
               f"{results['memcpy_to_device_gbps']:.1f}", f"{results['restore_ratio']:.2f}")
    report_row(f"handoff {args.gib:g} GiB (s)", f"{prefetch['handoff']:.3f}",
               f"{handoff_floor:.3f}", f"{results['handoff_ratio']:.2f}")
    report_row("to full speed after grant (s)", f"prefetch: {seconds(prefetch['to_full_speed'])}",
               f"fault: {seconds(fault['to_full_speed'])}", "")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
