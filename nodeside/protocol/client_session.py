"""``ClientSession``: a client's side of a connection to the daemon, sans-I/O (h11's shape).

Calls (``connect``, ``ask``, ``release``, ``request``...) queue the bytes to send, which the shell
takes with ``data_to_send``; what the socket gave goes in through ``receive_data`` (or, already
decoded, ``receive``) and comes out as events (``events``). No socket, clock, thread or lock is
in here: the shells around it (the threaded ``Client``, the blocking ``ControlClient``, the
asyncio ``StatusWatch``, ``daemon_answers``) do the I/O and the waiting, and call it under their
own lock.

Everything every client must get right about the protocol is done here once:

- ``hello`` is built here (and ``register``, for a session that registers);
- the hold moves only through ``_move``, checked against ``hold.MOVES``;
- ``generation`` counts connections: what was asked, held or awaited on one is gone on the next,
  and a client that still wants the GPU asks again once the new connection is ready;
- the races: a grant that crosses a cancel is ignored (the cancel waits in RELEASING for its
  answer, and nothing is asked until it comes); a requeue is answered as an acquire is, and a
  daemon that answers it ``released`` (it predates requeue) is asked again with an acquire; a
  release with ``evict_first`` is answered ``released`` (done) or with a ``drop`` carrying its
  seq (evict, then release: DROPPING); a drop, revocation or position that crossed a release of
  ours changes nothing; an ``error`` event with code ``room`` ends a wait (the room it needs
  cannot be made): idle again, nothing asked until the shell asks;
- the ``memory`` feature: where memory is (``register``'s and ``working_set``'s ``resident`` and
  ``host``, ``release`` ``evicting``, ``evicted``) is said only to a daemon that serves it, and
  an ``evict`` that crossed a grant is answered at once with ``evicted`` ``failed``.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum
from typing import Any

from nodeside import __version__
from nodeside.protocol import events as ev
from nodeside.protocol import names as p
from nodeside.protocol.hold import MOVES, Hold, IllegalMove
from nodeside.protocol.wire import LineBuffer, decode, encode

#: What a client says in hello about itself.
SOFTWARE = f"nodeside.client {__version__}"
#: The answer to an ``evict`` read while holding (it crossed a grant): ``evicted`` with this.
HOLDING_NO_EVICT = "holding the GPU: a drop moves its memory"
#: ``register``'s fields that say where memory is (feature ``memory``).
_MEMORY_FIELDS = frozenset({"resident", "host", "shadow", "disk"})


class Phase(Enum):
    CLOSED = "closed"            # no connection
    GREETING = "greeting"        # hello sent, no welcome yet
    REGISTERING = "registering"  # register sent, not answered yet
    READY = "ready"


class ClientSession:
    """One client's protocol state across its connections.

    ``features``: the optional behaviours asked for in hello (none: the field is left out).
    ``software``: said in hello (None: left out).
    """

    def __init__(self, *, features: Iterable[str] = (), software: str | None = SOFTWARE) -> None:
        self.asked_features = tuple(features)
        self.software = software
        self.phase = Phase.CLOSED
        #: Bumped by every ``connect``: a shell compares it to see a connection go in between.
        self.generation = 0
        self.state = Hold.IDLE
        #: The caller wants the GPU: asked for, or held. Survives a lost connection (asked
        #: again on the next); cleared by a release, a cancel, a refusal or a revocation.
        self.wanted = False
        self.paused = False
        #: What the daemon said: its features (welcome), mode and TQ, this client's id.
        self.features: frozenset[str] = frozenset()
        self.mode: str | None = None
        self.tq: float | None = None
        self.client_id: str | None = None
        #: Feature ``tiers``: the pin budget the daemon last told (None: none told).
        self.pin_budget: int | None = None
        #: The last drop request (reason, evict, grace); None until one comes.
        self.last_drop: dict[str, Any] | None = None
        #: The working set to register with, and to report again if it changed meanwhile.
        self.working_set: int | None = None
        self._registered_working_set: int | None = None
        self._registration: dict[str, Any] | None = None
        self._welcome: dict[str, Any] = {}
        self._position: int | None = None
        self._seq = 0
        self._ask_seq: int | None = None      # the acquire (or requeue) awaiting its answer
        self._release_seq: int | None = None  # the release awaiting its answer (RELEASING)
        self._release_evicts = False          # that release had evict_first
        self._pending: set[int] = set()       # requests whose replies go to the shell
        self._ignored: set[int] = set()       # requests whose replies nobody reads
        self._buffer = LineBuffer(p.MAX_REPLY_BYTES)
        self._out: list[bytes] = []

    # -- what the shell reads -------------------------------------------------------------

    @property
    def holds(self) -> bool:
        return self.state.holds

    @property
    def position(self) -> int | None:
        """The 1-based queue position the daemon last told, while waiting; else None."""
        return self._position if self.state is Hold.WAITING else None

    @property
    def queued(self) -> bool:
        """Asked on this connection, and the grant will come as an event: the acquire was
        answered ``waiting``, or went out without a seq (its answer is an event too)."""
        return self.state is Hold.WAITING or (self.state is Hold.ASKING and self._ask_seq is None)

    def data_to_send(self) -> bytes:
        if not self._out:
            return b""
        out, self._out = b"".join(self._out), []
        return out

    # -- the connection -------------------------------------------------------------------

    def connect(self, registration: dict[str, Any] | None = None) -> None:
        """A new connection: say hello; with ``registration`` (register's fields), register
        once welcomed. The session adds the working set it was told last, unless
        ``registration`` says it (an owner that knows its figures as it registers: memory it
        moves itself), which it then keeps."""
        if registration is not None and "working_set" in registration:
            registration = dict(registration)
            self.working_set = registration.pop("working_set")
        self.connection_lost()
        self.generation += 1
        self.phase = Phase.GREETING
        self._registration = registration
        self._buffer = LineBuffer(p.MAX_REPLY_BYTES)
        self._send(p.HELLO, version=p.VERSION, software=self.software,
                   features=list(self.asked_features) or None)

    def connection_lost(self) -> None:
        """The connection ended: whatever it held, asked or awaited went with it."""
        self.phase = Phase.CLOSED
        if self.state is not Hold.IDLE:
            self._move(Hold.IDLE)
        self.paused = False
        self._ask_seq = self._release_seq = None
        self._pending.clear()
        self._ignored.clear()
        self._out.clear()

    # -- requests -------------------------------------------------------------------------

    def request(self, op: str, **fields: Any) -> int:
        """A request whose reply comes back as a ``Reply`` with the seq returned."""
        if self.phase is not Phase.READY:
            raise RuntimeError(f"{op} before the connection is ready")
        seq = self._send_numbered(op, **fields)
        self._pending.add(seq)
        return seq

    def report_working_set(self, nbytes: int, evictable: int | None = None, *,
                           resident: int | None = None, host: int | None = None,
                           disk: int | None = None, pinned: int | None = None) -> int | None:
        """Keep the working set for the next register; on a ready registered connection also
        report it now, returning the request's seq. ``resident`` and ``host`` (feature
        ``memory``), ``disk`` and ``pinned`` (feature ``tiers``): where the client's memory is
        now; left out where the daemon does not serve the feature."""
        self.working_set = nbytes
        if self.phase is not Phase.READY or self._registration is None:
            return None
        if p.FEATURE_MEMORY not in self.features:
            resident = host = None
        if p.FEATURE_TIERS not in self.features:
            disk = pinned = None
        return self.request(p.WORKING_SET, bytes=int(nbytes), evictable=evictable,
                            resident=resident, host=host, disk=disk, pinned=pinned)

    def evicted(self, *, resident: int, host: int, moved: int, seconds: float,
                failed: str | None = None, disk: int | None = None) -> int | None:
        """Feature ``memory``: a move out ended (asked with ``evict``, after a release
        ``evicting``, or of the client's own accord), with where the memory is now, what moved
        and how long it took; or why it could not move (``failed``). Returns the request's
        seq; None, nothing sent, where the daemon does not serve the feature."""
        if self.phase is not Phase.READY or p.FEATURE_MEMORY not in self.features:
            return None
        if p.FEATURE_TIERS not in self.features:
            disk = None
        if failed is not None:
            return self.request(p.EVICTED, resident=resident, host=host, disk=disk,
                                failed=failed)
        return self.request(p.EVICTED, resident=resident, host=host, disk=disk, moved=moved,
                            seconds=round(max(seconds, 0.0), 6))

    def tier_moved(self, tier: str, *, host: int, disk: int, moved: int = 0,
                   seconds: float = 0.0, failed: str | None = None) -> int | None:
        """Feature ``tiers``: a move between host memory and disk ended (asked with ``spill``
        or ``fetch``, or of the client's own accord), its memory now in ``tier``; or why it
        could not move (``failed``: the memory stayed where it was). Returns the request's
        seq; None, nothing sent, where the daemon does not serve the feature."""
        if self.phase is not Phase.READY or p.FEATURE_TIERS not in self.features:
            return None
        if failed is not None:
            return self.request(p.TIER_MOVED, tier=tier, host=host, disk=disk, failed=failed)
        return self.request(p.TIER_MOVED, tier=tier, host=host, disk=disk, moved=moved,
                            seconds=round(max(seconds, 0.0), 6))

    def intent(self, name: str, reason: str = "execute") -> int | None:
        """Feature ``tiers`` (the Jupyter server's side): the kernel registered as ``name``
        is about to work (``reason``: execute, front). Returns the request's seq; None,
        nothing sent, where the daemon does not serve the feature."""
        if self.phase is not Phase.READY or p.FEATURE_TIERS not in self.features:
            return None
        return self.request(p.INTENT, name=name, reason=reason)

    # -- the hold -------------------------------------------------------------------------

    def ask(self) -> None:
        """Want the GPU: ask now if nothing is asked, held or being released on a ready
        connection; otherwise as soon as there is one (or the release's answer is read)."""
        self.wanted = True
        if self.phase is Phase.READY and self.state is Hold.IDLE:
            self._move(Hold.ASKING)
            self._ask_seq = self._send_numbered(p.ACQUIRE)

    def release(self, numbered: bool = False, evicting: bool = False) -> int | None:
        """Give the GPU back, or take back a request. A hold is given back at once, without
        waiting for the answer (nothing the daemon sends can undo it); ``numbered`` puts a seq
        on that release (returned), so that its ``released`` can be told apart. ``evicting``
        (feature ``memory``, from a holder told ``drop`` with ``evict``): the hold ends now and
        the client's memory is on its way out (reports, then ``evicted``). A request is taken
        back as ``cancel`` does (its seq is returned: the shell may wait for the answer).
        Neither: the wish goes, and nothing is sent."""
        if not self.holds:
            return self.cancel()
        self.wanted = False
        self._move(Hold.IDLE)
        self.paused = False
        evicting_field = True if evicting and p.FEATURE_MEMORY in self.features else None
        if numbered:
            return self._send_numbered(p.RELEASE, evicting=evicting_field)
        self._send(p.RELEASE, evicting=evicting_field)
        return None

    def cancel(self) -> int | None:
        """Take back a request (or a hold) and wait for the answer: RELEASING until it comes,
        and a grant that crossed the release is ignored. Returns the release's seq, or None
        when nothing was asked or held on this connection."""
        self.wanted = False
        if self.state not in (Hold.ASKING, Hold.WAITING, Hold.HOLDING, Hold.DROPPING):
            return None
        return self._releasing(evict_first=False)

    def release_evicting_first(self) -> int | None:
        """Give the GPU back of one's own accord, asking whether to evict first (docs/
        protocol.md): ``released`` ends it, a ``drop`` with its seq means evict, then
        ``release``."""
        self.wanted = False
        if not self.holds:
            return None
        return self._releasing(evict_first=True)

    def requeue(self) -> None:
        """Give the GPU back and ask again in one request; without a hold, ``ask``."""
        if not (self.holds and self.phase is Phase.READY):
            self.ask()
            return
        self.wanted = True
        self.paused = False
        self._move(Hold.ASKING)
        self._ask_seq = self._send_numbered(p.RELEASE, requeue=True)

    # -- what the daemon says -------------------------------------------------------------

    def receive_data(self, data: bytes) -> list[ev.Event]:
        """Bytes from the socket (b"" at its end is the shell's to see); ProtocolError when a
        line breaks the protocol."""
        happened: list[ev.Event] = []
        for line in self._buffer.feed(data):
            happened += self.receive(decode(line))
        return happened

    def receive(self, message: dict[str, Any]) -> list[ev.Event]:
        """One decoded message from the daemon."""
        op, seq = message.get("op"), message.get("seq")
        if self.phase is Phase.GREETING:
            # The daemon answers hello before anything else: a peer that does not is none.
            return self._welcomed(message) if op == p.WELCOME else [ev.Refused(message)]
        if self.phase is Phase.REGISTERING:
            if op == p.ERROR:
                return [ev.Refused(message)]
            if op == p.REGISTERED:
                return self._registered(message)
        if seq is not None:
            if seq == self._ask_seq:
                return self._asked(op, message)
            if seq == self._release_seq:
                return self._release_answered(op, message)
            if seq in self._pending:
                self._pending.discard(seq)
                return [ev.Reply(message, seq)]
            if seq in self._ignored:
                self._ignored.discard(seq)
                return []
        return self._event(op, message)

    # -- internals ------------------------------------------------------------------------

    def _move(self, to: Hold) -> None:
        if (self.state, to) not in MOVES:
            raise IllegalMove(self.state, to)
        self.state = to

    def _send(self, op: str, **fields: Any) -> None:
        self._out.append(encode(op, **fields))

    def _send_numbered(self, op: str, **fields: Any) -> int:
        self._seq += 1
        self._out.append(encode(op, seq=self._seq, **fields))
        return self._seq

    def _releasing(self, evict_first: bool) -> int:
        self._move(Hold.RELEASING)
        self.paused = False
        self._ask_seq = None
        self._release_evicts = evict_first
        self._release_seq = self._send_numbered(p.RELEASE, evict_first=evict_first or None)
        return self._release_seq

    def _welcomed(self, welcome: dict[str, Any]) -> list[ev.Event]:
        self.features = frozenset(welcome.get("features") or ())
        self.mode, self.tq = welcome.get("mode"), welcome.get("tq")
        if self._registration is None:
            self.phase = Phase.READY
            return [ev.Ready(welcome)]
        self.phase = Phase.REGISTERING
        self._welcome = welcome
        self._registered_working_set = self.working_set
        registration = self._registration
        if p.FEATURE_MEMORY not in self.features:
            # Where memory is means nothing to a daemon that does not serve the feature.
            registration = {key: value for key, value in registration.items()
                            if key not in _MEMORY_FIELDS}
        self._send(p.REGISTER, **registration, working_set=self.working_set)
        return []

    def _registered(self, registered: dict[str, Any]) -> list[ev.Event]:
        self.phase = Phase.READY
        self.client_id = registered.get("client")
        self.tq = registered.get("tq", self.tq)
        self.pin_budget = _budget(registered.get("pin_budget"))
        if self.wanted:
            # Asked without a seq: its answer (waiting or grant) reads as an event would.
            self._move(Hold.ASKING)
            self._ask_seq = None
            self._send(p.ACQUIRE)
        if self.working_set != self._registered_working_set:
            # Reported while registering: the register carried the one before.
            self._ignored.add(self._send_numbered(p.WORKING_SET,
                                                  bytes=int(self.working_set or 0)))
        return [ev.Ready(self._welcome, registered)]

    def _asked(self, op: Any, message: dict[str, Any]) -> list[ev.Event]:
        """The answer to our acquire or requeue."""
        self._ask_seq = None
        if op == p.RELEASED:
            # A daemon that predates requeue only released: ask again the plain way.
            self._move(Hold.IDLE)
            self.ask()
            return [ev.Released(message)]
        if op == p.ERROR:
            self.wanted = False
            self._move(Hold.IDLE)
            return [ev.AskRefused(message)]
        return self._event(op, message)

    def _release_answered(self, op: Any, message: dict[str, Any]) -> list[ev.Event]:
        """The answer to a release we wait for (a cancel, or one with evict_first)."""
        self._release_seq = None
        if op == p.DROP and self._release_evicts:
            self.last_drop = message
            self._move(Hold.DROPPING)
            return [ev.DropAsked(message, answer=True)]
        happened: list[ev.Event] = [ev.Released(message, answer=True)]
        if op != p.RELEASED:
            happened = [ev.DaemonError(message)]
            if self._release_evicts:
                # The hold must not stay half released: release plainly.
                self._send_numbered(p.RELEASE)
        self._move(Hold.IDLE)
        if self.wanted:
            self.ask()  # asked again while the release was on its way
        return happened

    def _event(self, op: Any, message: dict[str, Any]) -> list[ev.Event]:
        """A message that answers no request of ours that waits: an event, or a reply we do
        not wait for."""
        state = self.state
        if op == p.GRANT:
            if state in (Hold.ASKING, Hold.WAITING, Hold.DROPPING):
                self._move(Hold.HOLDING)
                self.paused = False
                return [ev.Granted(message)]
            return []  # it crossed a release of ours: the release ended it
        if op == p.WAITING:
            position = message.get("position")
            if state is Hold.WAITING or (state is Hold.ASKING and self._ask_seq is None):
                if state is Hold.ASKING:
                    self._move(Hold.WAITING)
                self._position = position if isinstance(position, int) else None
                return [ev.Queued(message, self._position)]
            return []
        if op == p.DROP:
            if not self.holds:
                return []  # it crossed our release
            self.last_drop = message
            if state is Hold.HOLDING:
                self._move(Hold.DROPPING)
            return [ev.DropAsked(message)]
        if op == p.REVOKED:
            held = self.holds
            if held:
                self.wanted = False
                self.paused = False
                self._move(Hold.IDLE)
            return [ev.Revoked(message, held)]
        if op == p.PAUSE or op == p.RESUME:
            pause = op == p.PAUSE
            if not self.holds or self.paused == pause:
                return []
            self.paused = pause
            return [ev.TurnPaused(message) if pause else ev.TurnResumed(message)]
        if op == p.EVICT:
            # Only to an idle client: one that holds (a grant crossed it) is told drop
            # instead, and says at once that it cannot move now, so that the daemon does not
            # wait for a move that never comes.
            if state in (Hold.HOLDING, Hold.DROPPING, Hold.RELEASING):
                if p.FEATURE_MEMORY in self.features:
                    self._ignored.add(self._send_numbered(p.EVICTED, failed=HOLDING_NO_EVICT))
                return []
            return [ev.EvictAsked(message)]
        if op == p.SPILL or op == p.FETCH:
            # Only to an idle client: one that holds (a grant crossed it) says at once that it
            # cannot move now, so that the daemon does not wait for a move that never comes.
            if state in (Hold.HOLDING, Hold.DROPPING, Hold.RELEASING):
                self._ignored.add(self._send_numbered(p.TIER_MOVED, tier="host",
                                                      failed=HOLDING_NO_EVICT))
                return []
            return [ev.SpillAsked(message) if op == p.SPILL else ev.FetchAsked(message)]
        if op == p.PIN_BUDGET:
            self.pin_budget = _budget(message.get("pin_budget"))
            return [ev.PinBudgetSet(message)]
        if op == p.MODE:
            self.mode, self.tq = message.get("mode"), message.get("tq")
            return [ev.ModeChanged(message)]
        if op == p.CHANGED:
            return [ev.StatusChanged(message)]
        if op == p.RELEASED:
            return [ev.Released(message)]
        if op == p.ERROR:
            if message.get("code") == p.E_ROOM and state in (Hold.ASKING, Hold.WAITING):
                # The daemon gave up the wait: the room cannot be made, and this client is idle
                # again. Asking again at once would be refused again: the shell backs off.
                self.wanted = False
                self._ask_seq = None
                self._position = None
                self._move(Hold.IDLE)
                return [ev.AskRefused(message)]
            return [ev.DaemonError(message)]
        return []


def _budget(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None
