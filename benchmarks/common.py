"""Small helpers the benchmarks share."""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from nodeside.daemon.listen import answers as socket_answers

#: The repository's root: benchmarks run from a clone, never from an installed package.
REPO = Path(__file__).resolve().parent.parent


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile by the nearest-rank method."""
    ordered = sorted(samples)
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def demote_headings(lines: Sequence[str], top: int = 3) -> list[str]:
    """A benchmark's Markdown put under a report's sections: its highest heading becomes
    level ``top``, the others keep their distance below it."""
    levels = [len(line) - len(line.lstrip("#")) for line in lines if line.startswith("#")]
    shift = top - min(levels, default=top)
    return [("#" * shift + line if line.startswith("#") and shift > 0 else line)
            for line in lines]


def report_row(*cells: object) -> None:
    print("| " + " | ".join(str(c) for c in cells) + " |")


def rss_bytes(pid: int) -> int:
    """The process's resident memory; 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except FileNotFoundError:
        pass
    return 0


def utc_now() -> str:
    """The time for a report's heading."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def without_kiwi(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment without any Kiwi setting or preload, nor the test suite's fake-driver
    settings: a plain process."""
    return {k: v for k, v in environ.items()
            if not k.startswith(("KIWI_", "FAKE_CUDA")) and k != "LD_PRELOAD"}


def start_daemon(directory: str | os.PathLike[str], *args: str,
                 env: dict[str, str] | None = None, wrapper: Sequence[str] = (),
                 patience: float = 15.0) -> tuple[subprocess.Popen[bytes], str]:
    """A ``kiwi-scheduler`` on ``directory/kiwi.sock``, returned once it answers (within
    ``patience`` seconds); ``wrapper``: a command it runs under (valgrind)."""
    path = os.path.join(directory, "kiwi.sock")
    daemon = subprocess.Popen([*wrapper, sys.executable, "-m", "nodeside.daemon", "--socket",
                               path, "--log-level", "WARN", *args], env=env)
    deadline = time.monotonic() + patience
    while not socket_answers(path):
        if daemon.poll() is not None or time.monotonic() > deadline:
            daemon.kill()
            raise RuntimeError("the daemon did not start")
        time.sleep(0.02)
    return daemon, path


@contextlib.contextmanager
def running_daemon(directory: str | os.PathLike[str], *args: str) -> Iterator[str]:
    """``start_daemon`` for the block, which gets the socket's path; stopped after it."""
    daemon, path = start_daemon(directory, *args)
    try:
        yield path
    finally:
        daemon.terminate()
        daemon.wait(10)
