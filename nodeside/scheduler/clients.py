"""Each client the scheduler knows, and its hold: the hold state and its one transition table.

A client's hold goes through four states. Each move the scheduler makes is checked against the
one table below, so a rule that tries to grant a holder twice or release a client that never
asked fails loudly in tests instead of quietly corrupting the queue::

    IDLE --acquire--> WAITING --grant--> HOLDING --drop--> DROPPING
      ^                 |                   |    <--withdrawn--   |
      +----cancel-------+                   |   (mode off)        |
      +------------------release-----------+                     |
      +------------------release or revoke-----------------------+

The status document shows three words (docs/interfaces.md section 5): DROPPING is still "holding".

Where a client's memory is (``model.Residency``: on the GPU, moving out, in host memory, moving
in) is a state of its own, beside the hold, kept for clients that speak the ``memory`` feature,
with its own table (``RESIDENCY_MOVES``), written only through ``ClientRecord.settle`` and only by
the residency component (residency.py), as the hold is moved only by the turns (turns.py). In
short: resident memory is asked out (evicting) and lands in host memory (evicted), or falls back
(resident) when it could not leave; a grant brings evicted memory back in (restoring) until
nothing is left in host memory (resident).

What an eviction under way has heard, and why one failed, is its ``Eviction`` record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from nodeside.model import EVICTED, EVICTING, RESIDENT, RESTORING, Residency

__all__ = ["RESIDENCY_MOVES", "TRANSITIONS", "ClientRecord", "Eviction", "Hold", "HoldState",
           "IllegalTransition", "Tiering", "WaitingFor"]


class HoldState(Enum):
    IDLE = "idle"
    WAITING = "waiting"
    HOLDING = "holding"
    #: Holding, and asked to give the GPU back (a drop is out); the grace runs.
    DROPPING = "dropping"

    # Enum hashes by name in Python code; the members are singletons compared by identity, so
    # the identity hash is the same answer in C (every hold move looks a pair up in the table).
    __hash__ = object.__hash__

    @property
    def public(self) -> str:
        """The word the status document and the protocol use."""
        return "holding" if self is HoldState.DROPPING else self.value


#: Every legal move. Anything else is a bug in the rules.
TRANSITIONS: frozenset[tuple[HoldState, HoldState]] = frozenset({
    (HoldState.IDLE, HoldState.WAITING),        # acquire
    (HoldState.WAITING, HoldState.IDLE),        # the wait is cancelled, or the client leaves
    (HoldState.WAITING, HoldState.HOLDING),     # grant
    (HoldState.HOLDING, HoldState.DROPPING),    # asked to drop (quantum, preemption, room...)
    (HoldState.HOLDING, HoldState.IDLE),        # released, or the client leaves
    (HoldState.DROPPING, HoldState.IDLE),       # released after the drop, or revoked
    (HoldState.DROPPING, HoldState.HOLDING),    # the drop is withdrawn: mode off grants all
})


#: The table as a list of its pairs, which a move looks through by identity: an Enum member's
#: hash is a Python-level call (compiled too), and a set of pairs hashes the pair and both. A
#: handoff's three moves come first.
_HANDOFF_MOVES = [(HoldState.WAITING, HoldState.HOLDING), (HoldState.HOLDING, HoldState.IDLE),
                  (HoldState.IDLE, HoldState.WAITING)]
_MOVES: list[tuple[HoldState, HoldState]] = [
    *_HANDOFF_MOVES, *sorted(TRANSITIONS - set(_HANDOFF_MOVES), key=str)]
assert set(_MOVES) == TRANSITIONS


#: Every legal move of a client's memory; staying where it is is no move, and always legal.
RESIDENCY_MOVES: frozenset[tuple[Residency, Residency]] = frozenset({
    (RESIDENT, EVICTING),    # asked to evict or checkpointed for room, or released evicting
    (RESIDENT, EVICTED),     # evicted of its own accord
    (EVICTING, EVICTED),     # its way out, or its checkpoint, ended
    (EVICTING, RESIDENT),    # it could not evict (failed, stalled, its checkpoint failed)
    (EVICTING, RESTORING),   # granted before its way out ended
    (EVICTED, RESTORING),    # granted: it moves back in
    (EVICTED, RESIDENT),     # back without a grant (mode off), or it holds no GPU memory
    (EVICTED, EVICTING),     # checkpointed for room
    (RESTORING, RESIDENT),   # restored: nothing left in host memory
    (RESTORING, EVICTED),    # its restore rolled back, or it evicted again
    (RESTORING, EVICTING),   # released evicting before its restore ended
})
#: The table as a list of its pairs, looked through by identity (as ``_MOVES``).
_RESIDENCY_MOVES: list[tuple[Residency, Residency]] = sorted(RESIDENCY_MOVES, key=str)


class IllegalTransition(Exception):  # not RuntimeError: mypyc compiles Exception subclasses only
    """The rules tried a move the table does not allow: a scheduler bug, never a peer's."""

    def __init__(self, client: str, before: HoldState | Residency,
                 after: HoldState | Residency) -> None:
        super().__init__(f"client {client}: {before.value} -> {after.value} is not a legal move")
        self.before = before
        self.after = after


@dataclass(init=False)  # one per grant: compiled, a dataclass's __init__ stays interpreted
class Hold:
    granted_at: float
    quantum_start: float
    drop_reason: str | None
    drop_sent_at: float | None
    drop_evict: bool
    #: Who the GPU was asked back for. The choice was made with this holder still contending
    #: (as if it asked again at the tail); when it gives the GPU back, that choice stands.
    #: Choosing afresh at that instant would leave the holder's pool out of the entitlements
    #: for a moment and tilt every handoff towards the other pools.
    drop_incoming: str | None
    #: Taking turns (taking_turns.py): when this holder's turn began, None while it is paused;
    #: since when it has been paused, None while it works; and whether the turn it has is one
    #: it was owed for having been paused a whole TQ (no lighter holder cuts that one short).
    turn_start: float | None
    paused_since: float | None
    owed_turn: bool

    def __init__(self, granted_at: float, quantum_start: float, drop_reason: str | None = None,
                 drop_sent_at: float | None = None, drop_evict: bool = False,
                 drop_incoming: str | None = None) -> None:
        self.granted_at = granted_at
        self.quantum_start = quantum_start
        self.drop_reason = drop_reason
        self.drop_sent_at = drop_sent_at
        self.drop_evict = drop_evict
        self.drop_incoming = drop_incoming
        self.turn_start = granted_at
        self.paused_since = None
        self.owed_turn = False


@dataclass(frozen=True)
class WaitingFor:
    """What a waiter waits for besides its turn: ``client`` (``name`` to people) to move
    ``bytes`` out of the way; ``action`` is ``evict``, ``checkpoint`` or ``restore``."""

    client: str
    name: str
    bytes: int
    action: str


@dataclass(init=False)  # compiled, a dataclass's __init__ stays interpreted
class Eviction:
    """What the scheduler knows of a memory client's evictions (residency.py): since when its
    memory is where it is, the way out under way, why the last one failed, when it was last
    asked. Written by the residency component only."""

    #: When its memory reached where it is now (its residency's last move; None: registered
    #: there). An evicted client's second stage (checkpoint) counts from then; a restore's
    #: length is measured from it.
    since: float | None
    #: When it was asked to evict (or released with ``evicting``), while it is on its way out.
    asked_at: float | None
    #: While on that way out: whether it reported since it was asked (its way out began: never
    #: checkpointed from then on), and when it last made progress (a report of PROGRESS_BYTES
    #: fewer on the GPU). Its ``evict_timeout`` runs from its last progress, else from the ask.
    began: bool
    progress_at: float | None
    #: A checkpoint was asked for (and not yet undone by a grant).
    checkpoint: bool
    #: Why it could not evict (its ``evicted`` said ``failed``, it made no progress in time, or
    #: a checkpoint failed); it is not asked again, and what NVML does not vouch for of its
    #: memory no longer counts against others' room, until its next grant.
    failed: str | None
    #: When it was last asked to evict (``Evict`` or ``Suspend`` for room): the next request
    #: waits ``evict_interval`` (a TQ for a waiter of lower priority than it).
    last_asked: float | None

    def __init__(self) -> None:
        self.since = None
        self.asked_at = None
        self.began = False
        self.progress_at = None
        self.checkpoint = False
        self.failed = None
        self.last_asked = None

    def asked(self, now: float | None) -> None:
        """Asked to evict at ``now`` (None: the way out is over): nothing heard since."""
        self.asked_at = now
        self.began = False
        self.progress_at = None


class Tiering:
    """What the scheduler knows of a ``tiers`` client's host memory and disk (tiers.py): its
    spill files, pinned bytes, the move between host and disk under way, why the last failed,
    the pin budget it was told, and an intent waiting for room."""

    #: Bytes in its spill files, and of its host memory pinned (as it reported them).
    disk: int
    pinned: int
    #: The move it was asked for and has not ended: "spill" or "fetch" (None: none).
    moving: str | None
    #: Why its last move between host memory and disk failed; it is not asked to spill again
    #: until a report changes its figures (``failed_at``: the figures it failed with).
    failed: str | None
    failed_at: tuple[int, int] | None
    #: The pin budget it was last told (None: not yet).
    pin_budget: int | None
    #: A hint that it is about to work came while its memory could not come to the GPU yet.
    intent: bool
    #: While a move is under way: when it began or last made progress, and its disk figure
    #: then (``tier_timeout`` runs from there).
    progress_at: float | None
    progress_disk: int
    #: After a move given up for want of progress: no move is asked of it before
    #: ``retry_at``; ``backoff`` is how long the last give-up waits (0: none since a move
    #: ended).
    retry_at: float | None
    backoff: float

    def __init__(self) -> None:
        self.disk = 0
        self.pinned = 0
        self.moving = None
        self.failed = None
        self.failed_at = None
        self.pin_budget = None
        self.intent = False
        self.progress_at = None
        self.progress_disk = 0
        self.retry_at = None
        self.backoff = 0.0


@dataclass(eq=False)  # one object per client: compared by identity, and cheaply
class ClientRecord:
    id: str
    name: str
    gpu: int
    pool: str
    priority: str
    pid: int | None = None
    uid: int | None = None
    kind: str = "client"
    labels: Mapping[str, str] = field(default_factory=dict)
    working_set: int | None = None  # bytes; None while unknown, which counts as the whole GPU
    evictable: int | None = None
    registered_at: float = 0.0
    #: What people see (a notebook's path); ``name`` stays the key.
    display_name: str = ""
    #: The user name of the peer's uid, resolved by the shell (the core does no I/O).
    user: str | None = None
    #: How the client gives memory back: "managed" or "vmm" (the shim pages it), "checkpoint".
    evict: str = "managed"
    gids: tuple[int, ...] = ()
    #: Why the access policy changed the claimed pool or priority (for the log); None if not.
    warning: str | None = None
    #: The namespace of the peer's pod, as the daemon verified it (pid -> cgroup -> pod UID ->
    #: Kubernetes API); None when not in a pod or not verified. Never what the client says.
    namespace: str | None = None
    #: The client stops its GPU work on ``pause`` and goes on at ``resume`` (the CUDA shim
    #: does), so it may take turns with the holders beside it (taking_turns.py).
    pausable: bool = False
    hold_state: HoldState = HoldState.IDLE
    request_order: int = 0  # global counter: request order, also across pools
    requested_at: float | None = None
    hold: Hold | None = None
    gpu_seconds: float = 0.0  # closed holds only; see Scheduler.gpu_seconds
    # -- resident memory (feature ``memory``, residency.py); untouched for other clients ------
    #: It speaks the ``memory`` feature: its resident memory counts, and it may be asked to
    #: evict while idle.
    memory: bool = False
    #: Where its memory is; moved only by ``settle``.
    residency: Residency = RESIDENT
    #: Bytes on the GPU and in host memory, as it reported them (its claims: residency.py
    #: counts NVML's figure instead wherever NVML vouches for the process).
    resident_bytes: int = 0
    host_bytes: int = 0
    #: Host memory it keeps for its evictions (the vmm evictor's shadows, made ahead; they
    #: hold its ``host_bytes`` while evicted): host memory evictions have already.
    shadow_bytes: int = 0
    #: Where the bytes it counts for come from: "shim" (its reports), "nvml" (NVML's
    #: per-process figure, which stands for its process wherever the daemon reads one) or
    #: "working_set" (nothing but the declared working set is known).
    memory_source: str = "working_set"
    #: NVML's per-process figure, where the daemon reads one (0: NVML lists no memory of its
    #: process); None where NVML cannot vouch for it.
    nvml_bytes: int | None = None
    waiting_for: WaitingFor | None = None
    #: When it last held the GPU (least recently used is asked to evict first).
    last_used: float = 0.0
    #: Its evictions: the way out under way, why one failed (residency.py).
    eviction: Eviction = field(default_factory=Eviction)
    #: The daemon's checkpoint evictor can reach its process (set when it registers).
    checkpointable: bool = False
    #: Its host memory and disk (feature ``tiers``; None: it does not speak it).
    tiering: Tiering | None = None
    # -- what its waits cost others (fair eviction, residency.py) ----------------------------
    #: Evictions asked for it since its last grant (or cancel), and in all (metrics).
    room_asked: int = 0
    evictions_asked: int = 0
    #: The most bytes it was seen to hold on the GPU during its current hold: a grant that
    #: others evicted for is used when this comes to half its need.
    peak_bytes: int = 0
    #: Its need when its current hold began, and whether others evicted for that grant.
    room_need: int = 0
    room_made: bool = False
    #: Grants (or waits) that others evicted for and it did not use, in a row: each doubles
    #: how long before its next wait may ask anyone to evict (``may_ask_from``).
    unused_room: int = 0
    may_ask_from: float = 0.0

    def __post_init__(self) -> None:
        if not self.display_name:
            self.display_name = self.name

    @property
    def state(self) -> str:
        """idle | waiting | holding, as the status document says it."""
        return self.hold_state.public

    def move(self, to: HoldState) -> None:
        """Change the hold state, or raise IllegalTransition."""
        before = self.hold_state
        for source, target in _MOVES:
            if source is before and target is to:
                self.hold_state = to
                return
        raise IllegalTransition(self.id, before, to)

    def settle(self, to: Residency, now: float | None) -> None:
        """Move its memory to ``to`` at ``now``, or raise IllegalTransition; staying where it
        is changes nothing."""
        before = self.residency
        if before is to:
            return
        for source, target in _RESIDENCY_MOVES:
            if source is before and target is to:
                self.residency = to
                self.eviction.since = now
                return
        raise IllegalTransition(self.id, before, to)

    @property
    def evict_failed(self) -> str | None:
        """Why it could not evict (the status document's ``evict_failed``)."""
        return self.eviction.failed

    @property
    def preemptible(self) -> bool:
        return self.priority == "LOW"

    @property
    def paused(self) -> bool:
        """Holding, but waiting for its turn at the GPU's time."""
        return self.hold is not None and self.hold.paused_since is not None
