"""``ClientConnection``: a connection to the daemon kept up by a thread of its own, which
connects, reads every message and reconnects with backoff when the daemon goes away (a restart
must not kill a kernel). ``Client`` holds one.

What the protocol says (hello, register, the hold and its races, which reply answers what) is
``ClientSession``'s; this is its I/O shell. Every call on the session is made with ``changed``
held, and what it has to send is sent at once, still under it, so lines leave in the order the
session made them. Caller threads write requests and wait on ``changed`` for their replies.
One exception, for speed: a caller waiting for a grant borrows the socket and reads it itself
(``lending``). Every message is handled in ``_dispatch``, whichever thread read it, and every
event the session reports goes to the owner's ``heard`` (with ``changed`` held).
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
from nodeside.client.lending import SocketLender
from nodeside.client.reader import WOKEN, LineReader
from nodeside.protocol import events as ev
from nodeside.protocol.client_session import ClientSession

Listener = Callable[[dict[str, Any]], None]


def _nothing(*_: object) -> None:
    pass


class ClientConnection:
    """The daemon, as one client reaches it across restarts.

    ``registration``: register's fields, asked for on every connection (None: a control-only
    connection that registers nothing). ``heard``: told of every event the session reports;
    ``lost``: told when a ready connection ends, and whether the GPU was wanted then; both with
    ``changed`` held, on whichever thread read it, and maybe before this constructor returns
    (the thread starts in it). ``features``: the optional protocol features to ask for.
    """

    def __init__(self, socket_path: str | None, *,
                 registration: Callable[[], dict[str, Any]] | None,
                 reconnect_timeout: float, request_timeout: float,
                 heard: Callable[[ev.Event], None] = _nothing,
                 lost: Callable[[bool], None] = _nothing,
                 features: tuple[str, ...] = (p.FEATURE_POSITION,)) -> None:
        #: None: look where ``discovery`` says on every connection attempt.
        self._explicit_socket = socket_path
        self.socket_path = find_socket(socket_path)
        self.reconnect_timeout = reconnect_timeout
        self.request_timeout = request_timeout
        self.session = ClientSession(features=list(features))
        #: Notified on every message handled and every connection made or lost; its lock
        #: guards the session and everything here.
        lock = threading.RLock()
        self.changed = threading.Condition(lock)
        self.mode: str | None = None
        self.tq: float | None = None
        self.last_error = "not connected yet"
        self._registration = registration
        self._heard = heard
        self._lost = lost
        self._lender = SocketLender(self.changed, lock)
        self._send_lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._reader: LineReader | None = None
        self._connected = False
        self._closed = False
        self._replies: dict[int, dict[str, Any]] = {}
        self._attempts = 0
        self._down_since: float | None = None
        self._listeners: list[Listener] = []
        self._thread = threading.Thread(target=self._run, name="kiwi-client", daemon=True)
        self._thread.start()

    @property
    def connected(self) -> bool:
        return self._connected

    @property
    def closed(self) -> bool:
        return self._closed

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(message)`` for every event received: from the connection's thread,
        or from a thread blocked waiting for a grant while it reads the socket itself."""
        self._listeners.append(listener)

    def close(self) -> None:
        with self.changed:
            if self._closed:
                return
            self._closed = True
            self.session.connection_lost()
            self.changed.notify_all()
            self._lender.stop()
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)
            if not self._thread.is_alive():
                self._lender.close()

    # -- requests (callers' threads) --------------------------------------------------------

    def request(self, op: str, *, deadline: float | None = None,
                **fields: Any) -> dict[str, Any]:
        """One request and its reply; KiwiError when the reply is an error, ConnectionError
        when the daemon cannot be reached or goes away, TimeoutError past ``deadline``."""
        if deadline is None:
            deadline = time.monotonic() + self.request_timeout
        self._await_connection(deadline)
        with self.changed:
            if self._closed:
                raise ConnectionError("the client was closed")
            if not self._connected:  # lost again since
                raise ConnectionError(self.unreachable())
            seq = self.session.request(op, **fields)
            self.send_pending()
        return self.await_reply(seq, op, deadline)

    def await_reply(self, seq: int, op: str, deadline: float) -> dict[str, Any]:
        """The reply to the request numbered ``seq`` (already sent)."""
        with self.changed:
            generation = self.session.generation
            while seq not in self._replies:
                if self._closed or self.session.generation != generation or \
                        not self._connected:
                    raise ConnectionError(f"lost the Kiwi scheduler at {self.socket_path} "
                                          f"while waiting for the reply to {op}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"the Kiwi scheduler did not answer {op} in time")
                self.wait(min(remaining, 0.5))
            reply = self._replies.pop(seq)
        if reply["op"] == p.ERROR:
            raise refusal(reply)
        return reply

    def send_pending(self) -> None:
        """Send what the session has to send (with ``changed`` held); ConnectionError when the
        connection is gone, which its thread sees too."""
        data = self.session.data_to_send()
        if data:
            self._send(data)

    def send_pending_quietly(self) -> None:
        """``send_pending``, for lines nobody waits on: a connection that is going takes what
        they asked with it, and the next one asks again where the session still wants it."""
        try:  # noqa: SIM105 - suppress() would make an object for every line read
            self.send_pending()
        except ConnectionError:
            pass

    def wait(self, timeout: float) -> None:
        """Wait (with ``changed`` held) for something to change; a caller the socket is lent
        to reads it meanwhile."""
        self._lender.wait(timeout, self._reader, self._dispatch)

    def borrow_socket(self) -> None:
        """Ask to read the socket in this thread while it waits (``lending``)."""
        self._lender.borrow()

    def return_socket(self) -> None:
        self._lender.give_back()

    def note_mode(self, said: dict[str, Any]) -> None:
        """The mode and TQ a reply says (an admin request's)."""
        self.mode, self.tq = said.get("mode", self.mode), said.get("tq", self.tq)

    def down_too_long(self) -> bool:
        """Unreachable for longer than ``reconnect_timeout``."""
        return self._down_since is not None and \
            time.monotonic() - self._down_since > self.reconnect_timeout

    def unreachable(self) -> str:
        """Why the daemon cannot be reached, for messages to people."""
        looked = candidates(self._explicit_socket)
        others = [path for path in looked if path != self.socket_path]
        also = f" (also looked at {', '.join(others)})" if others else ""
        return (f"cannot reach the Kiwi scheduler at {self.socket_path}: {self.last_error}"
                f"{also}; point elsewhere with {SOCKET_ENV}=PATH")

    def _await_connection(self, deadline: float) -> None:
        """Wait for a live connection. Fails fast when the daemon refused the latest try and
        we are not in the middle of a reconnect that the caller can afford to wait for."""
        with self.changed:
            attempts = self._attempts
            while not self._connected:
                if self._closed:
                    raise ConnectionError("the client was closed")
                wanted = self.session.wanted
                if self._attempts > attempts and not wanted:
                    raise ConnectionError(self.unreachable())
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (wanted and self.down_too_long()):
                    raise ConnectionError(self.unreachable())
                self.changed.wait(min(remaining, 0.1))

    def _send(self, data: bytes) -> None:
        sock = self._sock
        if sock is None:
            raise ConnectionError(self.unreachable())
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
                with self.changed:
                    self._attempts += 1
                    self.last_error = exc.strerror or str(exc)
                    if self._down_since is None:
                        self._down_since = time.monotonic()
                    self.session.connection_lost()
                    self.changed.notify_all()
                    self.changed.wait(backoff.next())
                continue
            backoff.reset()
            self._read()
            with self.changed:
                self._lender.take_back()
                self._connected = False
                self._sock = None
                self._down_since = time.monotonic()
                self._lost(self.session.wanted)
                self.session.connection_lost()
                self.changed.notify_all()
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
            reader = LineReader(sock, self._lender.wake_rx)
            with self.changed:
                registration = self._registration
                self.session.connect(registration() if registration is not None else None)
                hello = self.session.data_to_send()
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
        # _connected: a request asks by itself only on a ready connection, so one made ready
        # between the two would be asked by nobody, and a caller that watches its position
        # instead of waiting for the grant would wait for ever.
        with self.changed:
            happened = self.session.receive(message)
            out = self.session.data_to_send()
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
            self.mode, self.tq = self.session.mode, self.session.tq
            self._connected = True
            self._down_since = None
            self.changed.notify_all()
        return True

    def _read(self) -> None:
        reader = self._reader
        assert reader is not None
        lender = self._lender
        while not self._closed:
            if lender.wanted_by is not None:
                with self.changed:
                    if lender.wanted_by is not None and not reader.done:
                        lender.lend()
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
        with self.changed:
            for event in self.session.receive(message):
                if isinstance(event, ev.Reply):
                    self._replies[event.seq] = event.message
                elif isinstance(event, ev.ModeChanged):
                    self.mode, self.tq = self.session.mode, self.session.tq
                self._heard(event)
            # A line the session answers by itself (asking again after a release of ours).
            self.send_pending_quietly()
            self.changed.notify_all()
        if message.get("seq") is None:
            for listener in list(self._listeners):
                with contextlib.suppress(Exception):
                    listener(message)
