"""The connection thread under ``Client``: it connects, reads every message and reconnects with
backoff when the daemon goes away (a restart must not kill a kernel).

What the protocol says (hello, register, the hold and its races, which reply answers what) is
``ClientSession``'s; this is its I/O shell. Every call on the session is made with ``_cond``
held, and what it has to send is sent at once, still under it, so lines leave in the order the
session made them. Caller threads write requests and wait on the condition for their replies.
One exception, for speed: a caller waiting for a grant borrows the socket and reads it itself
(``lending``). Every message is handled in ``_dispatch``, whichever thread read it.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from nodeside import protocol as p
from nodeside.client.backoff import Backoff
from nodeside.client.common import refusal
from nodeside.client.discovery import SOCKET_ENV, candidates, find_socket
from nodeside.client.lending import SocketLending
from nodeside.client.reader import WOKEN, LineReader
from nodeside.protocol import events as ev
from nodeside.protocol.client_session import ClientSession

Listener = Callable[[dict[str, Any]], None]


class Connection(SocketLending):
    """A daemon connection kept up by a thread of its own; the base of ``Client``."""

    def __init__(self, socket_path: str | None, *, register: bool,
                 reconnect_timeout: float, request_timeout: float,
                 features: tuple[str, ...] = (p.FEATURE_POSITION,)) -> None:
        #: None: look where ``discovery`` says on every connection attempt.
        self._explicit_socket = socket_path
        self.socket_path = find_socket(socket_path)
        self.reconnect_timeout = reconnect_timeout
        self.request_timeout = request_timeout
        self.drop_requested = threading.Event()
        self.mode: str | None = None
        self.tq: float | None = None
        self._session = ClientSession(features=features)
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
        self._replies: dict[int, dict[str, Any]] = {}
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

    _refusal: dict[str, Any] | None = None  # the daemon's error answer to our acquire
    _down_since: float | None = None

    @property
    def connected(self) -> bool:
        return self._connected

    @property
    def position(self) -> int | None:
        """This client's 1-based place in its GPU's queue while it waits, from the daemon's
        ``waiting`` reply and events; None while not waiting (or not known yet)."""
        return self._session.position

    @property
    def features(self) -> frozenset[str]:
        """The optional protocol features the daemon serves us (from its welcome)."""
        return self._session.features

    @property
    def id(self) -> str | None:
        """The daemon's id for this client, once registered."""
        return self._session.client_id

    @property
    def last_drop(self) -> dict[str, Any] | None:
        """The last drop request: {"reason", "evict", "grace"}; None until one comes."""
        return self._session.last_drop

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
            self._session.connection_lost()
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
        with self._cond:
            if self._closed:
                raise ConnectionError("the client was closed")
            if not self._connected:  # lost again since
                raise ConnectionError(self._unreachable())
            seq = self._session.request(op, **fields)
            self._flush()
        return self._await_reply(seq, op, deadline)

    def _await_reply(self, seq: int, op: str, deadline: float) -> dict[str, Any]:
        with self._cond:
            generation = self._session.generation
            while seq not in self._replies:
                if self._closed or self._session.generation != generation or \
                        not self._connected:
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
                wanted = self._session.wanted
                if self._attempts > attempts and not wanted:
                    raise ConnectionError(self._unreachable())
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (wanted and self._down_too_long()):
                    raise ConnectionError(self._unreachable())
                self._cond.wait(min(remaining, 0.1))

    def _flush(self) -> None:
        """Send what the session has to send (with ``_cond`` held); ConnectionError when the
        connection is gone, which its thread sees too."""
        data = self._session.data_to_send()
        if data:
            self._send(data)

    def _flush_quietly(self) -> None:
        """``_flush``, for lines nobody waits on: a connection that is going takes what they
        asked with it, and the next one asks again where the session still wants it."""
        try:  # noqa: SIM105 - suppress() would make an object for every line read
            self._flush()
        except ConnectionError:
            pass

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
        backoff = Backoff(0.05, 2.0)
        while not self._closed:
            try:
                sock = self._connect()
            except OSError as exc:
                with self._cond:
                    self._attempts += 1
                    self._last_error = exc.strerror or str(exc)
                    if self._down_since is None:
                        self._down_since = time.monotonic()
                    self._session.connection_lost()
                    self._cond.notify_all()
                    self._cond.wait(backoff.next())
                continue
            backoff.reset()
            self._read()
            with self._cond:
                self._socket_lent_to = None
                self._connected = False
                self._sock = None
                self._down_since = time.monotonic()
                if self._session.wanted:
                    # The GPU was taken with the connection; the session asks for it back on
                    # the next one.
                    self.drop_requested.set()
                self._session.connection_lost()
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
            with self._cond:
                self._session.connect(self._registration() if self._register else None)
                hello = self._session.data_to_send()
            sock.sendall(hello)
            while not self._handshake(sock, reader):
                pass
        except BaseException:
            sock.close()
            raise
        return sock

    def _handshake(self, sock: socket.socket, reader: LineReader) -> bool:
        """Read one line of the handshake; True once the connection is ready."""
        message = reader.next()
        if message is None:
            raise ConnectionResetError("the Kiwi scheduler closed the connection")
        sock.settimeout(None)  # outside the lock, should this be the handshake's end
        # One critical section from the session's look at whether we want the GPU to
        # _connected: request() asks by itself only on a ready connection, so one made ready
        # between the two would be asked by nobody, and a caller that watches its position
        # instead of waiting for the grant would wait for ever.
        with self._cond:
            happened = self._session.receive(message)
            out = self._session.data_to_send()
            if any(isinstance(e, ev.Refused) for e in happened):
                raise ConnectionRefusedError(f"the Kiwi scheduler refused us: "
                                             f"{message.get('message', message.get('op'))}")
            if not any(isinstance(e, ev.Ready) for e in happened):
                sock.settimeout(self.request_timeout)
                sock.sendall(out)  # register, after the welcome
                return False
            sock.sendall(out)  # the acquire we want, a working set reported meanwhile
            self._sock = sock
            self._reader = reader
            self.mode, self.tq = self._session.mode, self._session.tq
            self._connected = True
            self._down_since = None
            self._cond.notify_all()
        return True

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
        with self._cond:
            for event in self._session.receive(message):
                self._react(event)
            # A line the session answers by itself (asking again after a release of ours).
            self._flush_quietly()
            self._cond.notify_all()
        if message.get("seq") is None:
            for listener in list(self._listeners):
                with contextlib.suppress(Exception):
                    listener(message)

    def _react(self, event: ev.Event) -> None:
        """What this shell does about an event (with ``_cond`` held; the session has moved
        the hold already)."""
        if isinstance(event, ev.Reply):
            self._replies[event.seq] = event.message
        elif isinstance(event, ev.Granted):
            self.drop_requested.clear()
        elif isinstance(event, ev.DropAsked) or (isinstance(event, ev.Revoked) and event.held):
            self.drop_requested.set()
        elif isinstance(event, ev.AskRefused):
            self._refusal = event.message  # for the caller waiting for the grant
        elif isinstance(event, ev.ModeChanged):
            self.mode, self.tq = self._session.mode, self._session.tq
        elif isinstance(event, ev.EvictAsked):
            self._evict_asked(event)

    def _evict_asked(self, event: ev.EvictAsked) -> None:
        """The daemon asks us to move our memory out (feature ``memory``); ``Client`` does."""

    def _down_too_long(self) -> bool:
        return self._down_since is not None and \
            time.monotonic() - self._down_since > self.reconnect_timeout

    def _unreachable(self) -> str:
        looked = candidates(self._explicit_socket)
        others = [path for path in looked if path != self.socket_path]
        also = f" (also looked at {', '.join(others)})" if others else ""
        return (f"cannot reach the Kiwi scheduler at {self.socket_path}: {self._last_error}"
                f"{also}; point elsewhere with {SOCKET_ENV}=PATH")
