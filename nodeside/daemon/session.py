"""One connection's rules, without the connection: the daemon's sans-I/O session.

A ``Session`` is fed the bytes a peer sent and, one request at a time, the current time; it
answers with an ``Outcome``: the lines to send back and the scheduler's actions for the shell to
carry out, in the order they must go. It knows the protocol's order of things (hello first and
once, register once, admin-only requests), matches replies to requests by ``seq``, holds every
bound a peer could push against, and turns each broken request into its typed error. It never
touches a socket, a clock or a timer: ``connection.py`` and the shell do that. Its fields are
written here only: what a request changes of them (hello's features, the client a registration
made, the queue position a reply told) comes back inside the ``Outcome``, and the session takes
it from there.

Requests are taken one line at a time so that the shell decides how many to answer in one turn
(backpressure); the bytes not yet taken stay here, never more than one read's worth beyond a
line, because the shell stops reading while requests are pending.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nodeside import protocol as p
from nodeside.daemon.peer import Peer
from nodeside.limits import LimitError
from nodeside.scheduler.core import Action, SchedulerError

#: Said when a request comes before hello; the first words an unknown peer hears.
_HELLO_FIRST = "the first message must be hello"
@dataclass(init=False, slots=True)
class Outcome:
    """What one request asks of the shell.

    ``out`` is in sending order: ``bytes`` go to this peer, actions go to whichever client they
    name (the next holder's grant before the releaser's own reply, so the one waiting hears
    first).
    """

    out: list[bytes | Action]
    #: Close this connection once ``out`` is written: the peer broke the protocol.
    close: bool
    #: A release or a departure: a grant in ``out`` ends a handoff (metrics).
    handoff: bool
    #: Holders, waiters or quanta may have changed: the next deadline must be recomputed.
    reschedule: bool
    #: Mode or TQ changed: save the runtime state and tell every greeted peer this line.
    broadcast: bytes | None
    #: Queues of these GPUs may have moved (for position events).
    gpus: tuple[int, ...]
    #: Something the status document shows may have changed (for ``changed`` events).
    changed: bool
    # What the request changed of the session itself; the session takes it (``_take``).
    #: Hello was answered: the features this peer asked for and is served.
    features: frozenset[str] | None
    #: A registration: the client id, and the name the log calls the peer by.
    client_id: str | None
    label: str | None
    #: The reply told the peer its queue position: ``position`` (None: it was granted).
    told: bool
    position: int | None
    #: Not answered: the request was put back, to be answered in this many seconds (a uid
    #: over its share of status documents). Nothing else in the outcome counts.
    wait: float

    # Written out, not the dataclass's: two are made per handoff, and compiled (mypyc) a
    # generated __init__ stays interpreted (see scheduler/actions.py).
    def __init__(self, out: list[bytes | Action] | None = None, close: bool = False,
                 handoff: bool = False, reschedule: bool = False,
                 broadcast: bytes | None = None, gpus: tuple[int, ...] = (),
                 changed: bool = False, features: frozenset[str] | None = None,
                 client_id: str | None = None, label: str | None = None, told: bool = False,
                 position: int | None = None, wait: float = 0.0) -> None:
        self.out = [] if out is None else out
        self.close = close
        self.handoff = handoff
        self.reschedule = reschedule
        self.broadcast = broadcast
        self.gpus = gpus
        self.changed = changed
        self.features = features
        self.client_id = client_id
        self.label = label
        self.told = told
        self.position = position
        self.wait = wait


class Rules:
    """What a session asks of the node's rules: to answer a request, and to hear of a broken
    one. ``requests.Requests`` is them; a session never sees more of the node than this.

    A base class rather than a protocol: compiled (mypyc), a call through it stays a C call."""

    def dispatch(self, session: Session, op: str, message: dict[str, Any], seq: int | None,
                 now: float) -> Outcome:
        """Answer one checked request of a greeted session (or its hello)."""
        raise NotImplementedError

    def handoff(self, session: Session, op: str, seq: int, now: float) -> Outcome:
        """Answer a plain ``acquire`` or ``release`` (op and seq, nothing else) of a greeted
        session: what ``dispatch`` answers for the message ``{"op": op, "seq": seq}``."""
        raise NotImplementedError

    def complain(self, session: Session, exc: p.ProtocolError) -> None:
        """A request was refused: say so (or not) in the log."""
        raise NotImplementedError

    def trouble(self, session: Session, exc: Exception) -> None:
        """A request failed on a fault of the daemon's own: say so in the log."""
        raise NotImplementedError


class Session:
    """The protocol state of one connection. ``rules`` is the node's ``Requests`` dispatcher."""

    def __init__(self, rules: Rules, peer: Peer, opened_at: float) -> None:
        self.rules = rules
        self.peer = peer
        self.opened_at = opened_at
        #: When the peer last sent a whole request (the idle limit counts from here).
        self.active_at = opened_at
        self.greeted = False
        self.features: frozenset[str] = frozenset()
        self.client_id: str | None = None
        self.label = "<UNREGISTERED>"
        #: The queue position this peer last heard (position events are sent on change only).
        self.told_position: int | None = None
        #: The whole lines the peer sent that are not answered yet, ``_lines[_next:]``, and
        #: what came after its last newline (a line still on its way). Each read is split
        #: once: compiled, ``split`` is one generic call a read, where finding each line was
        #: one a line (and a list and an index, not a list cut at the front: C calls).
        self._lines: list[bytes] = []
        self._next = 0
        self._rest = b""
        #: A framing error (a line over the limit) not yet answered.
        self._broken: p.ProtocolError | None = None
        #: A fatal error was answered: nothing more is read or answered.
        self.over = False

    # -- bytes in -------------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Take what the socket gave. Requests come out of ``step``."""
        if self.over or self._broken is not None:
            return
        lines = (self._rest + data if self._rest else data).split(b"\n")
        self._rest = lines.pop()
        if self._next < len(self._lines):  # lines of an earlier read still wait their turn
            waiting = self._lines[self._next:]
            waiting.extend(lines)
            lines = waiting
        # What was answered goes now, once per read: the lines never grow past a read.
        self._lines = lines
        self._next = 0

    def has_requests(self) -> bool:
        """Is a whole line (or a framing error) waiting to be answered?"""
        if self.over:
            return False
        return self._next < len(self._lines) or self._broken is not None or \
            len(self._rest) >= p.MAX_REQUEST_BYTES

    def step(self, now: float) -> Outcome | None:
        """Answer the next request, if a whole one has arrived."""
        if self.over:
            return None
        if self._broken is None:
            if self._next < len(self._lines):
                line = self._lines[self._next]
                if len(line) < p.MAX_REQUEST_BYTES:
                    self._next += 1
                    outcome = self.handle(line, now)
                    if outcome.wait:  # not answered yet: the same line comes out next time
                        self._next -= 1
                    return outcome
            elif len(self._rest) < p.MAX_REQUEST_BYTES:
                return None  # the turn's last call, after its requests
            # No newline within the limit: a peer may not make the daemon buffer without end.
            self._broken = p.ProtocolError(p.E_TOO_LARGE,
                                           f"message over {p.MAX_REQUEST_BYTES} bytes")
            self._lines, self._next, self._rest = [], 0, b""
        return self._failed(self._broken, None)

    # -- one request ----------------------------------------------------------------------

    def handle(self, line: bytes, now: float) -> Outcome:
        """Answer one line (without its newline)."""
        seq: int | None = None
        try:
            op, plain_seq = p.plain_request(line)
            if plain_seq >= 0 and self.greeted and (op == p.RELEASE or op == p.ACQUIRE):
                # The two requests of every handoff, as every client we ship writes them:
                # neither has a field it must carry, so there is nothing to check, and no
                # message to build for the answer.
                seq = plain_seq
                self.active_at = now
                outcome = self.rules.handoff(self, op, plain_seq, now)
            else:
                message = p.decode(line)
                seq = message.get("seq")
                p.check_request(message)
                op = message["op"]
                if not self.greeted and op != p.HELLO:
                    raise p.ProtocolError(p.E_VERSION, _HELLO_FIRST)
                self.active_at = now
                outcome = self.rules.dispatch(self, op, message, seq, now)
            if outcome.told or outcome.features is not None or outcome.client_id is not None:
                self._take(outcome)
            return outcome
        # One name per clause: compiled (mypyc), a name keeps the type of its first clause.
        except p.ProtocolError as broken:
            return self._failed(broken, seq)
        except SchedulerError as refused:
            return self._failed(p.ProtocolError(refused.code, str(refused)), seq)
        except LimitError as over:
            return self._failed(p.ProtocolError(p.E_LIMIT, str(over)), seq)
        except Exception as bug:  # a bug of ours: this request fails, the daemon serves on
            self.rules.trouble(self, bug)
            return Outcome([p.error(p.E_INVALID, f"the daemon could not answer this request "
                                    f"({type(bug).__name__}); see its log", seq)],
                           reschedule=True)

    def _take(self, outcome: Outcome) -> None:
        """What an answered request changed of this session."""
        if outcome.features is not None:
            self.features = outcome.features
            self.greeted = True
        if outcome.client_id is not None:
            self.client_id = outcome.client_id
            self.label = outcome.label or outcome.client_id
        if outcome.told:
            self.told_position = outcome.position

    def _failed(self, exc: p.ProtocolError, seq: int | None) -> Outcome:
        self.rules.complain(self, exc)
        if exc.fatal:
            self.over = True
            self._broken = None
            self._lines, self._next, self._rest = [], 0, b""  # nothing after a broken line
        return Outcome([p.error(exc.code, exc.message, seq)], close=exc.fatal)

    # -- events out -----------------------------------------------------------------------

    def grant_sent(self) -> None:
        """The peer's grant went out (as an event): the next queue position it hears is news,
        whatever it heard before."""
        self.told_position = None

    def position_event(self, position: int | None) -> bytes | None:
        """A ``waiting`` event if this peer asked for positions and its position moved."""
        if p.FEATURE_POSITION not in self.features or position == self.told_position:
            return None
        self.told_position = position
        if position is None:  # granted or gone from the queue: the grant itself says so
            return None
        return p.waiting_line(position)
