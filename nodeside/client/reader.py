"""Reading the daemon's lines from a blocking socket, for the connection thread and for a
caller that borrowed the socket (``lending``). Lines may be as long as anything the daemon may
legally send (``MAX_REPLY_BYTES``)."""

from __future__ import annotations

import contextlib
import select
import socket
from typing import Any

from nodeside import protocol as p

#: What ``LineReader.next`` returns when woken by the wire instead of a message.
WOKEN: dict[str, Any] = {}


class LineReader:
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
        """The next message, or None at the end of the stream. With ``woken``, WOKEN when
        the wake-up wire had data before the socket did."""
        if woken and not self.lines:
            ready = dict(self._socket_or_wake.poll())
            if self.wake.fileno() in ready:
                with contextlib.suppress(BlockingIOError):
                    self.wake.recv(64)
                return WOKEN
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
