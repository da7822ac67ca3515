"""What a connection sees of the daemon: the router, and each connection's way out.

A ``DaemonConnection`` (``connection.py``) moves one peer's bytes in and decides how much to answer
at a time. Everything it sends goes through its ``Endpoint``, and everything that happens to it
(opened, a request's outcome to carry out, the end of its turn, lost) it tells the ``Router``.
The router knows every endpoint, by session and by registered client, and sends lines to them:
to one client, to one session, or to every greeted peer. What the daemon does about each event
is the router's implementation (``shell.py``); a connection never sees more of it than this.

Everything owed to a peer is bounded together, replies and events: replies by backpressure
(``connection.py``: past ``MAX_OWED_BYTES`` unread, its requests wait), events by coalescing. An
event that only says how things stand now (``changed``, a queue position, the mode, a pause or
resume) is sent with ``send_event`` under its kind; while the peer is behind (bytes it has not
read wait in the daemon), only the latest of each kind is kept, and they go out, in the order
they came, once it has read everything or before the next line that must go as it is (a grant,
a drop, a reply). A peer that stays behind for ``connections.stall_timeout`` is cut off.

Both are base classes rather than protocols: compiled (mypyc), calls through them stay C calls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from nodeside import protocol as p
from nodeside.daemon.session import Outcome, Rules, Session
from nodeside.limits import MAX_OWED_BYTES

#: The kinds of state events: of each, only the latest matters to a peer that is behind.
CHANGED_EVENT = "changed"
POSITION_EVENT = "waiting"
MODE_EVENT = "mode"
TURN_EVENT = "turn"  # pause or resume: a client holds one GPU, so one kind for both


class Endpoint:
    """One connection's way out: what is sent to its peer, held while its requests are answered
    so that it goes out in one write, and how much the peer has not read yet."""

    def __init__(self, session: Session, transport: asyncio.Transport | None) -> None:
        self.session = session
        self.transport = transport
        #: While requests are answered, what is sent here waits, to go out in one write: a
        #: client that gives the GPU back and asks again wakes up once. Messages for other
        #: connections (the next holder's grant) still go out at once.
        self.held: list[bytes] | None = None
        #: Bytes in ``held`` (kept as they come: backpressure asks after every request).
        self.held_bytes = 0
        #: Closed, or closing: nothing more is sent or answered.
        self.closing = False
        #: The router's notes: counted among the peers that asked for events, and both that
        #: and registered (nothing more to note about it on later requests).
        self.counted_as_listener = False
        self.settled = False
        #: While the peer is behind, the latest state event of each kind, in the order they
        #: came; None while it keeps up (the usual case: no dict at all).
        self.parked: dict[str, bytes] | None = None

    def send(self, data: bytes) -> None:
        """A line that must reach the peer as it is: a reply, a grant, a drop, a revocation."""
        if self.transport is not None and not self.closing:
            if self.held is not None:
                self.held.append(data)
                self.held_bytes += len(data)
            else:
                if self.parked is not None:  # behind: what it was told before goes first
                    self._unpark()
                self.transport.write(data)

    def send_event(self, kind: str, line: bytes) -> None:
        """A state event: to a peer that is behind, only the latest of its ``kind`` is sent."""
        transport = self.transport
        if transport is None or self.closing:
            return
        if self.held is not None:  # its own turn: it is reading
            self.held.append(line)
            self.held_bytes += len(line)
            return
        parked = self.parked
        if parked is None:
            if not transport.get_write_buffer_size():
                transport.write(line)
                return
            parked = self._fall_behind(transport)
        parked.pop(kind, None)  # the latest goes after what came before it
        parked[kind] = line

    def _fall_behind(self, transport: asyncio.Transport) -> dict[str, bytes]:
        parked: dict[str, bytes] = {}
        self.parked = parked
        # With the high-water mark at zero the transport pauses the connection's writing now,
        # and resumes it once its buffer is empty (asyncio's documented rule): that resume is
        # when the parked events go (``caught_up``).
        transport.set_write_buffer_limits(high=0)
        return parked

    def caught_up(self) -> None:
        """The peer read everything owed: the parked events go, and it keeps up again."""
        parked, self.parked = self.parked, None
        if self.transport is None or self.closing:
            return
        self.transport.set_write_buffer_limits(high=MAX_OWED_BYTES)
        if parked:
            self.transport.write(b"".join(parked.values()))

    def _unpark(self) -> None:
        parked = self.parked
        if parked and self.transport is not None:
            self.parked = {}  # still behind: later events are parked again
            self.transport.write(b"".join(parked.values()))

    def hold(self) -> None:
        """Keep what is sent from now on until ``flush``."""
        self.held = []

    def flush(self) -> None:
        held, self.held = self.held, None
        self.held_bytes = 0
        if held and self.transport is not None and not self.closing:
            if self.parked is not None:
                self._unpark()
            self.transport.write(held[0] if len(held) == 1 else b"".join(held))

    def owed(self) -> int:
        """Bytes written to this peer that it has not read yet, and those about to be."""
        held = self.held_bytes if self.held is not None else 0
        return held + self.buffered()

    def buffered(self) -> int:
        """Bytes written to this peer's transport that it has not read yet."""
        return self.transport.get_write_buffer_size() if self.transport else 0

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

    def cut_off(self) -> None:
        """Close at once, dropping what the peer never read (closing would keep it until the
        peer reads, which a peer that stopped reading never does)."""
        self.closing = True
        self.parked = None
        if self.transport is not None:
            self.transport.abort()


class Router:
    """Every connection of the daemon, and the lines sent to them.

    ``rules`` answer each session's requests (``Requests``), ``now`` is the daemon's clock and
    ``loop`` its event loop (a connection's next turn is called soon on it)."""

    def __init__(self, rules: Rules, now: Callable[[], float],
                 loop: asyncio.AbstractEventLoop) -> None:
        self.rules = rules
        self.now = now
        self.loop = loop
        self.endpoints: set[Endpoint] = set()
        self.by_session: dict[Session, Endpoint] = {}
        #: The endpoint of each registered client, by client id.
        self.by_client: dict[str, Endpoint] = {}

    # -- what happens to a connection (the daemon's shell implements these) -----------------

    def opened(self, endpoint: Endpoint) -> None:
        """A peer connected; admit it (``add``) or refuse it."""
        raise NotImplementedError

    def carry_out(self, endpoint: Endpoint, outcome: Outcome) -> None:
        """Send a session's replies and carry out the scheduler's actions, in their order."""
        raise NotImplementedError

    def end_turn(self, now: float) -> None:
        """A connection's batch of requests is answered; ``now`` is the turn's time."""
        raise NotImplementedError

    def lost(self, endpoint: Endpoint) -> None:
        """The connection closed, whoever closed it."""
        raise NotImplementedError

    def stall_timeout(self) -> float:
        """Seconds a peer may stay behind (not reading what it is owed) before it is cut off."""
        raise NotImplementedError

    def stalled(self, endpoint: Endpoint, seconds: float) -> None:
        """A peer stayed behind ``seconds``: cut it off."""
        raise NotImplementedError

    def fell_behind(self, endpoint: Endpoint) -> None:
        """A peer stopped reading what it is owed (its writing paused)."""
        raise NotImplementedError

    def kept_up(self, endpoint: Endpoint) -> None:
        """A peer that fell behind read what it was owed."""
        raise NotImplementedError

    # -- who is where -------------------------------------------------------------------------

    def add(self, endpoint: Endpoint) -> None:
        self.endpoints.add(endpoint)
        self.by_session[endpoint.session] = endpoint

    def remove(self, endpoint: Endpoint) -> None:
        self.endpoints.discard(endpoint)
        self.by_session.pop(endpoint.session, None)
        client_id = endpoint.session.client_id
        if client_id is not None and self.by_client.get(client_id) is endpoint:
            del self.by_client[client_id]

    def session_of(self, client_id: str) -> Session | None:
        endpoint = self.by_client.get(client_id)
        return endpoint.session if endpoint is not None else None

    # -- sending ------------------------------------------------------------------------------

    def refuse(self, session: Session, code: str, message: str) -> None:
        endpoint = self.by_session.get(session)
        if endpoint is not None:
            endpoint.refuse(code, message)

    def send_event_to(self, session: Session, kind: str, line: bytes) -> None:
        endpoint = self.by_session.get(session)
        if endpoint is not None:
            endpoint.send_event(kind, line)

    def broadcast(self, line: bytes) -> None:
        """The mode and TQ, to every peer that said hello."""
        for endpoint in self.endpoints:
            if endpoint.session.greeted:
                endpoint.send_event(MODE_EVENT, line)
