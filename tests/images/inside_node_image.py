"""Runs inside the node image (test_node_image.py), as the image's user, with the image's Python.

The image's kiwi-scheduler listens on a private socket; a Python with the image's shim preloaded
over the fake CUDA driver launches a kernel, which the shim holds at its gate until the
scheduler grants the GPU; the image's kiwictl then reads the scheduler's status. Prints one JSON
object: what each part answered.

    python inside_node_image.py SHIM FAKE_DRIVER_DIRECTORY TIMEOUT
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading

#: The shimmed process: the shim answers through its C API, the fake driver through dlsym (as
#: CuPy and PyTorch find their entry points), and the scheduler's status says who holds the GPU.
WORKLOAD = r"""
import ctypes, json, os
from nodeside.client import Client

shim = ctypes.CDLL(os.environ["LD_PRELOAD"])  # already loaded: the same library
cuda = ctypes.CDLL("libcuda.so.1")
u, p = ctypes.c_uint, ctypes.c_void_p
cuda.cuLaunchKernel.argtypes = [p, u, u, u, u, u, u, u, p, p, p]
answers = {"active": shim.kiwi_shim_active(), "init": cuda.cuInit(0),
           "launch": cuda.cuLaunchKernel(0xF00, 1, 1, 1, 32, 1, 1, 0, None, None, None),
           "holding": shim.kiwi_shim_holding()}
with Client(os.environ["KIWI_SOCKET"], register=False) as admin:
    clients = admin.status()["clients"]
answers["state"] = next((c["state"] for c in clients if c["pid"] == os.getpid()), None)
print(json.dumps(answers))
"""


def lines_of(stream) -> queue.Queue[str]:
    """The stream's lines as they come, on a queue (None at its end)."""
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


def wait_for_line(lines: queue.Queue[str], text: str, timeout: float) -> list[str]:
    """The lines up to the first with text in it; fails when the stream ends or times out."""
    seen = []
    while True:
        line = lines.get(timeout=timeout)
        if line is None:
            raise RuntimeError("ended before saying " + repr(text) + ":\n" + "".join(seen))
        seen.append(line)
        if text in line:
            return seen


def main(shim: str, fake_driver: str, timeout: float) -> dict[str, object]:
    directory = tempfile.mkdtemp(prefix="kiwi-")
    socket = os.path.join(directory, "scheduler.sock")
    daemon = subprocess.Popen(["kiwi-scheduler", "--socket", socket, "--gpus", "1",
                               "--gpu-memory", "16GiB"], stderr=subprocess.PIPE, text=True)
    try:
        log = wait_for_line(lines_of(daemon.stderr), "listening on", timeout)
        environment = {**os.environ, "LD_PRELOAD": shim, "LD_LIBRARY_PATH": fake_driver,
                       "KIWI_SOCKET": socket, "FAKE_CUDA_LOG": os.path.join(directory, "cuda.log")}
        workload = subprocess.run([sys.executable, "-c", WORKLOAD], env=environment,
                                  capture_output=True, text=True, timeout=timeout)
        kiwictl = subprocess.run(["kiwictl", "--socket", socket, "status", "--json"],
                                 capture_output=True, text=True, timeout=timeout)
        try:
            with open(environment["FAKE_CUDA_LOG"]) as calls:
                driver_calls = [line.split()[0] for line in calls if line.strip()]
        except FileNotFoundError:  # the driver was never called
            driver_calls = []
    finally:
        daemon.terminate()
        daemon.wait(timeout)
    return {"daemon_log": "".join(log), "workload": workload.stdout,
            "workload_errors": workload.stderr, "driver_calls": driver_calls,
            "kiwictl": kiwictl.stdout, "kiwictl_errors": kiwictl.stderr}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], float(sys.argv[3]))))
