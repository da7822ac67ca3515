"""What the tests share: a real daemon process on a real socket, waiting with a deadline, and
waiting on the daemon's own change events for what its status document shows."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from nodeside import protocol as p
from nodeside.daemon.listen import answers as socket_answers
from nodeside.protocol import events
from nodeside.protocol.client_session import ClientSession

T = TypeVar("T")


#: How much slower a process with a sanitized shim runs (``KIWI_TEST_SANITIZE``, tests/shim).
_SANITIZER_SLOWDOWN = {"address": 2.0, "thread": 5.0}


def load_factor() -> float:
    """How much slower than a quiet machine this run is now: ``KIWI_TEST_SLOWDOWN`` when set,
    else the load per core (never below 1), times a sanitized shim's own slowdown. A loaded
    2-core machine runs a kernel's start-up several times slower; a deadline that cannot
    stretch with it fails tests that are right.

    Read when a deadline is set, not once at the start: the load a run meets changes as it
    goes (pytest-xdist's workers start together, before the one-minute load average has seen
    any of them; other work on the machine comes and goes). The workers count as load from
    the start."""
    explicit = os.environ.get("KIWI_TEST_SLOWDOWN")
    if explicit:
        return max(1.0, float(explicit))
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    load = max(1.0, max(os.getloadavg()[0], workers) / (os.cpu_count() or 1))
    return load * _SANITIZER_SLOWDOWN.get(os.environ.get("KIWI_TEST_SANITIZE", ""), 1.0)


def scaled(seconds: float) -> float:
    """A deadline of ``seconds`` on a quiet machine, stretched by the load factor now."""
    return seconds * load_factor()


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


def wait_event(event: threading.Event, timeout: float = 10.0, what: str = "the event") -> None:
    """Wait for ``event`` (a client's ``drop_requested``, say); fail the test with ``what``
    after ``timeout`` (a quiet machine's figure, stretched by the load factor)."""
    if not event.wait(scaled(timeout)):
        raise AssertionError(f"timed out after {scaled(timeout):.1f} s waiting for {what}")


def wait_on_client(client: Any, predicate: Callable[[], T], timeout: float = 10.0,
                   what: str = "condition") -> T:
    """``predicate()`` once it is truthy, for what a ``nodeside.client`` client learns on its
    own thread (``connected``, ``position``, ``holding``): checked again each time the client
    hears from the daemon or a connection comes or goes (``Client.wait_until``). No polling.
    Fails the test with ``what`` after ``timeout`` (a quiet machine's figure, stretched by the
    load factor)."""
    timeout = scaled(timeout)
    value = client.wait_until(predicate, timeout)
    if not value:
        raise AssertionError(f"timed out after {timeout:.1f} s waiting for {what}")
    return value


class StatusEvents:
    """One connection to the daemon that hears its ``changed`` events (hello feature
    ``changes``): ``wait_for`` reads the status document, and again after each change the daemon
    tells of, until what the test waits for shows. No polling, and one connection, however long
    it waits: the way to wait for something the document shows (a client queued, a holder
    changed). Not for what only counts down (``quantum_remaining``, ``gpu_seconds``, shares):
    the daemon tells of no change there (docs/protocol.md), so nothing would wake it."""

    def __init__(self, socket_path: str, timeout: float = 10.0) -> None:
        self.timeout = scaled(timeout)
        self.changes = 0  #: ``changed`` events heard so far
        self._session = ClientSession(features=[p.FEATURE_CHANGES])
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        #: What was read and not yet taken: replies, and the changes told since the last read
        #: of the document.
        self._inbox: list[events.Event] = []
        try:
            self._sock.connect(socket_path)
            self._session.connect()
            self._sock.sendall(self._session.data_to_send())
            self._take(lambda e: isinstance(e, (events.Ready, events.Refused)),
                       time.monotonic() + self.timeout)
            if p.FEATURE_CHANGES not in self._session.features:
                raise ConnectionError("the daemon does not tell of changes")
        except BaseException:
            self._sock.close()
            raise

    def status(self) -> dict[str, Any]:
        """The status document now."""
        seq = self._session.request(p.STATUS)
        self._sock.sendall(self._session.data_to_send())
        reply = self._take(lambda e: isinstance(e, events.Reply) and e.seq == seq,
                           time.monotonic() + self.timeout)
        document: dict[str, Any] = reply.message["status"]
        return document

    def wait_for(self, predicate: Callable[[dict[str, Any]], T], timeout: float = 10.0,
                 what: str = "condition") -> T:
        """``predicate(document)`` once it is truthy, reading the document at once and after
        each change the daemon tells of; fails the test with ``what`` after ``timeout``
        (a quiet machine's figure, stretched by the load factor)."""
        deadline = time.monotonic() + scaled(timeout)
        while True:
            # Changes told before this read are in the document it returns.
            self._inbox = [e for e in self._inbox if not isinstance(e, events.StatusChanged)]
            document = self.status()
            value = predicate(document)
            if value:
                return value
            try:
                self._take(lambda e: isinstance(e, events.StatusChanged), deadline)
            except TimeoutError:
                raise AssertionError(f"timed out after {scaled(timeout):.1f} s waiting for "
                                     f"{what}; the last document: {document}") from None

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> StatusEvents:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _take(self, wanted: Callable[[events.Event], bool], deadline: float) -> events.Event:
        """The first event read that is ``wanted``, reading until one comes."""
        while True:
            for i, event in enumerate(self._inbox):
                if wanted(event):
                    return self._inbox.pop(i)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("nothing from the daemon in time")
            self._sock.settimeout(left)
            try:
                data = self._sock.recv(1 << 20)
            except TimeoutError:
                raise TimeoutError("nothing from the daemon in time") from None
            if not data:
                raise ConnectionError("the daemon closed the connection")
            for event in self._session.receive_data(data):
                if isinstance(event, events.StatusChanged):
                    self.changes += 1
                if isinstance(event, (events.Ready, events.Refused, events.Reply,
                                      events.StatusChanged)):
                    self._inbox.append(event)


def wait_for_status(socket_path: str, predicate: Callable[[dict[str, Any]], T],
                    timeout: float = 10.0, what: str = "condition") -> T:
    """``StatusEvents.wait_for`` on a connection of its own."""
    with StatusEvents(socket_path) as watch:
        return watch.wait_for(predicate, timeout, what)


def client_state(document: dict[str, Any], name: str) -> str | None:
    """The state ("idle", "waiting", "holding") of the client registered as ``name``."""
    return next((c["state"] for c in document["clients"] if c["name"] == name), None)


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


def build_fake_nvml(directory: Path) -> Path:
    """The fake libnvidia-ml.so.1 (tests/shim/fake_nvml.c) built into ``directory``: a daemon
    started with ``directory`` first in LD_LIBRARY_PATH loads it through pynvml."""
    source = Path(__file__).resolve().parent / "shim" / "fake_nvml.c"
    subprocess.run(["gcc", "-std=c11", "-O1", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall",
                    "-Werror", "-Wl,-soname,libnvidia-ml.so.1",
                    "-o", str(directory / "libnvidia-ml.so.1"), str(source)],
                   check=True, capture_output=True, text=True)
    return directory
