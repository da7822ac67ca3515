"""One client connection: bytes in, protocol lines out, and the peer's identity."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, cast

from nodeside import protocol as p
from nodeside.daemon.peer import Peer

if TYPE_CHECKING:
    from nodeside.daemon.server import Daemon

log = logging.getLogger("kiwi.daemon")

# A client that stops reading its replies must not make the daemon buffer without bound: past
# this many unsent bytes its connection stops being read until the backlog drains.
_WRITE_HIGH_WATER = 1024 * 1024


class Connection(asyncio.Protocol):
    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.buffer = p.LineBuffer(p.MAX_REQUEST_BYTES)
        self.transport: asyncio.Transport | None = None
        self.peer = Peer(None, None, None, -1)
        self.greeted = False
        self.client_id: str | None = None
        self.label = "<UNREGISTERED>"
        self.closing = False
        #: While several requests that came in one read are handled, what is sent to this
        #: connection waits here, to go out in one write.
        self.held: list[bytes] | None = None

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # asyncio's or uvloop's: uvloop's transports are not asyncio.Transport subclasses.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=_WRITE_HIGH_WATER)
        sock = transport.get_extra_info("socket")
        self.peer = Peer.of(sock)
        self.daemon.connections.add(self)

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        try:
            lines = self.buffer.feed(data)
        except p.ProtocolError as exc:
            self.fail(exc)
            return
        if len(lines) == 1:  # the usual case
            self.daemon.handle(self, lines[0])
            return
        # Several requests at once (a client that gives the GPU back and asks again at once):
        # one write for all their replies, so the client wakes up once, not once per reply.
        # Messages for other connections (the next holder's grant) still go out at once.
        self.held = []
        try:
            for line in lines:
                if self.closing:
                    return
                self.daemon.handle(self, line)
        finally:
            self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.daemon.lost(self)

    def pause_writing(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.closing:
            self.transport.resume_reading()

    # -- sending ----------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        if self.transport is not None and not self.closing:
            if self.held is not None:
                self.held.append(data)
            else:
                self.transport.write(data)

    def flush(self) -> None:
        held, self.held = self.held, None
        if held and self.transport is not None and not self.closing:
            self.transport.write(b"".join(held))

    def fail(self, exc: p.ProtocolError, seq: int | None = None) -> None:
        """Answer with the error; close the connection if the error is fatal."""
        self.send(p.error(exc.code, exc.message, seq))
        if exc.fatal:
            self.flush()
            log.warning("Closing connection from %s [FD=%d]: %s", self.label, self.peer.fd,
                        exc.message)
            self.closing = True
            if self.transport is not None:
                self.transport.close()  # flushes the error reply first
