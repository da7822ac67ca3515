"""The connection thread under ``Client``: it connects, says hello, registers, reads every
message and reconnects with backoff when the daemon goes away (a restart must not kill a kernel).

Caller threads write requests and wait on a condition for their replies. One exception, for
speed: a caller waiting for a grant borrows the socket and reads it itself (``lending``).

Every message is handled in ``_dispatch``, whichever thread read it, so the hold state (holding,
wanted, the queue position, the last drop) lives here beside it; ``api.Client`` is what callers
do with that state.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from nodeside import protocol as p
from nodeside.client.common import HELLO_FIELDS, refusal
from nodeside.client.discovery import SOCKET_ENV, candidates, find_socket
from nodeside.client.lending import SocketLending
from nodeside.client.reader import WOKEN, LineReader

Listener = Callable[[dict[str, Any]], None]

_BACKOFF_START = 0.05
_BACKOFF_MAX = 2.0


class Connection(SocketLending):
    """A daemon connection kept up by a thread of its own; the base of ``Client``."""

    def __init__(self, socket_path: str | None, *, register: bool,
                 reconnect_timeout: float, request_timeout: float) -> None:
        #: None: look where ``discovery`` says on every connection attempt.
        self._explicit_socket = socket_path
        self.socket_path = find_socket(socket_path)
        self.reconnect_timeout = reconnect_timeout
        self.request_timeout = request_timeout
        self.drop_requested = threading.Event()
        #: The last drop request: {"reason", "evict", "grace"}; None until one comes.
        self.last_drop: dict[str, Any] | None = None
        #: This client's 1-based place in its GPU's queue while it waits, from the daemon's
        #: ``waiting`` reply and events; None while not waiting (or not known yet).
        self.position: int | None = None
        #: The optional protocol features the daemon serves us (from its welcome).
        self.features: frozenset[str] = frozenset()
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
        self._reader: LineReader | None = None
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
        # Lending the socket to a waiting caller (``lending``): the wire that wakes the
        # connection thread out of its poll so that it hands the socket over.
        self._socket_wanted = None
        self._socket_lent_to = None
        self._wake_rx, self._wake_tx = socket.socketpair()
        self._wake_rx.setblocking(False)
        self._wake_tx.setblocking(False)
        self._thread = threading.Thread(target=self._run, name="kiwi-client", daemon=True)
        self._thread.start()

    _asked_in = -1  # the connection generation our acquire last went out on
    _ask_seq: int | None = None  # the seq of that acquire, whose answer nobody waits on
    _refusal: dict[str, Any] | None = None  # the daemon's error answer to it
    _down_since: float | None = None

    @property
    def connected(self) -> bool:
        return self._connected

    @property
    def last_error(self) -> str:
        """Why the latest connection attempt failed, for messages to people."""
        return self._last_error

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(message)`` for every event received: from the client's thread, or
        from a thread blocked waiting for a grant while it reads the socket itself."""
        self._listeners.append(listener)

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._holding = False
            self.position = None
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

    def _registration(self) -> dict[str, Any]:
        """The fields of our register request; ``Client`` says who it is."""
        raise NotImplementedError

    # -- requests -------------------------------------------------------------------------

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
            raise refusal(reply)
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

    # -- the connection thread ------------------------------------------------------------

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
            self._read()
            with self._cond:
                self._socket_lent_to = None
                self._connected = False
                self._holding = False
                self.position = None
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
        # Given no path, look again each time: a Jupyter server may have published one since.
        self.socket_path = find_socket(self._explicit_socket)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.request_timeout)
            sock.connect(self.socket_path)
            reader = LineReader(sock, self._wake_rx)
            sock.sendall(p.encode(p.HELLO, **HELLO_FIELDS))
            welcome = reader.expect(p.WELCOME)
            if self._register:
                registered_working_set = self._working_set
                sock.sendall(p.encode(p.REGISTER, **self._registration(),
                                      working_set=registered_working_set))
                registered = reader.expect(p.REGISTERED)
            sock.settimeout(None)
            # One critical section from the look at _wanted to _connected: request() asks by
            # itself only on a connection it sees, so one made between the two would be asked
            # by nobody, and a caller that watches its position instead of waiting for the
            # grant would wait for ever.
            with self._cond:
                asked = self._register and self._wanted
                if asked:
                    sock.sendall(p.encode(p.ACQUIRE))
                if self._register and self._working_set != registered_working_set:
                    # Reported while we registered, when report_working_set saw no connection.
                    sock.sendall(p.encode(p.WORKING_SET, seq=next(self._seq),
                                          bytes=int(self._working_set or 0)))
                self._sock = sock
                self._reader = reader
                self.mode, self.tq = welcome.get("mode"), welcome.get("tq")
                self.features = frozenset(welcome.get("features") or ())
                if self._register:
                    self.id = registered["client"]
                    self.tq = registered.get("tq", self.tq)
                self._connected = True
                self._down_since = None
                self._generation += 1
                if asked:
                    self._asked_in = self._generation
                    self._ask_seq = None  # that acquire carries no seq: its answer is an event
                self._cond.notify_all()
        except BaseException:
            sock.close()
            raise
        return sock

    def _read(self) -> None:
        reader = self._reader
        assert reader is not None
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
            if message is not WOKEN:
                self._dispatch(message)

    def _dispatch(self, message: dict[str, Any]) -> None:
        op = message.get("op")
        with self._cond:
            if op == p.GRANT:
                if self._wanted:  # else a grant that crossed our cancel: see Client._cancel
                    self._holding = True
                    self.position = None
                    self.drop_requested.clear()
            elif op == p.WAITING:
                position = message.get("position")
                if self._wanted and not self._holding and isinstance(position, int):
                    self.position = position
            elif op == p.DROP:
                self.last_drop = message
                self.drop_requested.set()
            elif op == p.REVOKED:
                self._holding = False
                self._wanted = False
                self.position = None
                self.drop_requested.set()
            elif op == p.MODE:
                self.mode, self.tq = message.get("mode"), message.get("tq")
            seq = message.get("seq")
            if seq is not None and seq == self._ask_seq:
                self._answered(message)
            elif seq is not None:
                self._replies[seq] = message
            self._cond.notify_all()
        if seq is None:
            for listener in list(self._listeners):
                with contextlib.suppress(Exception):
                    listener(message)

    def _answered(self, message: dict[str, Any]) -> None:
        """The answer to our acquire (with self._cond held): a grant or a position is handled
        by ``_dispatch``; a refusal is kept for the waiting caller."""
        self._ask_seq = None
        if message.get("op") == p.ERROR and self._wanted:
            self._refusal = message

    def _down_too_long(self) -> bool:
        return self._down_since is not None and \
            time.monotonic() - self._down_since > self.reconnect_timeout

    def _unreachable(self) -> str:
        looked = candidates(self._explicit_socket)
        others = [path for path in looked if path != self.socket_path]
        also = f" (also looked at {', '.join(others)})" if others else ""
        return (f"cannot reach the Kiwi scheduler at {self.socket_path}: {self._last_error}"
                f"{also}; point elsewhere with {SOCKET_ENV}=PATH")
