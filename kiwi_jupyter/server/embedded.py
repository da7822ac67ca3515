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
import collections
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from nodeside import protocol
from nodeside.client import discovery
from nodeside.protocol import events
from nodeside.protocol.client_session import ClientSession

log = logging.getLogger(__name__)


#: kiwi-scheduler's exit status for a bad command line (argparse's): starting it again with the
#: same arguments cannot help.
USAGE_ERROR = 2


class EmbeddedSchedulerError(RuntimeError):
    """The embedded scheduler could not be started; the message says why. ``final``: its
    command line is wrong, and starting it again cannot help (fix the options first)."""

    def __init__(self, message: str, *, final: bool = False) -> None:
        super().__init__(message)
        self.final = final


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
        #: The child's last log lines (its stderr, passed on to the server's): the reason for a
        #: failed start is there.
        self._last_lines: collections.deque[str] = collections.deque(maxlen=5)
        self._log_thread: threading.Thread | None = None

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
        self._publish()

    def _publish(self) -> None:
        """Publish the socket for kiwictl, once the child answers on it."""
        if not self.publish or self.published is not None:
            return
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
        self._publish()  # not yet, when the first start failed
        return True

    def _spawn(self) -> None:
        os.makedirs(self._directory, mode=0o700, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)  # left by a child that died; the new one binds here
        log.info("Kiwi: starting an embedded scheduler: %s", " ".join(self.command))
        try:
            self._process = subprocess.Popen(  # noqa: S603 - our own command line
                self.command, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                preexec_fn=_die_with_parent
            )
        except OSError as exc:
            raise EmbeddedSchedulerError(f"cannot run {self.command[0]}: {exc}",
                                         final=True) from exc
        self._last_lines.clear()
        self._log_thread = threading.Thread(target=self._pass_on_log, args=(self._process,),
                                            name="kiwi-scheduler-log", daemon=True)
        self._log_thread.start()

    def _pass_on_log(self, process: subprocess.Popen[bytes]) -> None:
        """Copy the child's log to the server's stderr as it comes, keeping its last lines."""
        assert process.stderr is not None
        out = getattr(sys.stderr, "buffer", None)
        with process.stderr:
            for line in process.stderr:
                text = line.decode("utf-8", "replace").rstrip()
                if text:
                    self._last_lines.append(text)
                with contextlib.suppress(OSError, ValueError):
                    if out is not None:
                        out.write(line)
                        out.flush()
                    else:
                        sys.stderr.write(line.decode("utf-8", "replace"))

    def _check_starting(self, deadline: float) -> None:
        assert self._process is not None
        status = self._process.poll()
        if status is not None:
            if self._log_thread is not None:
                self._log_thread.join(timeout=2.0)  # its last words are the reason
            said = self._last_lines[-1] if self._last_lines else "it said nothing"
            raise EmbeddedSchedulerError(
                f"kiwi-scheduler exited with status {status} at start: {said}",
                final=status == USAGE_ERROR)
        if time.monotonic() > deadline:
            self._terminate()  # a later restart_if_dead tries again
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
        self._terminate(timeout)
        self._process = None
        shutil.rmtree(self._directory, ignore_errors=True)
        if self.state_file is not None:
            with contextlib.suppress(FileNotFoundError):
                self.state_file.unlink()


    def _terminate(self, timeout: float = 5.0) -> None:
        """End the child if it runs: SIGTERM, then SIGKILL after ``timeout``."""
        process = self._process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _die_with_parent() -> None:
    """In the child: ask Linux to SIGTERM it when the server dies, even by SIGKILL, so a
    crashed server never leaves a scheduler behind."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
