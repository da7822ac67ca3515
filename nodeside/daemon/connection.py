"""One client connection's I/O: bytes into its session, replies out, and backpressure.

The rules live in ``session.py``; this file only moves bytes and decides how much to answer at
a time. A peer that pipelines thousands of requests is answered ``REQUESTS_PER_TURN`` at a time,
with every other connection's turn in between, and not at all while it owes the daemon more
than ``MAX_OWED_BYTES`` of unread replies: while requests wait here the socket is not read, so
the rest stay in the kernel's buffer, not in the daemon's memory. A peer whose writing stays
paused (it does not read what it is owed, replies or events) for the router's
``stall_timeout`` is cut off: the bytes it never read are dropped with it.

Of the daemon a connection knows only the ``Router`` (``router.py``): it tells it what happens
and sends through its own ``Endpoint``.
"""

from __future__ import annotations

import asyncio
from typing import cast

from nodeside.daemon.peer import Peer
from nodeside.daemon.router import Endpoint, Router
from nodeside.daemon.session import Session
from nodeside.limits import MAX_OWED_BYTES, REQUESTS_PER_TURN


class DaemonConnection(asyncio.Protocol):
    # Both made when the peer connects, once who it is is known (asyncio calls nothing else
    # of a protocol before ``connection_made``).
    session: Session
    endpoint: Endpoint

    def __init__(self, router: Router) -> None:
        self.router = router
        self._reading_paused = False
        self._writing_paused = False
        self._turn_pending = False
        #: When writing was last paused, and whether a look at the stall is arranged.
        self._paused_at = 0.0
        self._stall_check = False
        #: A request waits its time (``Outcome.wait``): no turn until then.
        self._waiting = False

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # asyncio's or uvloop's: uvloop's transports are not asyncio.Transport subclasses.
        sent = cast(asyncio.Transport, transport)
        sent.set_write_buffer_limits(high=MAX_OWED_BYTES)
        router = self.router
        self.session = Session(router.rules, Peer.of(transport.get_extra_info("socket")),
                               router.now())
        self.endpoint = Endpoint(self.session, sent)
        router.opened(self.endpoint)

    def data_received(self, data: bytes) -> None:
        if self.endpoint.closing:
            return
        self.session.feed(data)
        self._take_turn()

    def connection_lost(self, exc: Exception | None) -> None:
        self.endpoint.closing = True
        self.router.lost(self.endpoint)

    def pause_writing(self) -> None:
        # The peer owes reading MAX_OWED_BYTES, or fell behind on its events: answer nothing
        # more until it reads.
        self._writing_paused = True
        router = self.router
        self._paused_at = router.now()
        self._pause_reading()
        router.fell_behind(self.endpoint)
        if not self._stall_check:
            self._stall_check = True
            router.loop.call_later(router.stall_timeout(), self._look_at_stall)

    def resume_writing(self) -> None:
        self._writing_paused = False
        self.router.kept_up(self.endpoint)
        if self.endpoint.parked is not None:
            self.endpoint.caught_up()
        self._next_turn()

    def _look_at_stall(self) -> None:
        self._stall_check = False
        if not self._writing_paused or self.endpoint.closing:
            return
        router = self.router
        behind = router.now() - self._paused_at
        limit = router.stall_timeout()
        if behind >= limit:
            router.stalled(self.endpoint, behind)
        else:  # it read, and fell behind again since: look again when this pause would end
            self._stall_check = True
            router.loop.call_later(limit - behind, self._look_at_stall)

    # -- answering --------------------------------------------------------------------------

    def _take_turn(self) -> None:
        """Answer up to REQUESTS_PER_TURN requests, then let the other connections have theirs."""
        self._turn_pending = False
        session, endpoint = self.session, self.endpoint
        if endpoint.closing or self._writing_paused or self._waiting:
            return
        # Methods called on their objects, not bound to locals first: compiled (mypyc), a call
        # on a native object is a C call, a bound method a generic Python call.
        router = self.router
        # One reading of the clock for the turn's requests, which came in one read.
        now = router.now()
        # Nothing reaches the transport while the endpoint holds what is sent: what it has
        # buffered stays as it is through the turn, and is asked once (a generic call).
        buffered = endpoint.buffered()
        endpoint.hold()
        try:
            for _ in range(REQUESTS_PER_TURN):
                outcome = session.step(now)
                if outcome is None:
                    break
                if outcome.wait:
                    self._wait(outcome.wait)
                    break
                router.carry_out(endpoint, outcome)
                if endpoint.closing or endpoint.held_bytes + buffered > MAX_OWED_BYTES:
                    break
        finally:
            endpoint.flush()
            router.end_turn(now)
        if session.has_requests() or self._waiting:
            self._pause_reading()
            self._next_turn()
        elif self._reading_paused and not self._writing_paused and not endpoint.closing:
            self._reading_paused = False
            if endpoint.transport is not None:
                endpoint.transport.resume_reading()

    def _wait(self, seconds: float) -> None:
        """The next request is answered in ``seconds``: until then this peer is not read."""
        self._waiting = True
        self.router.loop.call_later(seconds, self._waited)

    def _waited(self) -> None:
        self._waiting = False
        self._next_turn()

    def _next_turn(self) -> None:
        if not self._turn_pending and not self._writing_paused and not self.endpoint.closing \
                and not self._waiting:
            self._turn_pending = True
            self.router.loop.call_soon(self._take_turn)

    def _pause_reading(self) -> None:
        endpoint = self.endpoint
        if not self._reading_paused and endpoint.transport is not None and not endpoint.closing:
            self._reading_paused = True
            endpoint.transport.pause_reading()
