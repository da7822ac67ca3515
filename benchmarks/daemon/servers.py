"""The servers the C harness runs against, and what the benchmarks read of them from /proc.

``kiwi`` is the real daemon (``python -m nodeside.daemon``) on a fresh socket; ``floor`` is the
relay ring (benchmarks/daemon/c/relay_ring.c), the least a lock server can do with the same lines.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from benchmarks.common import REPO, socket_answers
from benchmarks.common import start_daemon as start_kiwi
from benchmarks.daemon.cprograms import build

SERVERS = ("floor", "kiwi")


def environment(sock: str) -> dict[str, str]:
    return {**os.environ, "KIWI_SOCKET": sock, "PYTHONPATH": str(REPO)}


@contextmanager
def serving(kind: str, directory: str | os.PathLike[str],
            *daemon_args: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A fresh server of this kind on ``directory``, stopped (and waited for) afterwards."""
    if kind == "kiwi":
        sock = os.path.join(directory, "kiwi.sock")
        server, sock = start_kiwi(directory, "--tq", "30", *daemon_args,
                                  env=environment(sock))
    elif kind == "floor":
        sock = os.path.join(directory, "floor.sock")
        server = subprocess.Popen([str(build("relay_ring")), sock])
        deadline = time.monotonic() + 10
        while not socket_answers(sock):
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                raise RuntimeError("the relay-ring floor did not start")
            time.sleep(0.01)
    else:
        raise ValueError(f"no server {kind!r}")
    try:
        yield server, sock
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


#: contenders.c's exit status when the server does not answer its hello or register in time.
NO_ANSWER = 3


class NoAnswer(RuntimeError):
    """The server accepted the connection but never answered the harness's hello or register."""


@dataclass
class Run:
    """What one run of the harness printed (contenders.c's "key value" lines)."""

    handoffs: int
    seconds: float
    server_cpu_s: float
    p50_us: float
    p99_us: float
    max_us: float
    stalled: int
    closed: bool
    requeue_unserved: int | None
    progress: list[tuple[int, int]]

    @property
    def per_second(self) -> float:
        return self.handoffs / self.seconds if self.seconds else 0.0

    @property
    def cpu_us(self) -> float:
        return self.server_cpu_s / self.handoffs * 1e6 if self.handoffs else float("nan")


def harness_command(sock: str, *args: str, server_pid: int | None = None) -> list[str]:
    command = [str(build("contenders")), sock, *args]
    if server_pid is not None:
        command += ["--server-pid", str(server_pid)]
    return command


def harness(sock: str, *args: str, server_pid: int | None = None,
            timeout: float = 600) -> Run:
    """Run the C harness against ``sock`` to the end and parse what it printed."""
    done = subprocess.run(harness_command(sock, *args, server_pid=server_pid),
                          capture_output=True, text=True, timeout=timeout)
    return parse(sock, done.returncode, done.stdout, done.stderr)


def parse(sock: str, status: int, stdout: str, stderr: str) -> Run:
    """A finished harness's "key value" lines as a Run, or the reason it failed."""
    if status == NO_ANSWER:
        raise NoAnswer(f"no answer to hello or register on {sock}")
    if status != 0:
        raise RuntimeError(f"the harness failed: {stderr.strip()}")
    facts: dict[str, float] = {}
    progress = []
    for line in stdout.splitlines():
        key, *values = line.split()
        if key == "progress":
            progress.append((int(values[0]), int(values[1])))
        elif key != "sample":
            facts[key] = float(values[0])
    unserved = facts.get("requeue_unserved")
    return Run(int(facts["handoffs"]), facts["seconds"], facts["server_cpu_s"],
               facts.get("p50_ns", float("nan")) / 1e3, facts.get("p99_ns", float("nan")) / 1e3,
               facts.get("max_ns", float("nan")) / 1e3, int(facts["stalled"]),
               bool(facts.get("closed", 0)),
               None if unserved is None else int(unserved), progress)


def machine_load() -> str:
    """The load the machine was under, for the heading of every report."""
    one, five, _ = os.getloadavg()
    return f"{os.cpu_count()} CPUs, load average {one:.2f} (1 min) / {five:.2f} (5 min)"
