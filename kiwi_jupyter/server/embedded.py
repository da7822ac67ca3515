"""A private ``kiwi-scheduler`` for a Jupyter server that finds no daemon on its node.

On a laptop or in Binder there is no node daemon, yet kernels need one to share the GPU. The
server then runs its own as a child, on a socket in a private temporary directory (so two
servers on one machine never share or steal each other's socket), restarts it when it dies and
stops it with the server.

So that ``kiwictl`` in a terminal finds it with no flag, the socket is published for the user as
a symlink at ``nodeside.client.discovery.published_socket_path()`` (``$XDG_RUNTIME_DIR/kiwi/
scheduler.sock``, else in Jupyter's runtime directory), where kiwictl looks after the node's
default; the link is removed on shutdown. With several servers, the latest one's is published.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from nodeside import protocol
from nodeside.client import discovery
from nodeside.protocol import events
from nodeside.protocol.client_session import ClientSession

log = logging.getLogger(__name__)


class EmbeddedSchedulerError(RuntimeError):
    """The embedded scheduler could not be started; the message says why."""


def daemon_answers(socket_path: str, timeout: float = 1.0) -> bool:
    """Whether a Kiwi daemon answers ``hello`` at ``socket_path`` within ``timeout`` seconds.

    A socket file alone proves nothing (a crashed daemon leaves one behind), and any listener
    is not enough either: only a welcome in our protocol version counts.
    """
    session = ClientSession(software=None)  # a bare hello: {"op":"hello","version":1}
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(socket_path)
            session.connect()
            sock.sendall(session.data_to_send())
            said: list[events.Event] = []
            while not said:
                chunk = sock.recv(4096)
                if not chunk:
                    return False
                said = session.receive_data(chunk)
        return isinstance(said[0], events.Ready)
    except (OSError, ValueError, protocol.ProtocolError):
        return False


def default_command() -> list[str]:
    """``kiwi-scheduler`` beside this Python (the venv's), else the one on PATH."""
    beside = Path(sys.executable).with_name("kiwi-scheduler")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("kiwi-scheduler")
    return [found] if found else [sys.executable, "-m", "nodeside.daemon.main"]


class EmbeddedScheduler:
    """One child ``kiwi-scheduler`` on a private socket, started, watched and stopped."""

    def __init__(
        self,
        command: Sequence[str],
        extra_args: Sequence[str] = (),
        *,
        start_timeout: float = 15.0,
        publish: bool = True,
        state_file: str | os.PathLike[str] | None = None,
    ) -> None:
        self._directory = tempfile.mkdtemp(prefix="kiwi-")
        #: Short on purpose: Unix socket paths are limited to about 100 bytes.
        self.socket_path = os.path.join(self._directory, "scheduler.sock")
        #: Where the child keeps runtime changes (mode, TQ) across its restarts; removed by stop.
        self.state_file = Path(state_file) if state_file is not None else None
        kept = ["--state-file", str(self.state_file)] if self.state_file is not None else []
        self.command = [*command, "--socket", self.socket_path, *kept, *extra_args]
        self.start_timeout = start_timeout
        self.restarts = 0
        self.publish = publish
        #: Where the socket is published for kiwictl; None until started, or if it could not be.
        self.published: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        """Start the child and return once it answers on its socket (blocking: server start)."""
        # A server that ends by KeyboardInterrupt (Ctrl-C without a terminal) or sys.exit
        # never runs its extensions' stop; the child dies with it (parent-death signal), but
        # its folder and the link published for kiwictl would stay behind.
        atexit.register(self.stop)
        self._spawn()
        deadline = time.monotonic() + self.start_timeout
        while not daemon_answers(self.socket_path, timeout=0.5):
            self._check_starting(deadline)
            time.sleep(0.05)
        if self.publish:
            self.published = discovery.publish(self.socket_path)
            if self.published is None:
                log.warning("Kiwi: could not publish the scheduler's socket at %s; kiwictl needs "
                            "--socket %s", discovery.published_socket_path(), self.socket_path)

    async def restart_if_dead(self) -> bool:
        """Start a new child when the last one has exited; True when it did.

        Spawned from the event loop's thread, not a worker: Linux ties the child's
        parent-death signal to the thread that forked it.
        """
        if self._process is None or self._process.poll() is None:
            return False
        log.warning(
            "Kiwi: the embedded scheduler exited with status %s; starting it again",
            self._process.returncode,
        )
        self.restarts += 1
        self._spawn()
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + self.start_timeout
        while not await loop.run_in_executor(None, daemon_answers, self.socket_path, 0.5):
            self._check_starting(deadline)
            await asyncio.sleep(0.05)
        return True

    def _spawn(self) -> None:
        os.makedirs(self._directory, mode=0o700, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)  # left by a child that died; the new one binds here
        log.info("Kiwi: starting an embedded scheduler: %s", " ".join(self.command))
        try:
            self._process = subprocess.Popen(  # noqa: S603 - our own command line
                self.command, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent
            )
        except OSError as exc:
            raise EmbeddedSchedulerError(f"cannot run {self.command[0]}: {exc}") from exc

    def _check_starting(self, deadline: float) -> None:
        assert self._process is not None
        if self._process.poll() is not None:
            raise EmbeddedSchedulerError(
                f"kiwi-scheduler exited with status {self._process.returncode} at start; "
                "its log is above"
            )
        if time.monotonic() > deadline:
            self.stop()
            raise EmbeddedSchedulerError(
                f"kiwi-scheduler did not answer on {self.socket_path} "
                f"within {self.start_timeout:g} s"
            )

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the child (SIGTERM, then SIGKILL after ``timeout``) and remove its socket."""
        atexit.unregister(self.stop)
        if self.published is not None:
            discovery.unpublish(self.socket_path)
            self.published = None
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        shutil.rmtree(self._directory, ignore_errors=True)
        if self.state_file is not None:
            with contextlib.suppress(FileNotFoundError):
                self.state_file.unlink()


def _die_with_parent() -> None:
    """In the child: ask Linux to SIGTERM it when the server dies, even by SIGKILL, so a
    crashed server never leaves a scheduler behind."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
