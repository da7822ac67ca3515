"""The servers the C harness runs against, and what the benchmarks read of them from /proc.

``kiwi`` is the real daemon (``python -m nodeside.daemon``) on a fresh socket; ``floor`` is the
relay ring (benchmarks/daemon/c/relay_ring.c), the least a lock server can do with the same lines;
``nvshare`` is nvshare's own C scheduler (github.com/grgalex/nvshare, ``nvshare-scheduler`` as its
Makefile builds it), run from a build the caller names: it is never part of this repository;
``pyring`` is the same ring as the floor in Python on uvloop, compiled
(benchmarks/daemon/py_ring.py): the least a Python daemon on the daemon's event loop can do.

nvshare's scheduler listens on a fixed path, ``/var/run/nvshare/scheduler.sock``. To give each
run a fresh socket of its own without touching the machine's ``/var/run``, it runs in a mount
namespace of its own (``unshare``) where a temporary folder is mounted over ``/var/run``; its
socket is then that folder's ``nvshare/scheduler.sock``, which the harness reaches from outside.
It needs root, or unprivileged user namespaces (``unshare --user --map-root-user``). Its
scheduler writes a line to stderr for every message it takes; that goes to ``/dev/null``, the
cheapest place it can go.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import REPO, socket_answers
from benchmarks.common import start_daemon as start_kiwi
from benchmarks.daemon import py_ring
from benchmarks.daemon.cprograms import build

SERVERS = ("floor", "kiwi")
NVSHARE = "nvshare"
PY_RING = "pyring"
#: Each kind as the reports call it, in the order their columns come.
NAMES = {"kiwi": "Kiwi", NVSHARE: "nvshare", PY_RING: "Python ring", "floor": "floor"}


def environment(sock: str) -> dict[str, str]:
    return {**os.environ, "KIWI_SOCKET": sock, "PYTHONPATH": str(REPO)}


@contextmanager
def serving(kind: str, directory: str | os.PathLike[str], *daemon_args: str,
            nvshare: str | os.PathLike[str] | None = None, wrapper: Sequence[str] = (),
            patience: float = 15.0) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A fresh server of this kind on ``directory``, stopped (and waited for) afterwards.
    ``nvshare``: the ``nvshare-scheduler`` executable, for the kind of that name; ``wrapper``:
    a command the server runs under (valgrind), given ``patience`` seconds to answer."""
    if kind == "kiwi":
        sock = os.path.join(directory, "kiwi.sock")
        server, sock = start_kiwi(directory, "--tq", "30", *daemon_args,
                                  env=environment(sock), wrapper=wrapper, patience=patience)
    elif kind == "floor":
        sock = os.path.join(directory, "floor.sock")
        server = subprocess.Popen([*wrapper, str(build("relay_ring")), sock])
        _wait_for(server, sock, "the relay-ring floor", patience)
    elif kind == PY_RING:
        sock = os.path.join(directory, "ring.sock")
        py_ring.build()  # before the clock of its start runs: a first build takes a while
        server = subprocess.Popen([*wrapper, sys.executable, "-m", "benchmarks.daemon.py_ring",
                                   sock], env=environment(sock))
        _wait_for(server, sock, "the Python ring", patience)
    elif kind == NVSHARE:
        if nvshare is None:
            raise ValueError("the nvshare server needs the path of an nvshare-scheduler build")
        server, sock = _start_nvshare(Path(nvshare), Path(directory), wrapper, patience)
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


def _wait_for(server: subprocess.Popen[bytes], sock: str, what: str,
              patience: float = 10.0) -> None:
    deadline = time.monotonic() + patience
    while not socket_answers(sock):
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            server.wait()
            raise RuntimeError(f"{what} did not start")
        time.sleep(0.01)


class NoNvshare(RuntimeError):
    """nvshare's scheduler cannot run here (no such build, or no mount namespace for it)."""


def _start_nvshare(binary: Path, directory: Path, wrapper: Sequence[str] = (),
                   patience: float = 10.0) -> tuple[subprocess.Popen[bytes], str]:
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        raise NoNvshare(f"{binary} is no nvshare-scheduler executable")
    run_dir = os.path.realpath("/var/run")  # a link to /run on most systems: mount the target
    room = directory / "run"
    room.mkdir()
    # Not root: a user namespace maps this user to root inside, which may mount there.
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    # unshare and sh both exec: the pid is the scheduler's own, for its CPU time.
    command = ["unshare", *user, "--mount", "--propagation", "private", "sh", "-c",
               'mount --bind "$1" "$2" && shift 2 && exec "$@"', "nvshare", str(room), run_dir,
               *wrapper, str(binary)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sock = str(room / "nvshare" / "scheduler.sock")
    try:
        _wait_for(server, sock, "nvshare's scheduler", patience)
    except RuntimeError:
        raise NoNvshare(f"nvshare's scheduler did not start (exit status {server.returncode}); "
                        f"running it in a mount namespace of its own needs root or "
                        f"unprivileged user namespaces") from None
    return server, sock


def add_server_options(parser: argparse.ArgumentParser) -> None:
    """The options that put nvshare's scheduler and the Python ring beside Kiwi and the floor."""
    parser.add_argument("--nvshare", metavar="PATH",
                        help="an nvshare-scheduler executable to measure beside the daemon")
    parser.add_argument("--python-ring", action="store_true",
                        help="the relay ring in compiled Python on uvloop beside them too")


def chosen(args: argparse.Namespace) -> tuple[str, ...]:
    """The kinds of server those options chose, in the order of the reports' columns."""
    kinds = {"kiwi", "floor", *([NVSHARE] if args.nvshare else []),
             *([PY_RING] if args.python_ring else [])}
    return tuple(k for k in NAMES if k in kinds)


def dialect(kind: str) -> list[str]:
    """The harness's options to speak this kind of server's protocol."""
    return ["--nvshare"] if kind == NVSHARE else []


def server_cpu_seconds(pid: int) -> float:
    """The server's CPU time so far: its threads' run time from schedstat (as contenders.c)."""
    total = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # a thread that ended
            total += int((task / "schedstat").read_text().split()[0]) / 1e9
    return total


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
    #: Every grant the harness's contenders read (whoever released), for throughput.
    grants: int = 0

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
               None if unserved is None else int(unserved), progress,
               int(facts.get("grants", 0)))


def machine_load() -> str:
    """The load the machine was under, for the heading of every report."""
    one, five, _ = os.getloadavg()
    return f"{os.cpu_count()} CPUs, load average {one:.2f} (1 min) / {five:.2f} (5 min)"
