"""``ControlClient``: one synchronous connection for callers that ask and go.

``kiwictl`` and the Jupyter server's link read the status document and send admin requests; they
never hold a GPU, so they need none of ``Client``'s machinery (a connection thread, reconnecting
with backoff, re-asking after a restart). This client connects on the first call, says hello,
sends one request at a time and reads until the reply with its ``seq`` comes, skipping the events
in between. A failed call closes the connection; the next call connects afresh, which is also how
a restarted daemon is picked up.

Given no path, it tries the places ``discovery`` lists in turn and keeps the first that answers.
"""

from __future__ import annotations

import contextlib
import os
import socket
from typing import Any

from nodeside import protocol as p
from nodeside.client.common import Commands, refusal
from nodeside.client.discovery import candidates, not_found
from nodeside.protocol import events as ev
from nodeside.protocol.client_session import ClientSession


class ControlClient:
    """Status and admin requests over one blocking connection; a context manager.

    Raises ConnectionError when nothing answers (the message says where it looked),
    TimeoutError when the daemon does not answer within ``timeout`` seconds, PermissionError
    or ValueError for a refused admin request, KiwiError for other refusals.
    """

    def __init__(self, socket_path: str | None = None, *, timeout: float = 10.0) -> None:
        self._candidates = candidates(socket_path)
        #: The socket in use: the one that answered, or the first to try until one has.
        self.socket_path = self._candidates[0]
        self.timeout = timeout
        self.mode: str | None = None
        self.tq: float | None = None
        self._sock: socket.socket | None = None
        self._session = ClientSession(features=[p.FEATURE_POSITION])
        self._events: list[ev.Event] = []
        self._commands = Commands(self.request)

    def status(self) -> dict[str, Any]:
        """The status document (docs/interfaces.md section 5)."""
        return self._commands.status()

    def set_mode(self, mode: str) -> None:
        self._note(self._commands.set_mode(mode))

    def set_tq(self, seconds: float, gpu: int | None = None) -> None:
        self._note(self._commands.set_tq(seconds, gpu))

    def ping(self) -> None:
        self.request(p.PING)

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send one request and return its reply; KiwiError when the reply is an error."""
        reused = self._sock is not None
        try:
            message = self._exchange(op, fields)
        except ConnectionError:
            if not reused:
                raise
            # The daemon closes a control connection left idle for long (its idle limit for
            # connections that never registered): that is no outage, so ask again afresh, once.
            message = self._exchange(op, fields)
        if message["op"] == p.ERROR:
            raise refusal(message)
        return message

    def _exchange(self, op: str, fields: dict[str, Any]) -> dict[str, Any]:
        """One request and its reply (whatever it says) over the connection, made if needed."""
        sock = self._connection()
        seq = self._session.request(op, **fields)
        try:
            sock.sendall(self._session.data_to_send())
            while True:
                event = self._next_event(sock)
                if isinstance(event, ev.Reply) and event.seq == seq:
                    return event.message
                if isinstance(event, ev.ModeChanged):  # it crossed our request
                    self._note(event.message)
        except (OSError, p.ProtocolError) as exc:
            self.close()
            if isinstance(exc, TimeoutError):
                raise TimeoutError(f"the Kiwi scheduler at {self.socket_path} did not answer "
                                   f"{op} within {self.timeout:g} s") from None
            raise ConnectionError(f"lost the Kiwi scheduler at {self.socket_path}: "
                                  f"{exc}") from None

    def close(self) -> None:
        sock, self._sock = self._sock, None
        self._session.connection_lost()
        self._events = []
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------------

    def _note(self, said: dict[str, Any]) -> None:
        """The mode and TQ the daemon said: in its welcome, a mode event or an admin reply."""
        self.mode = said.get("mode", self.mode)
        self.tq = said.get("tq", self.tq)

    def _connection(self) -> socket.socket:
        if self._sock is not None:
            return self._sock
        tried: list[tuple[str, str]] = []
        for path in self._candidates:
            try:
                self._sock = self._connect(path)
            except (OSError, p.ProtocolError) as exc:
                tried.append((path, _reason(exc, path)))
                continue
            self.socket_path = path
            return self._sock
        raise ConnectionError(not_found(tried))

    def _connect(self, path: str) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(path)
            self._session.connect()
            sock.sendall(self._session.data_to_send())
            welcome = self._next_event(sock)  # the session's first: Ready, or Refused
        except BaseException:
            sock.close()
            self._session.connection_lost()
            self._events = []
            raise
        if not isinstance(welcome, ev.Ready):
            sock.close()
            self._session.connection_lost()
            said = welcome.message
            raise ConnectionRefusedError(f"refused: {said.get('message', said.get('op'))}")
        self._note(welcome.message)
        return sock

    def _next_event(self, sock: socket.socket) -> ev.Event:
        while not self._events:
            data = sock.recv(65536)
            if not data:
                raise ConnectionResetError("the scheduler closed the connection")
            self._events.extend(self._session.receive_data(data))
        return self._events.pop(0)


def _reason(exc: BaseException, path: str) -> str:
    if isinstance(exc, FileNotFoundError):
        if os.path.islink(path):  # published by a Jupyter server that could not remove it
            return (f"a stale link to {os.readlink(path)}, which is gone: the Jupyter server "
                    "that published it has stopped")
        return "no such socket"
    if isinstance(exc, ConnectionRefusedError):
        return "nothing listens there" if exc.errno is not None else str(exc)
    if isinstance(exc, PermissionError):
        return "permission denied"
    return str(exc) or type(exc).__name__
