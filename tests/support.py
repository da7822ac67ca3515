"""What the tests share: a real daemon process on a real socket, and waiting with a deadline."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from nodeside.daemon.listen import answers as socket_answers

T = TypeVar("T")


#: How much slower a process with a sanitized shim runs (``KIWI_TEST_SANITIZE``, tests/shim).
_SANITIZER_SLOWDOWN = {"address": 2.0, "thread": 5.0}


def _load_factor() -> float:
    """How much slower than a quiet machine this run may be: ``KIWI_TEST_SLOWDOWN`` when set,
    else the load per core when the tests started (never below 1), times a sanitized shim's
    own slowdown. A loaded 2-core machine runs a kernel's start-up several times slower; a
    deadline that cannot stretch with it fails tests that are right."""
    explicit = os.environ.get("KIWI_TEST_SLOWDOWN")
    if explicit:
        return max(1.0, float(explicit))
    load = max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
    return load * _SANITIZER_SLOWDOWN.get(os.environ.get("KIWI_TEST_SANITIZE", ""), 1.0)


#: The one load factor every deadline in the tests is multiplied by.
SLOWDOWN = _load_factor()


def scaled(seconds: float) -> float:
    """A deadline of ``seconds`` on a quiet machine, stretched by the load factor."""
    return seconds * SLOWDOWN


def wait_for(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.01,
             what: str = "condition") -> T:
    """Poll until ``predicate()`` is truthy; fail the test with ``what`` after ``timeout``
    (a quiet machine's figure, stretched by the load factor)."""
    timeout = scaled(timeout)
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.1f} s waiting for {what}")
        time.sleep(interval)


def short_tmpdir() -> Path:
    """A directory whose socket paths fit the 108-byte limit, whatever the test is called."""
    return Path(tempfile.mkdtemp(prefix="kiwi-", dir="/tmp"))


class DaemonProcess:
    """``kiwi-scheduler`` started as a real process, its stderr kept in a file."""

    def __init__(self, directory: Path, *args: str) -> None:
        self.directory = directory
        self.socket = str(directory / "kiwi.sock")
        self.log_path = directory / "daemon.log"
        self.args = list(args)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 15.0) -> DaemonProcess:
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        self.process = subprocess.Popen(
            [sys.executable, "-m", "nodeside.daemon", "--socket", self.socket, *self.args],
            stdout=log, stderr=log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        log.close()
        wait_for(lambda: socket_answers(self.socket) or self.process.poll() is not None,
                 timeout, what="the daemon to listen")
        if self.process.poll() is not None:
            raise RuntimeError(f"the daemon exited at start:\n{self.log()}")
        return self

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def wait_log(self, pattern: str, timeout: float = 10.0) -> re.Match[str]:
        return wait_for(lambda: re.search(pattern, self.log()), timeout,
                        what=f"log line /{pattern}/ in:\n{self.log()}")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(scaled(10))
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def restart(self) -> DaemonProcess:
        self.kill()
        return self.start()

    def env(self) -> dict[str, str]:
        return {**os.environ, "KIWI_SOCKET": self.socket}

    def cleanup(self) -> None:
        self.kill()
        shutil.rmtree(self.directory, ignore_errors=True)
