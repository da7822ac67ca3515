"""Handoffs per second with many client processes running flat out (issue 44).

``flat_out`` starts one server and N processes of the C harness (benchmarks/daemon/c/contenders.c),
one contender each: every process holds the GPU for no time, gives it back and asks again at
once, for S seconds. All of them connect and register first; then they are told to start
together. The throughput is the grants they read in those seconds, over the seconds; the
server's CPU per handoff is its threads' run time over the same stretch, over the grants. Unlike
the handoff benchmark's one harness process, each grant here wakes another process, as it does
for kernels on a node.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from dataclasses import dataclass

from benchmarks.daemon.servers import (
    dialect,
    harness_command,
    parse,
    server_cpu_seconds,
    serving,
)


@dataclass
class Throughput:
    grants: int
    seconds: float
    server_cpu_s: float

    @property
    def per_second(self) -> float:
        return self.grants / self.seconds if self.seconds else 0.0

    @property
    def cpu_us(self) -> float:
        return self.server_cpu_s / self.grants * 1e6 if self.grants else float("nan")


def flat_out(kind: str, processes: int, seconds: float,
             nvshare: str | os.PathLike[str] | None = None) -> Throughput:
    """``processes`` harness processes against a fresh server of ``kind`` for ``seconds``."""
    args = [*dialect(kind), "--contenders", "1", "--hold-us", "0", "--handoffs", "1",
            "--warmup", "0", "--seconds", str(seconds), "--wait-stdin"]
    with (tempfile.TemporaryDirectory(prefix="kiwi-bench-", dir="/tmp") as tmp,
          serving(kind, tmp, nvshare=nvshare) as (server, sock)):
        clients = [subprocess.Popen(harness_command(sock, *args), stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                   for _ in range(processes)]
        try:
            for client in clients:
                assert client.stdout is not None
                said = client.stdout.readline()  # each says so once it is registered
                if not said.startswith("registered"):
                    out, err = client.communicate(timeout=60)
                    parse(sock, client.returncode, said + out, err)  # raises with the reason
                    raise RuntimeError(f"a harness process did not register: {said!r}")
            cpu_before, started = server_cpu_seconds(server.pid), time.monotonic()
            for client in clients:
                assert client.stdin is not None
                client.stdin.write("go\n")
                client.stdin.flush()
            runs = []
            for client in clients:
                out, err = client.communicate(timeout=seconds + 60)
                runs.append(parse(sock, client.returncode, out, err))
            cpu = server_cpu_seconds(server.pid) - cpu_before
            elapsed = time.monotonic() - started
        finally:
            for client in clients:
                if client.poll() is None:
                    client.kill()
                    client.wait()
    # Each process stops asking at its own S seconds after the go: the grants are those of S.
    return Throughput(sum(r.grants for r in runs), min(seconds, elapsed), cpu)
