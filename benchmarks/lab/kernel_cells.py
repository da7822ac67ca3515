"""What the Kiwi kernel extension costs a notebook, measured on real kernels and a real daemon.

    python -m benchmarks.lab.kernel_cells [--cells 300] [--handoffs 40] [--json FILE]

1. Cell round trip: execute_request to execute_reply for a trivial cell (``x = 1``), in one
   kernel, alternating blocks with the extension unloaded and loaded so drift hits both alike.
   Reported: the two medians, their difference and ratio (targets: +1 ms, 1.10x).
2. Hand-over: a holder releases the GPU while a kernel's cell waits for it; measured from just
   before ``release()`` to the first statement of the waiting cell. The floor is the same hand-over
   between two bare ``nodeside.client.Client``s (the daemon's own hand-over latency as a Python
   client sees it). Reported: both medians and the difference (target: within 2 ms).
   A second floor puts the bare waiter in a process of its own that waited as long as the
   kernel did (0.15 s): what waking an idle process costs on this machine, kernel or not.

Times come from ``time.perf_counter`` (CLOCK_MONOTONIC on Linux), which every process on the
machine shares, so a stamp taken in the kernel compares with one taken here.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from jupyter_client.manager import KernelManager

from nodeside.client import Client


def wait_until(predicate: Any, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.002)


def answers(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


class Bench:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.socket = str(folder / "kiwi.sock")
        self.daemon = subprocess.Popen(
            [sys.executable, "-m", "nodeside.daemon", "--socket", self.socket, "--tq", "30",
             "--log-level", "WARN"], stderr=subprocess.DEVNULL)
        wait_until(lambda: answers(self.socket), what="the daemon")
        env = {**os.environ, "KIWI_SOCKET": self.socket, "KIWI_SHIM": "0"}
        self.kernel_id = str(uuid.uuid4())
        self.manager = KernelManager(kernel_name="kiwi", connection_file=str(
            folder / f"kernel-{self.kernel_id}.json"))
        # Every cell waits for the GPU (the kernel's default gates only cells that may touch
        # it): these cells stand in for GPU work, and a gated trivial cell is the worst case.
        self.manager.start_kernel(env=env,
                                  extra_arguments=["--KiwiKernelConfig.gate_cells=all"])
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)

    def execute(self, code: str) -> tuple[float, dict[str, Any]]:
        """Seconds from sending a cell to its reply, and the reply's content."""
        start = time.perf_counter()
        msg_id = self.client.execute(code)
        while True:
            reply = self.client.get_shell_msg(timeout=60)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        elapsed = time.perf_counter() - start
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"{code!r} failed: {reply['content']}")
        return elapsed, reply["content"]

    def drain_iopub(self) -> None:
        while self.client.iopub_channel.msg_ready():
            self.client.get_iopub_msg(timeout=1)

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)
        self.daemon.send_signal(signal.SIGTERM)
        self.daemon.wait(10)


def cell_round_trips(bench: Bench, cells: int, block: int = 25) -> dict[str, float]:
    timings: dict[str, list[float]] = {"without": [], "with": []}
    for _ in range(20):  # warm both paths up
        bench.execute("x = 1")
    loaded = True
    for _ in range(max(1, cells // block)):
        for state in ("with", "without"):
            want = state == "with"
            if want != loaded:
                bench.execute("%load_ext kiwi_jupyter" if want else "%unload_ext kiwi_jupyter")
                loaded = want
            for _ in range(block):
                timings[state].append(bench.execute("x = 1")[0])
            bench.drain_iopub()
    if not loaded:
        bench.execute("%load_ext kiwi_jupyter")
    without = statistics.median(timings["without"])
    with_ext = statistics.median(timings["with"])
    return {"cells_each": len(timings["with"]), "median_without_ms": without * 1e3,
            "median_with_ms": with_ext * 1e3, "delta_ms": (with_ext - without) * 1e3,
            "ratio": with_ext / without}


def bare_handoffs(socket_path: str, rounds: int) -> list[float]:
    """Release-to-grant between two bare clients: the floor."""
    latencies = []
    with Client(socket_path, name="bench-holder") as holder, \
            Client(socket_path, name="bench-waiter") as waiter:
        for _ in range(rounds):
            holder.acquire()
            granted_at: list[float] = []

            def wait(stamps: list[float] = granted_at) -> None:
                waiter.acquire()
                stamps.append(time.perf_counter())

            thread = threading.Thread(target=wait)
            thread.start()
            wait_until(lambda: _state(holder, "bench-waiter") == "waiting", what="a waiter")
            released_at = time.perf_counter()
            holder.release()
            thread.join()
            latencies.append(granted_at[0] - released_at)
            waiter.release()
    return latencies


#: A waiter in a process of its own: acquires on each line of stdin, prints when it holds.
_WAITER = """
import sys, time
from nodeside.client import Client
with Client(sys.argv[1], name="bench-waiter") as waiter:
    for _ in sys.stdin:
        waiter.acquire()
        print(time.perf_counter(), flush=True)
        waiter.release()
"""


def process_handoffs(socket_path: str, rounds: int) -> list[float]:
    """Release-to-grant to a bare client in another process, idle as long as the kernel."""
    latencies = []
    waiter = subprocess.Popen([sys.executable, "-c", _WAITER, socket_path], text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert waiter.stdin is not None and waiter.stdout is not None
    try:
        with Client(socket_path, name="bench-holder") as holder:
            for _ in range(rounds):
                holder.acquire()
                waiter.stdin.write("acquire\n")
                waiter.stdin.flush()
                wait_until(lambda: _state(holder, "bench-waiter") == "waiting", what="a waiter")
                time.sleep(0.15)  # as long as the kernel's cell waits below
                released_at = time.perf_counter()
                holder.release()
                latencies.append(float(waiter.stdout.readline()) - released_at)
    finally:
        waiter.kill()
        waiter.wait()
    return latencies


def kernel_handoffs(bench: Bench, rounds: int) -> list[float]:
    """Release-to-first-statement of a kernel's waiting cell."""
    latencies = []
    with Client(bench.socket, name="bench-holder") as holder:
        for _ in range(rounds):
            holder.acquire()
            msg_id = bench.client.execute("import time as _t; _ran_at = _t.perf_counter()",
                                          user_expressions={"ran_at": "_ran_at"})
            wait_until(lambda: _state(holder, bench.kernel_id) == "waiting", what="the kernel")
            time.sleep(0.15)  # long enough for the waiting line to be up, as a user would see
            released_at = time.perf_counter()
            holder.release()
            while True:
                reply = bench.client.get_shell_msg(timeout=60)
                if reply["parent_header"].get("msg_id") == msg_id:
                    break
            ran_at = float(reply["content"]["user_expressions"]["ran_at"]["data"]["text/plain"])
            latencies.append(ran_at - released_at)
            bench.drain_iopub()
    return latencies


def _state(control: Client, name: str) -> str | None:
    row = next((c for c in control.status()["clients"] if c["name"] == name), None)
    return None if row is None else row["state"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.lab.kernel_cells")
    parser.add_argument("--cells", type=int, default=300, help="cells per side (default 300)")
    parser.add_argument("--handoffs", type=int, default=40, help="hand-overs per side")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)

    folder = Path(tempfile.mkdtemp(prefix="kiwi-bench-", dir="/tmp"))
    bench = Bench(folder)
    try:
        trips = cell_round_trips(bench, args.cells)
        floor = bare_handoffs(bench.socket, args.handoffs)
        idle_floor = process_handoffs(bench.socket, args.handoffs)
        kernel = kernel_handoffs(bench, args.handoffs)
    finally:
        bench.close()
        shutil.rmtree(folder, ignore_errors=True)
    handoff = {"rounds": len(kernel),
               "daemon_median_ms": statistics.median(floor) * 1e3,
               "kernel_median_ms": statistics.median(kernel) * 1e3}
    handoff["delta_ms"] = handoff["kernel_median_ms"] - handoff["daemon_median_ms"]
    handoff["idle_process_median_ms"] = statistics.median(idle_floor) * 1e3
    results = {"cell_round_trip": trips, "handoff": handoff}

    print("| measure | floor | with Kiwi | difference | ratio |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| trivial cell round trip, median of {trips['cells_each']} | "
          f"{trips['median_without_ms']:.3f} ms (extension unloaded) | "
          f"{trips['median_with_ms']:.3f} ms | {trips['delta_ms']:+.3f} ms | "
          f"{trips['ratio']:.3f}x |")
    print(f"| release to waiting cell running, median of {handoff['rounds']} | "
          f"{handoff['daemon_median_ms']:.3f} ms (bare client hand-over) | "
          f"{handoff['kernel_median_ms']:.3f} ms | {handoff['delta_ms']:+.3f} ms | "
          f"{handoff['kernel_median_ms'] / handoff['daemon_median_ms']:.2f}x |")
    idle = handoff["idle_process_median_ms"]
    print(f"| the same, floor a bare client in its own idle process, median of "
          f"{handoff['rounds']} | {idle:.3f} ms | {handoff['kernel_median_ms']:.3f} ms | "
          f"{handoff['kernel_median_ms'] - idle:+.3f} ms | "
          f"{handoff['kernel_median_ms'] / idle:.2f}x |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
