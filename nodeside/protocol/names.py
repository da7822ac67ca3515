"""The protocol's names, generated from ``messages.py`` by ``python -m
nodeside.protocol.generate``: edit the table there and run it, never this file."""

from __future__ import annotations

from typing import Final

#: The protocol version spoken by this code. A peer announcing another one is refused.
VERSION: Final = 1
#: Largest line a client may send, newline included. Requests are small; anything larger is a
#: broken or hostile peer, and the daemon must not buffer without bound for it.
MAX_REQUEST_BYTES: Final = 65536
#: Largest line the daemon may send. Status documents grow with the number of clients (about 300
#: bytes each), so replies get far more room than requests.
MAX_REPLY_BYTES: Final = 16777216
#: Where the node daemon listens unless told otherwise (``KIWI_SOCKET``, ``--socket``).
DEFAULT_SOCKET: Final = "/var/run/kiwi/scheduler.sock"
#: The pool a client joins unless it names one (``KIWI_POOL``).
DEFAULT_POOL: Final = "default"
#: The priority a client asks for unless it names one (``KIWI_PRIORITY``).
DEFAULT_PRIORITY: Final = "NORMAL"
#: The scheduler's modes (``set_mode``).
MODES: Final[tuple[str, ...]] = ("on", "off", "auto")
#: A client's priorities (``register``), highest first.
PRIORITIES: Final[tuple[str, ...]] = ("HIGH", "NORMAL", "LOW")
#: How a client's memory leaves the GPU (``register``'s ``evict``).
EVICTORS: Final[tuple[str, ...]] = ("managed", "checkpoint", "vmm")

# -- requests a client sends -----------------------------------------------------------------------

# Each may carry an integer "seq"; the reply to it carries the same "seq", so a client can match
# replies to requests while events arrive in between.

#: Answered with `welcome`, with `features` when asked; must come first
HELLO: Final = "hello"
#: Answered with `registered`: become a scheduling client; a connection registers at most once
REGISTER: Final = "register"
#: Answered with `grant` if granted now, else `waiting` with `position` (1-based); the `grant`
#: follows as an event
ACQUIRE: Final = "acquire"
#: Answered with `released` with `evict` (bool); gives back the GPU, or cancels a pending
#: acquire; a no-op when neither. With `evict_first: true` from a holder whose next holder needs
#: the room: `drop` instead, and the GPU is kept. With `requeue: true`: release and ask again in
#: one request, answered as `acquire` is
RELEASE: Final = "release"
#: Answered with `ok`
WORKING_SET: Final = "working_set"
#: Answered with `ok`; `memory` feature: an eviction ended, asked (`evict`) or of the client's
#: own accord
EVICTED: Final = "evicted"
#: Answered with `ok`; `tiers` feature: a move between host memory and disk ended, asked
#: (`spill`, `fetch`) or of the client's own accord
TIER_MOVED: Final = "tier_moved"
#: Answered with `ok`; `tiers` feature: a hint that a kernel of this peer's uid is about to
#: work; the daemon starts bringing its memory a tier closer (`fetch`). A hint never takes the
#: GPU from a holder and never evicts anyone; `invalid` for a name no client of this uid has
INTENT: Final = "intent"
#: Answered with `status` with field `status`: the status document
#: ([interfaces.md](interfaces.md) section 5); besides the contract's keys, `configured_pools`
#: (the names the config's `pools:` section gives, sorted; empty when it gives none: any other
#: name a client registers with is a pool with no guarantee)
STATUS: Final = "status"
#: Answered with `ok` with `mode`, `tq`; or error `permission`; admin only
SET_MODE: Final = "set_mode"
#: Answered with `ok` with `mode`, `tq`; or error `permission`, or `limit` outside the range;
#: admin only
SET_TQ: Final = "set_tq"
#: Answered with `pong`: liveness and benchmarks
PING: Final = "ping"
REQUESTS: Final = frozenset({
    HELLO, REGISTER, ACQUIRE, RELEASE, WORKING_SET, EVICTED, TIER_MOVED, INTENT, STATUS,
    SET_MODE, SET_TQ, PING
})
#: Each request's fields as (name, type, required), the types those of messages.TYPES: what
#: wire.check_request checks.
REQUEST_FIELDS: Final[dict[str, tuple[tuple[str, str, bool], ...]]] = {
    HELLO: (("version", "int", True), ("software", "str", False), ("features", "list", False)),
    REGISTER: (
        ("name", "str", False),
        ("pool", "str", False),
        ("priority", "str", False),
        ("gpu", "int", False),
        ("working_set", "int", False),
        ("kind", "str", False),
        ("labels", "object", False),
        ("display_name", "str", False),
        ("gpu_uuid", "str", False),
        ("evict", "str", False),
        ("pausable", "bool", False),
        ("resident", "int", False),
        ("host", "int", False),
        ("shadow", "int", False),
        ("disk", "int", False),
    ),
    RELEASE: (
        ("evict_first", "bool", False),
        ("requeue", "bool", False),
        ("evicting", "bool", False),
    ),
    WORKING_SET: (
        ("bytes", "int", True),
        ("evictable", "int", False),
        ("resident", "int", False),
        ("host", "int", False),
        ("shadow", "int", False),
        ("disk", "int", False),
        ("pinned", "int", False),
    ),
    EVICTED: (
        ("resident", "int", False),
        ("host", "int", False),
        ("shadow", "int", False),
        ("disk", "int", False),
        ("moved", "int", False),
        ("seconds", "number", False),
        ("failed", "str", False),
    ),
    TIER_MOVED: (
        ("tier", "str", False),
        ("host", "int", False),
        ("disk", "int", False),
        ("moved", "int", False),
        ("seconds", "number", False),
        ("failed", "str", False),
    ),
    INTENT: (("name", "str", True), ("reason", "str", False)),
    SET_MODE: (("mode", "str", True),),
    SET_TQ: (("tq", "number", True), ("gpu", "int", False)),
}

# -- what the daemon sends: replies (with the request's seq), events (without) ---------------------

#: Reply to hello: the daemon speaks this version.
WELCOME: Final = "welcome"
#: Reply to register: the connection is a scheduling client now.
REGISTERED: Final = "registered"
#: Reply to acquire, release; and event: you hold the GPU now; if you were waiting, this ends
#: the wait.
GRANT: Final = "grant"
#: Reply to acquire, release; and event: queued; as an event only to clients whose `hello` asked
#: for `position`: your place in the queue moved.
WAITING: Final = "waiting"
#: Reply to release: the GPU (or the wait) is given back.
RELEASED: Final = "released"
#: Reply to release; and event: give the GPU back: finish or pause the work in flight, then send
#: `release`; to go on, `acquire` after the release (you join the tail of the queue). Also the
#: reply to `release` with `evict_first`, then carrying its `seq`.
DROP: Final = "drop"
#: Event: you ignored a `drop` for longer than `grace`: the daemon took the GPU back and granted
#: it to the next waiter. Stop GPU work and `acquire` again.
REVOKED: Final = "revoked"
#: Event: only to holders that registered `pausable`: keep the GPU and your memory, but start no
#: GPU work until `resume`; a holder beside you has its turn.
PAUSE: Final = "pause"
#: Event: your turn: GPU work may go on.
RESUME: Final = "resume"
#: Event: `memory` feature, only to an idle client that pages itself (`managed` or `vmm`): move
#: your memory to host memory now; report progress in `working_set` and the end in `evicted`. A
#: holder gets `drop` with `evict` instead.
EVICT: Final = "evict"
#: Event: `tiers` feature, only to an idle client whose memory is in host memory: move it to
#: your spill files now; report progress in `working_set` and the end in `tier_moved`.
SPILL: Final = "spill"
#: Event: `tiers` feature, a hint to an idle client: it is about to work, bring its memory a
#: tier closer; the end in `tier_moved` (`host`) or in `working_set` with `host` 0 (`gpu`).
FETCH: Final = "fetch"
#: Event: `tiers` feature: the most host memory the client may keep pinned ahead from now on;
#: over it, unpin or drop the shadows of memory that is on the GPU and report `working_set`.
PIN_BUDGET: Final = "pin_budget"
#: Event: only to connections whose `hello` asked for `changes`: the status document reads
#: otherwise now; ask for it with `status`.
CHANGED: Final = "changed"
#: Event: the scheduler's mode or TQ changed (sent to every connection).
MODE: Final = "mode"
#: Reply to working_set, evicted, tier_moved, intent, set_mode, set_tq: done.
OK: Final = "ok"
#: Reply to ping: alive.
PONG: Final = "pong"
#: Reply to status: the status document.
STATUS_REPLY: Final = "status"
#: Reply to any request; and event: the request was refused; without a `seq` when the line had
#: none or could not be read.
ERROR: Final = "error"

# -- error codes -----------------------------------------------------------------------------------

#: not JSON, not UTF-8, a string that is no sequence of Unicode scalar values (a lone UTF-16
#: surrogate such as `"\ud800"`; a pair is fine), not an object, no string `op`, a field of the
#: wrong type
E_MALFORMED: Final = "malformed"
#: a line over 65,536 bytes
E_TOO_LARGE: Final = "too_large"
#: an `op` this version does not define
E_UNKNOWN_OP: Final = "unknown_op"
#: `hello` with another version, or a request before `hello`
E_VERSION: Final = "version"
#: an admin request from a non-admin peer
E_PERMISSION: Final = "permission"
#: a value the daemon does not know (unknown mode, unknown GPU, unknown `evict`, `requeue` with
#: `evict_first`), or a claim it cannot be (a `resident` larger than the GPU)
E_INVALID: Final = "invalid"
#: not possible now (acquire before register, register twice)
E_STATE: Final = "state"
#: a bound exceeded: a TQ outside 0.01 s..1 day, a byte count outside 0..2^50, a name, display
#: name, pool, kind, label key or value over 256 UTF-8 bytes or holding a control character,
#: more than 64 labels, more than 2 MiB of labels on the node, more than 2,048 clients, a uid
#: past its share of either (half of what the other uids leave, at most `connections.uid_share`)
#: or a pod past its share of its uid's; the message says which. Also the last line of a
#: connection closed for a connection limit
E_LIMIT: Final = "limit"
#: `memory` feature, as an event to a waiter: the room it needs cannot be made (the message
#: names who holds the memory); it is idle again
E_ROOM: Final = "room"
#: The codes after which the daemon closes the connection: the peer is not speaking this
#: protocol and nothing it sends next can be trusted.
FATAL_ERRORS: Final = frozenset({E_MALFORMED, E_TOO_LARGE, E_UNKNOWN_OP, E_VERSION})

# -- features a client asks for in hello -----------------------------------------------------------

#: `waiting` events as the queue position changes
FEATURE_POSITION: Final = "position"
#: `changed` events when the status document changes
FEATURE_CHANGES: Final = "changes"
#: resident memory: `evict` events, the `evicted` request, `resident`/`host` in `register` and
#: `working_set`, `release` with `evicting`, `error` `room` events
FEATURE_MEMORY: Final = "memory"
#: memory tiers (with `memory`): `spill`, `fetch` and `pin_budget` events, the `tier_moved` and
#: `intent` requests, `disk`/`pinned` figures
FEATURE_TIERS: Final = "tiers"
#: Every feature; a client that asks for none hears nothing new.
FEATURES: Final = frozenset({FEATURE_POSITION, FEATURE_CHANGES, FEATURE_MEMORY, FEATURE_TIERS})

# -- why a holder is asked to drop the GPU (drop, revoked) -----------------------------------------

#: your quantum ended and someone waits
REASON_QUANTUM: Final = "quantum"
#: a non-preemptible request of a pool below its guarantee
REASON_PREEMPT: Final = "preempt"
#: the scheduler was turned on while several held
REASON_MODE: Final = "mode"
#: auto mode: a request does not fit beside you
REASON_ROOM: Final = "room"
#: your pool reached its maximum share of the GPU's time
REASON_MAXIMUM: Final = "maximum"
#: (in `revoked`) the holder ignored a drop past its grace period
REASON_GRACE: Final = "grace"
#: the reply to `release` with `evict_first`: evict, then release
REASON_RELEASE: Final = "release"
#: Every reason.
REASONS: Final = frozenset({
    REASON_QUANTUM, REASON_PREEMPT, REASON_MODE, REASON_ROOM, REASON_MAXIMUM, REASON_GRACE,
    REASON_RELEASE
})

__all__ = [
    "ACQUIRE", "CHANGED", "DEFAULT_POOL", "DEFAULT_PRIORITY", "DEFAULT_SOCKET", "DROP", "ERROR",
    "EVICT", "EVICTED", "EVICTORS", "E_INVALID", "E_LIMIT", "E_MALFORMED", "E_PERMISSION",
    "E_ROOM", "E_STATE", "E_TOO_LARGE", "E_UNKNOWN_OP", "E_VERSION", "FATAL_ERRORS", "FEATURES",
    "FEATURE_CHANGES", "FEATURE_MEMORY", "FEATURE_POSITION", "FEATURE_TIERS", "FETCH", "GRANT",
    "HELLO", "INTENT", "MAX_REPLY_BYTES", "MAX_REQUEST_BYTES", "MODE", "MODES", "OK", "PAUSE",
    "PING", "PIN_BUDGET", "PONG", "PRIORITIES", "REASONS", "REASON_GRACE", "REASON_MAXIMUM",
    "REASON_MODE", "REASON_PREEMPT", "REASON_QUANTUM", "REASON_RELEASE", "REASON_ROOM",
    "REGISTER", "REGISTERED", "RELEASE", "RELEASED", "REQUESTS", "REQUEST_FIELDS", "RESUME",
    "REVOKED", "SET_MODE", "SET_TQ", "SPILL", "STATUS", "STATUS_REPLY", "TIER_MOVED", "VERSION",
    "WAITING", "WELCOME", "WORKING_SET"
]
