"""The Python client of the node daemon (CONTRACT section 4); ``kiwi_jupyter.Client`` is this.

A background thread owns the socket: it connects, says hello, registers, reads every message
and reconnects with backoff when the daemon goes away (a restart must not kill a kernel). Caller
threads write requests and wait on a condition for their replies, so ``acquire`` can be
interrupted (Ctrl-C in a notebook) and then cancels its request. ``acquire`` also comes in two
halves, ``request`` and ``wait_for_grant``, for callers that have work to do while the request
travels (the notebook kernel asks when a cell starts and waits in the cell's first statement).

One exception, for speed: a caller blocked in ``acquire`` borrows the socket and reads it
itself, so a grant wakes the thread that waits for it directly instead of waking the
connection thread, which would then have to wake the caller (each wake-up of a sleeping thread
costs tens of microseconds on a busy machine, and a handoff is mostly wake-ups). The connection
thread stands aside while the socket is lent and takes it back when ``acquire`` returns; it
alone connects and reconnects.

Holds do not survive a daemon restart: while disconnected the client holds nothing; a client
that wanted the GPU when the daemon went away asks for it again as soon as it is back.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from nodeside import __version__
from nodeside import protocol as p
from nodeside.config import DEFAULT_POOL, DEFAULT_SOCKET

Listener = Callable[[dict[str, Any]], None]

_BACKOFF_START = 0.05
_BACKOFF_MAX = 2.0


class KiwiError(RuntimeError):
    """The daemon refused a request; ``code`` is the protocol's error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _env_priority(value: str | None) -> str:
    priority = (value or os.environ.get("KIWI_PRIORITY") or "NORMAL").upper()
    if priority not in p.PRIORITIES:
        raise ValueError(f"priority must be one of {', '.join(p.PRIORITIES)}, not {priority!r}")
    return priority


def default_name() -> str:
    return os.environ.get("KIWI_CLIENT_NAME") or f"{os.path.basename(sys.argv[0] or 'python')}" \
        f"-{os.getpid()}"


class Client:
    """A connection to the node daemon that can hold one GPU.

    Arguments left as None come from the environment: ``KIWI_SOCKET``, ``KIWI_CLIENT_NAME``,
    ``KIWI_POOL``, ``KIWI_PRIORITY``, ``KIWI_GPU`` (default 0). ``register=False`` makes a
    control-only connection that holds nothing (what ``kiwictl`` uses). ``reconnect_timeout``
    bounds how long a call waits for an unreachable daemon before it fails with ConnectionError.
    """

    def __init__(self, socket_path: str | None = None, *, name: str | None = None,
                 pool: str | None = None, priority: str | None = None, gpu: int | None = None,
                 register: bool = True, kind: str = "client",
                 labels: dict[str, str] | None = None, reconnect_timeout: float = 30.0,
                 request_timeout: float = 10.0) -> None:
        self.socket_path = socket_path or os.environ.get("KIWI_SOCKET") or DEFAULT_SOCKET
        self.name = name or default_name()
        self.pool = pool or os.environ.get("KIWI_POOL") or DEFAULT_POOL
        self.priority = _env_priority(priority)
        # In Kubernetes the device plugin sets KIWI_GPU to the host index of the pod's GPU
        # (inside the container that GPU is CUDA device 0, but the node daemon counts host GPUs).
        self.gpu = gpu if gpu is not None else int(os.environ.get("KIWI_GPU") or 0)
        self.kind = kind
        self.labels = labels if labels is not None else _pod_labels()
        self.reconnect_timeout = reconnect_timeout
        self.request_timeout = request_timeout
        self.drop_requested = threading.Event()
        #: The last drop request: {"reason", "evict", "grace"}; None until one comes.
        self.last_drop: dict[str, Any] | None = None
        self.id: str | None = None
        self.mode: str | None = None
        self.tq: float | None = None
        self._register = register
        lock = threading.RLock()
        self._cond = threading.Condition(lock)
        # The connection thread waits on this one (same lock) while it has lent the socket, so
        # that the messages the borrower handles, which notify self._cond, do not wake it.
        self._socket_returned = threading.Condition(lock)
        self._send_lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._connected = False
        self._closed = False
        self._holding = False
        self._wanted = False  # an acquire is pending or held: re-ask after a reconnect
        self._working_set: int | None = None
        self._replies: dict[int, dict[str, Any]] = {}
        self._seq = itertools.count(1)
        self._generation = 0  # bumps on every (re)connection, so waiters see a drop in between
        self._attempts = 0
        self._last_error = "not connected yet"
        self._listeners: list[Listener] = []
        # Lending the socket to a waiting caller (see the module's docstring): the thread that
        # asked for it, the thread that has it, and a wire to wake the connection thread out of
        # its poll so that it hands the socket over.
        self._socket_wanted: int | None = None
        self._socket_lent_to: int | None = None
        self._wake_rx, self._wake_tx = socket.socketpair()
        self._wake_rx.setblocking(False)
        self._wake_tx.setblocking(False)
        self._thread = threading.Thread(target=self._run, name="kiwi-client", daemon=True)
        self._thread.start()

    # -- the public API ------------------------------------------------------------------

    @property
    def holding(self) -> bool:
        return self._holding

    @property
    def connected(self) -> bool:
        return self._connected

    @property
    def last_error(self) -> str:
        """Why the latest connection attempt failed, for messages to people."""
        return self._last_error

    def acquire(self, timeout: float | None = None) -> None:
        """Block until this client holds its GPU. TimeoutError on timeout; ConnectionError if
        the daemon cannot be reached within the timeout (or ``reconnect_timeout``)."""
        self.request()
        if self.wait_for_grant(timeout):
            return
        connected = self._connected
        position = self._position_hint() if connected else "unknown"
        self._cancel()  # the GPU is never granted to a caller that stopped waiting
        if not connected:
            raise ConnectionError(self._unreachable())
        raise TimeoutError(f"no GPU within the timeout (queue position {position})")

    def request(self) -> None:
        """Ask for the GPU and return at once: ``acquire`` in two halves, "ask now, wait later".

        ``wait_for_grant`` waits for the answer, ``release`` withdraws the request. A caller
        with work to do before it needs the GPU (a kernel compiling a cell) overlaps the round
        trip to the daemon with that work. A no-op while holding or already asking; while the
        daemon is away, the request goes out when it is back.
        """
        if not self._register:
            raise RuntimeError("a control-only client (register=False) cannot hold a GPU")
        with self._cond:
            if self._holding or self._wanted:
                return
            self._wanted = True
            self._asked_in = -1  # not asked on any connection yet
            self._refusal = None
            self._ask_locked()

    def wait_for_grant(self, timeout: float | None = None) -> bool:
        """After ``request``: block until the GPU is held (True) or ``timeout`` passes (False;
        the request stays queued, or goes out when an absent daemon is back). An interrupt, a
        refusal (KiwiError) or a daemon unreachable for longer than ``reconnect_timeout``
        (ConnectionError) withdraws the request."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            return self._wait_for_grant(deadline)
        except BaseException:
            # Take the request back, so the GPU is never granted to a caller that stopped
            # waiting.
            self._cancel()
            raise

    def release(self) -> None:
        """Give the GPU back, or cancel a pending request. A no-op when neither."""
        with self._cond:
            wanted, self._wanted = self._wanted, False
            held, self._holding = self._holding, False
            connected = self._connected
        if not (wanted and connected):
            return
        with contextlib.suppress(ConnectionError):
            if held:
                # No answer to wait for: nothing the daemon sends can cross the release of a
                # hold, and not waiting keeps this process off the CPU while the GPU changes
                # hands. A cancelled wait is different: see _cancel.
                self._send(p.encode(p.RELEASE))
            else:
                self._cancel()

    def report_working_set(self, nbytes: int, evictable: int | None = None) -> None:
        if nbytes < 0:
            raise ValueError("working set must not be negative")
        with self._cond:  # against _connect: either it sends this, or we do
            self._working_set = nbytes
            connected = self._connected
        if connected:
            self._request(p.WORKING_SET, bytes=int(nbytes), evictable=evictable)

    def status(self) -> dict[str, Any]:
        return self._request(p.STATUS)["status"]

    def set_mode(self, mode: str) -> None:
        if mode not in p.MODES:
            raise ValueError(f"mode must be one of {', '.join(p.MODES)}, not {mode!r}")
        self._admin(p.SET_MODE, mode=mode)

    def set_tq(self, seconds: float, gpu: int | None = None) -> None:
        if not seconds > 0:
            raise ValueError("TQ must be a positive number of seconds")
        self._admin(p.SET_TQ, tq=float(seconds), gpu=gpu)

    def ping(self) -> float:
        """Round trip to the daemon, in seconds."""
        start = time.perf_counter()
        self._request(p.PING)
        return time.perf_counter() - start

    @contextlib.contextmanager
    def hold(self, timeout: float | None = None) -> Iterator[Client]:
        self.acquire(timeout)
        try:
            yield self
        finally:
            self.release()

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(message)`` for every event received: from the client's thread, or
        from a thread blocked in ``acquire`` while it reads the socket itself."""
        self._listeners.append(listener)

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._holding = False
            self._cond.notify_all()
            self._socket_returned.notify_all()
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
            if not self._thread.is_alive():
                self._wake_rx.close()
                self._wake_tx.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- waiting --------------------------------------------------------------------------

    def _wait_for_grant(self, deadline: float | None) -> bool:
        with self._cond:
            try:
                return self._wait_for_grant_locked(deadline)
            finally:
                self._return_socket()

    def _wait_for_grant_locked(self, deadline: float | None) -> bool:
        """Wait with self._cond held; False on timeout."""
        while not self._holding:
            if self._closed:
                raise ConnectionError("the client was closed")
            if self._refusal is not None:
                refusal, self._refusal = self._refusal, None
                raise KiwiError(refusal.get("code", "?"), refusal.get("message", "refused"))
            if not self._wanted:
                raise RuntimeError("no request to wait for: call request() first, "
                               "or the request was withdrawn")
            self._ask_locked()
            remaining = self._remaining(deadline)
            if remaining is not None and remaining <= 0:
                return False
            if not self._connected and self._down_too_long():
                raise ConnectionError(self._unreachable())
            if self._connected and self._asked_in == self._generation and self._ask_seq is None:
                # Queued (the answer to our acquire came, and it was not a grant): from here
                # the grant comes as an event, best read by this thread. Not earlier: the
                # wake-up this costs the connection thread is better spent while another
                # holds the GPU than while it changes hands, and an immediate grant needs no
                # socket.
                self._borrow_socket()
            self._wait(0.1 if remaining is None else min(remaining, 0.1))
        return True

    def _ask_locked(self) -> None:
        """Send our acquire on a connection it has not gone out on yet, without waiting for
        the answer (``_dispatch`` takes it). Called with ``_cond`` held; the connection thread
        asks by itself when it reconnects while we want the GPU."""
        if not self._connected or self._asked_in == self._generation:
            return
        self._asked_in = self._generation
        self._ask_seq = next(self._seq)
        # A send that fails means the connection is going: its thread sees the loss, and the
        # next connection asks again because we still want the GPU.
        with contextlib.suppress(ConnectionError):
            self._send(p.encode(p.ACQUIRE, seq=self._ask_seq))

    def _cancel(self) -> None:
        """Take back a request. Waits for the daemon's answer: a grant that crossed the
        cancel arrives before it, and is then ignored because we no longer want the GPU."""
        with self._cond:
            self._wanted = False
            self._holding = False
            connected = self._connected and not self._closed
        if connected:
            with contextlib.suppress(ConnectionError, TimeoutError, KiwiError):
                self._request(p.RELEASE)

    def _position_hint(self) -> str:
        try:
            client = next(c for c in self.status()["clients"] if c["id"] == self.id)
            return str(client["queue_position"])
        except Exception:
            return "unknown"

    # -- requests -------------------------------------------------------------------------

    def _admin(self, op: str, **fields: Any) -> None:
        try:
            reply = self._request(op, **fields)
        except KiwiError as exc:
            if exc.code == p.E_PERMISSION:
                raise PermissionError(str(exc)) from None
            if exc.code == p.E_INVALID:
                raise ValueError(str(exc)) from None
            raise
        self.mode, self.tq = reply.get("mode", self.mode), reply.get("tq", self.tq)

    def _request(self, op: str, *, deadline: float | None = None,
                 **fields: Any) -> dict[str, Any]:
        if deadline is None:
            deadline = time.monotonic() + self.request_timeout
        self._await_connection(deadline)
        seq = next(self._seq)
        with self._cond:
            generation = self._generation
        self._send(p.encode(op, seq=seq, **fields))
        with self._cond:
            while seq not in self._replies:
                if self._closed or self._generation != generation or not self._connected:
                    raise ConnectionError(f"lost the Kiwi scheduler at {self.socket_path} "
                                          f"while waiting for the reply to {op}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"the Kiwi scheduler did not answer {op} in time")
                self._wait(min(remaining, 0.5))
            reply = self._replies.pop(seq)
        if reply["op"] == p.ERROR:
            raise KiwiError(reply.get("code", "?"), reply.get("message", "refused"))
        return reply

    def _await_connection(self, deadline: float) -> None:
        """Wait for a live connection. Fails fast when the daemon refused the latest try and
        we are not in the middle of a reconnect that the caller can afford to wait for."""
        with self._cond:
            attempts = self._attempts
            while not self._connected:
                if self._closed:
                    raise ConnectionError("the client was closed")
                if self._attempts > attempts and not self._wanted:
                    raise ConnectionError(self._unreachable())
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self._wanted and self._down_too_long()):
                    raise ConnectionError(self._unreachable())
                self._cond.wait(min(remaining, 0.1))

    def _send(self, data: bytes) -> None:
        sock = self._sock
        if sock is None:
            raise ConnectionError(self._unreachable())
        try:
            with self._send_lock:
                sock.sendall(data)
        except OSError as exc:
            raise ConnectionError(f"lost the Kiwi scheduler at {self.socket_path}: {exc}") \
                from None

    # -- lending the socket to a waiting caller -------------------------------------------

    def _borrow_socket(self) -> None:
        """Ask the connection thread for the socket (with self._cond held). It hands it over
        when it next looks, which the byte sent here makes at once; until then, and whenever it
        is not lent to us, we wait on the condition as any caller does."""
        if self._socket_wanted is not None:
            return  # another thread of ours is waiting for a grant and reads for both
        self._socket_wanted = threading.get_ident()
        with contextlib.suppress(OSError):  # a full wire has a wake-up in it already
            self._wake_tx.send(b"!")

    def _return_socket(self) -> None:
        """Give the socket back to the connection thread (with self._cond held)."""
        if self._socket_wanted != threading.get_ident():
            return
        self._socket_wanted = None
        if self._socket_lent_to is not None:
            self._socket_lent_to = None
            self._socket_returned.notify()

    def _wait(self, timeout: float) -> None:
        """Wait (with self._cond held) for something to change: on the condition, or, while
        the socket is lent to this thread, on the socket itself, handling what arrives."""
        if self._socket_lent_to != threading.get_ident():
            self._cond.wait(timeout)
            return
        reader = self._reader
        self._cond.release()
        try:
            if reader.wait(timeout):
                # From the read to the last message handled, an interrupt (Ctrl-C lands in
                # this thread) would lose what was read, so the reader counts as done until
                # then: if one comes, the connection thread reconnects rather than go on with
                # a stream it can no longer trust. An interrupt while waiting loses nothing.
                reader.done = True
                messages = reader.take()
                if messages is not None:
                    for message in messages:
                        self._dispatch(message)
                    reader.done = False
        except (OSError, p.ProtocolError):
            reader.done = True
        finally:
            self._cond.acquire()
        if reader.done:
            # The connection ended or broke: the connection thread, given the socket back,
            # finds the reader done and reconnects, as when it sees that itself.
            self._socket_lent_to = None
            self._socket_returned.notify()

    def _lend_socket(self) -> None:
        """On the connection thread, with self._cond held: lend the socket to a caller that
        asked for it, and wait until it comes back."""
        self._socket_lent_to = self._socket_wanted
        self._cond.notify_all()
        while self._socket_lent_to is not None and not self._closed:
            self._socket_returned.wait()

    # -- the connection thread ------------------------------------------------------------

    _asked_in = -1  # the connection generation our acquire last went out on
    _ask_seq: int | None = None  # the seq of that acquire, whose answer nobody waits on
    _refusal: dict[str, Any] | None = None  # the daemon's error answer to it
    _down_since: float | None = None

    def _run(self) -> None:
        backoff = _BACKOFF_START
        while not self._closed:
            try:
                sock = self._connect()
            except OSError as exc:
                with self._cond:
                    self._attempts += 1
                    self._last_error = exc.strerror or str(exc)
                    if self._down_since is None:
                        self._down_since = time.monotonic()
                    self._cond.notify_all()
                    self._cond.wait(backoff)
                backoff = min(backoff * 2, _BACKOFF_MAX)
                continue
            backoff = _BACKOFF_START
            self._read(sock)
            with self._cond:
                self._socket_lent_to = None
                self._connected = False
                self._holding = False
                self._sock = None
                self._down_since = time.monotonic()
                if self._wanted:
                    # The GPU was taken with the connection; ask for it back on the next one.
                    self.drop_requested.set()
                self._cond.notify_all()
            with contextlib.suppress(OSError):
                sock.close()

    def _connect(self) -> socket.socket:
        """Connect, say hello and register; synchronously, before anyone else may write."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.request_timeout)
            sock.connect(self.socket_path)
            reader = _LineReader(sock, self._wake_rx)
            sock.sendall(p.encode(p.HELLO, version=p.VERSION,
                                  software=f"nodeside.client {__version__}"))
            welcome = reader.expect(p.WELCOME)
            if self._register:
                registered_working_set = self._working_set
                sock.sendall(p.encode(p.REGISTER, name=self.name, pool=self.pool,
                                      priority=self.priority, gpu=self.gpu, kind=self.kind,
                                      labels=self.labels or None,
                                      working_set=registered_working_set))
                registered = reader.expect(p.REGISTERED)
            with self._cond:
                asked = self._register and self._wanted
                if asked:
                    sock.sendall(p.encode(p.ACQUIRE))
            sock.settimeout(None)
        except BaseException:
            sock.close()
            raise
        with self._cond:
            self._sock = sock
            self._reader = reader
            self.mode, self.tq = welcome.get("mode"), welcome.get("tq")
            if self._register:
                self.id = registered["client"]
                self.tq = registered.get("tq", self.tq)
                if self._working_set != registered_working_set:
                    # Reported while we registered, when report_working_set saw no connection.
                    sock.sendall(p.encode(p.WORKING_SET, seq=next(self._seq),
                                          bytes=int(self._working_set or 0)))
            self._connected = True
            self._down_since = None
            self._generation += 1
            if asked:
                self._asked_in = self._generation
                self._ask_seq = None  # that acquire carries no seq: its answer is an event
            self._cond.notify_all()
        return sock

    def _read(self, sock: socket.socket) -> None:
        reader = self._reader
        while not self._closed:
            if self._socket_wanted is not None:
                with self._cond:
                    if self._socket_wanted is not None and not reader.done:
                        self._lend_socket()
            if reader.done:
                return
            try:
                message = reader.next(woken=True)
            except (OSError, p.ProtocolError):
                return
            if message is None:
                return
            if message is not _WOKEN:
                self._dispatch(message)

    def _dispatch(self, message: dict[str, Any]) -> None:
        op = message.get("op")
        with self._cond:
            if op == p.GRANT:
                if self._wanted:  # else a grant that crossed our cancel: see _cancel
                    self._holding = True
                    self.drop_requested.clear()
            elif op == p.DROP:
                self.last_drop = message
                self.drop_requested.set()
            elif op == p.REVOKED:
                self._holding = False
                self._wanted = False
                self.drop_requested.set()
            elif op == p.MODE:
                self.mode, self.tq = message.get("mode"), message.get("tq")
            seq = message.get("seq")
            if seq is not None and seq == self._ask_seq:
                # The answer to our acquire: a grant is handled above, "waiting" needs nothing.
                self._ask_seq = None
                if op == p.ERROR and self._wanted:
                    self._refusal = message
            elif seq is not None:
                self._replies[seq] = message
            self._cond.notify_all()
        if seq is None:
            for listener in list(self._listeners):
                with contextlib.suppress(Exception):
                    listener(message)

    def _remaining(self, deadline: float | None) -> float | None:
        return None if deadline is None else deadline - time.monotonic()

    def _down_too_long(self) -> bool:
        return self._down_since is not None and \
            time.monotonic() - self._down_since > self.reconnect_timeout

    def _unreachable(self) -> str:
        return f"cannot reach the Kiwi scheduler at {self.socket_path}: {self._last_error}"


#: What ``_LineReader.next`` returns when woken by the wire instead of a message.
_WOKEN: dict[str, Any] = {}


class _LineReader:
    """Reads protocol lines from a blocking socket; one thread at a time."""

    def __init__(self, sock: socket.socket, wake: socket.socket) -> None:
        self.sock = sock
        self.wake = wake
        self.buffer = p.LineBuffer(p.MAX_REPLY_BYTES)
        self.lines: list[bytes] = []
        #: The connection ended (or broke) while a borrowing caller read it.
        self.done = False
        self._socket_only = select.poll()
        self._socket_only.register(sock, select.POLLIN)
        self._socket_or_wake = select.poll()
        self._socket_or_wake.register(sock, select.POLLIN)
        self._socket_or_wake.register(wake, select.POLLIN)

    def next(self, woken: bool = False) -> dict[str, Any] | None:
        """The next message, or None at the end of the stream. With ``woken``, _WOKEN when
        the wake-up wire had data before the socket did."""
        if woken and not self.lines:
            ready = dict(self._socket_or_wake.poll())
            if self.wake.fileno() in ready:
                with contextlib.suppress(BlockingIOError):
                    self.wake.recv(64)
                return _WOKEN
        while not self.lines:
            data = self.sock.recv(65536)
            if not data:
                return None
            self.lines.extend(self.buffer.feed(data))
        return p.decode(self.lines.pop(0))

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for something to read."""
        return bool(self.lines) or bool(self._socket_only.poll(max(0, int(timeout * 1000) + 1)))

    def take(self) -> list[dict[str, Any]] | None:
        """What is there to read (maybe a part of a line, so no message); None at the end."""
        if not self.lines:
            data = self.sock.recv(65536)
            if not data:
                return None
            self.lines.extend(self.buffer.feed(data))
        lines, self.lines = self.lines, []
        return [p.decode(line) for line in lines]

    def expect(self, op: str) -> dict[str, Any]:
        message = self.next()
        if message is None:
            raise ConnectionResetError("the Kiwi scheduler closed the connection")
        if message.get("op") == p.ERROR:
            raise ConnectionRefusedError(f"the Kiwi scheduler refused us: "
                                         f"{message.get('message')}")
        if message.get("op") != op:
            raise ConnectionError(f"expected {op}, got {message.get('op')}")
        return message


def _pod_labels() -> dict[str, str]:
    """Pod and namespace for metrics, where Kubernetes' downward API put them."""
    labels = {}
    for key, env in (("pod", "KIWI_POD_NAME"), ("namespace", "KIWI_POD_NAMESPACE")):
        if os.environ.get(env):
            labels[key] = os.environ[env]
    return labels
