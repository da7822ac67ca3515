"""One client connection's I/O: bytes into its session, replies out, and backpressure.

The rules live in ``session.py``; this file only moves bytes and decides how much to answer at
a time. A peer that pipelines thousands of requests is answered ``REQUESTS_PER_TURN`` at a time,
with every other connection's turn in between, and not at all while it owes the daemon more
than ``MAX_OWED_BYTES`` of unread replies: while requests wait here the socket is not read, so
the rest stay in the kernel's buffer, not in the daemon's memory.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, cast

from nodeside import protocol as p
from nodeside.daemon.peer import Peer
from nodeside.daemon.session import Session
from nodeside.limits import MAX_OWED_BYTES, REQUESTS_PER_TURN

if TYPE_CHECKING:
    from nodeside.daemon.server import Daemon


class Connection(asyncio.Protocol):
    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.transport: asyncio.Transport | None = None
        self.session = Session(daemon.requests, Peer(None, None, None, -1), daemon.now())
        self.closing = False
        #: While requests are answered, what is sent to this connection waits here, to go out
        #: in one write: a client that gives the GPU back and asks again wakes up once.
        #: Messages for other connections (the next holder's grant) still go out at once.
        self.held: list[bytes] | None = None
        #: Bytes in ``held`` (kept as they come: backpressure asks after every request).
        self._held_bytes = 0
        #: Counted among the peers that asked for position events (the daemon keeps count).
        self.counted_as_listener = False
        #: Registered and counted: carry_out has nothing more to note about it.
        self.settled = False
        self._reading_paused = False
        self._writing_paused = False
        self._turn_pending = False

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # asyncio's or uvloop's: uvloop's transports are not asyncio.Transport subclasses.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=MAX_OWED_BYTES)
        self.session.peer = Peer.of(transport.get_extra_info("socket"))
        self.daemon.opened(self)

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self.session.feed(data)
        self._take_turn()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.daemon.lost(self)

    def pause_writing(self) -> None:
        # The peer owes reading MAX_OWED_BYTES: answer nothing more until it reads.
        self._writing_paused = True
        self._pause_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._next_turn()

    # -- answering --------------------------------------------------------------------------

    def _take_turn(self) -> None:
        """Answer up to REQUESTS_PER_TURN requests, then let the other connections have theirs."""
        self._turn_pending = False
        if self.closing or self._writing_paused:
            return
        # Methods called on their objects, not bound to locals first: compiled (mypyc), a call
        # on a native object is a C call, a bound method a generic Python call.
        session, daemon = self.session, self.daemon
        self.held = []
        try:
            for _ in range(REQUESTS_PER_TURN):
                outcome = session.step(daemon.now())
                if outcome is None:
                    break
                daemon.carry_out(self, outcome)
                if self.closing or self.owed() > MAX_OWED_BYTES:
                    break
        finally:
            self.flush()
            daemon.end_turn()
        if session.has_requests():
            self._pause_reading()
            self._next_turn()
        elif self._reading_paused and not self._writing_paused and not self.closing:
            self._reading_paused = False
            if self.transport is not None:
                self.transport.resume_reading()

    def _next_turn(self) -> None:
        if not self._turn_pending and not self._writing_paused and not self.closing:
            self._turn_pending = True
            self.daemon.loop.call_soon(self._take_turn)

    def _pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None and not self.closing:
            self._reading_paused = True
            self.transport.pause_reading()

    def owed(self) -> int:
        """Bytes written to this peer that it has not read yet, and those about to be."""
        held = self._held_bytes if self.held is not None else 0
        return held + (self.transport.get_write_buffer_size() if self.transport else 0)

    # -- sending ----------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        if self.transport is not None and not self.closing:
            if self.held is not None:
                self.held.append(data)
                self._held_bytes += len(data)
            else:
                self.transport.write(data)

    def flush(self) -> None:
        held, self.held = self.held, None
        self._held_bytes = 0
        if held and self.transport is not None and not self.closing:
            self.transport.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self, last_words: bytes | None = None) -> None:
        """Send ``last_words`` (an error reply) after what is held, then close."""
        if last_words is not None:
            self.send(last_words)
        self.flush()
        self.closing = True
        if self.transport is not None:
            self.transport.close()  # writes what is buffered first

    def refuse(self, code: str, message: str) -> None:
        self.close(p.error(code, message))
