"""The protocol's one table: every message, its fields, who sends it and what it answers.

Everything else follows from here. ``python -m nodeside.protocol.generate`` writes from it the
Python names (``names.py``), the tables of docs/protocol.md, the C header the shim includes
(``kiwi_jupyter/shim/client/protocol.h``) and the panel's status types; the daemon checks each
request's fields against it (``wire.check_request``). Adding a message, a field, an error code or
a reason is one entry here and one run of the generator; a test fails while a generated file
differs from what this table makes.

A field's type is one of ``TYPES``. A request's field is checked for its type where the line is
read (a wrong one is ``malformed`` and closes the connection); its range, or whether a string is
one of the values the docs name, is the daemon's business (``invalid``, which does not).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

#: The field types, and the JSON each stands for. ``number`` is an int or a float; ``object`` a
#: JSON object (labels, the status document); ``list`` a list of strings.
TYPES: Final[tuple[str, ...]] = ("int", "number", "str", "bool", "list", "object")


@dataclass(frozen=True)
class Field:
    name: str
    type: str
    required: bool = False
    #: A few words for the docs' tables: what the value means, its unit or its values.
    doc: str = ""


@dataclass(frozen=True)
class Message:
    #: The Python name (``names.GRANT``), and ``KIWI_OP_<const>`` in C.
    const: str
    op: str
    #: "request" (a client sends it) or "daemon" (the daemon sends it: a reply, an event or both).
    sender: str
    fields: tuple[Field, ...] = ()
    #: The requests this message may answer, carrying their ``seq``; empty: it never answers.
    answers: tuple[str, ...] = ()
    #: The daemon may send it on its own, without a ``seq``.
    event: bool = False
    #: What it does or means, for the docs and the names' comments. For a request, what the
    #: daemon answers.
    doc: str = ""

    @property
    def directions(self) -> tuple[str, ...]:
        """``request``, or which of ``reply`` and ``event`` this daemon message is."""
        if self.sender == "request":
            return ("request",)
        return (("reply",) if self.answers else ()) + (("event",) if self.event else ())


@dataclass(frozen=True)
class Word:
    """A string the protocol gives a meaning: an error code, a feature, a drop's reason."""

    const: str
    value: str
    doc: str
    #: Error codes only: the connection closes after this error.
    fatal: bool = False


@dataclass(frozen=True)
class Constant:
    const: str
    value: int | str
    doc: str


def _f(name: str, type: str, doc: str = "", *, required: bool = False) -> Field:
    return Field(name, type, required, doc)


_GPU = _f("gpu", "int", "the GPU's index")
DISK_DOC: Final = "`tiers` feature: bytes in its spill files on the node's disk now"
PINNED_DOC: Final = ("`tiers` feature: bytes of its host memory that are pinned (shadows and "
                     "staging), counted in `host` and in `shadow`")
SHADOW_DOC: Final = ("`memory` feature: host memory the client keeps for its evictions (the "
                     "vmm evictor's shadows, made ahead; they hold what is evicted), in bytes; "
                     "the daemon counts it as host memory evictions already have")

MESSAGES: Final[tuple[Message, ...]] = (
    # -- requests ---------------------------------------------------------------------------
    Message("HELLO", "hello", "request", (
        _f("version", "int", "the protocol version, 1", required=True),
        _f("software", "str", "who is speaking, for the daemon's log"),
        _f("features", "list", "optional behaviours the client understands"),
    ), doc="`welcome`, with `features` when asked; must come first"),
    Message("REGISTER", "register", "request", (
        _f("name", "str", "the client's key"),
        _f("pool", "str", "default `default`"),
        _f("priority", "str", "`HIGH`/`NORMAL`/`LOW`, default `NORMAL`"),
        _f("gpu", "int", "default 0"),
        _f("working_set", "int", "bytes"),
        _f("kind", "str", "`kernel`, `shim`, `client`"),
        _f("labels", "object", "of strings, e.g. `pod`, `namespace`"),
        _f("display_name", "str", "what people see, e.g. a notebook's path; `name` stays the "
                                  "key"),
        _f("gpu_uuid", "str", "the GPU's UUID; when the daemon knows a GPU by that UUID the "
                              "client is placed on it, whatever `gpu` says"),
        _f("evict", "str", "`managed` or `checkpoint`: how this process's memory leaves the "
                           "GPU; with the `memory` feature also `vmm` (the client pages itself, "
                           "like `managed`)"),
        _f("pausable", "bool", "default false: the client honours `pause` and `resume`, so it "
                               "may take turns"),
        _f("resident", "int", "`memory` feature: bytes it has on the GPU already (a daemon "
                              "restart learns where memory is)"),
        _f("host", "int", "`memory` feature: bytes it has in host memory already"),
        _f("shadow", "int", SHADOW_DOC),
        _f("disk", "int", "`tiers` feature: bytes it has in spill files already"),
    ), doc="`registered`: become a scheduling client; a connection registers at most once"),
    Message("ACQUIRE", "acquire", "request",
            doc="`grant` if granted now, else `waiting` with `position` (1-based); the `grant` "
                "follows as an event"),
    Message("RELEASE", "release", "request", (
        _f("evict_first", "bool", "default false"),
        _f("requeue", "bool", "default false"),
        _f("evicting", "bool", "`memory` feature, default false: from a holder told `drop` with "
                               "`evict`: the hold ends now, its memory is still on its way out "
                               "(progress in `working_set`, the end in `evicted`)"),
    ), doc="`released` with `evict` (bool); gives back the GPU, or cancels a pending acquire; a "
           "no-op when neither. With `evict_first: true` from a holder whose next holder needs "
           "the room: `drop` instead, and the GPU is kept. With `requeue: true`: release and "
           "ask again in one request, answered as `acquire` is"),
    Message("WORKING_SET", "working_set", "request", (
        _f("bytes", "int", "the GPU memory this client needs", required=True),
        _f("evictable", "int", "bytes that can be paged out"),
        _f("resident", "int", "`memory` feature: bytes on the GPU now"),
        _f("host", "int", "`memory` feature: bytes in host memory now; 0 ends a restore"),
        _f("shadow", "int", SHADOW_DOC),
        _f("disk", "int", DISK_DOC),
        _f("pinned", "int", PINNED_DOC),
    ), doc="`ok`"),
    Message("EVICTED", "evicted", "request", (
        _f("resident", "int", "bytes still on the GPU"),
        _f("host", "int", "bytes in host memory now"),
        _f("shadow", "int", SHADOW_DOC),
        _f("disk", "int", DISK_DOC),
        _f("moved", "int", "bytes this eviction moved"),
        _f("seconds", "number", "how long it took"),
        _f("failed", "str", "why it could not evict (instead of the figures); the client is "
                            "not asked again until its next report"),
    ), doc="`ok`; `memory` feature: an eviction ended, asked (`evict`) or of the client's own "
           "accord"),
    Message("TIER_MOVED", "tier_moved", "request", (
        _f("tier", "str", "where its evicted memory is now: `host` or `disk`"),
        _f("host", "int", "bytes in host memory now"),
        _f("disk", "int", DISK_DOC),
        _f("moved", "int", "bytes this move moved"),
        _f("seconds", "number", "how long it took"),
        _f("failed", "str", "why it could not move (a full or failing disk): the memory stayed "
                            "where it was, nothing is lost"),
    ), doc="`ok`; `tiers` feature: a move between host memory and disk ended, asked (`spill`, "
           "`fetch`) or of the client's own accord"),
    Message("INTENT", "intent", "request", (
        _f("name", "str", "the kernel's client key, as it registered", required=True),
        _f("reason", "str", "`execute` (a cell is about to run) or `front` (its notebook was "
                            "brought to the front)"),
    ), doc="`ok`; `tiers` feature: a hint that a kernel of this peer's uid is about to work; "
           "the daemon starts bringing its memory a tier closer (`fetch`). A hint never takes "
           "the GPU from a holder and never evicts anyone; `invalid` for a name no client of "
           "this uid has"),
    Message("STATUS", "status", "request",
            doc="`status` with field `status`: the status document ([interfaces.md](interfaces.md) "
                "section 5); besides the contract's keys, `configured_pools` (the names the "
                "config's `pools:` section gives, sorted; empty when it gives none: any other name "
                "a client registers with is a pool with no guarantee)"),
    Message("SET_MODE", "set_mode", "request", (
        _f("mode", "str", "`on`/`off`/`auto`", required=True),
    ), doc="`ok` with `mode`, `tq`; or error `permission`; admin only"),
    Message("SET_TQ", "set_tq", "request", (
        _f("tq", "number", "seconds from 0.01 to 86,400", required=True),
        _f("gpu", "int", "that GPU only"),
    ), doc="`ok` with `mode`, `tq`; or error `permission`, or `limit` outside the range; admin "
           "only"),
    Message("PING", "ping", "request", doc="`pong`: liveness and benchmarks"),
    # -- what the daemon sends --------------------------------------------------------------
    Message("WELCOME", "welcome", "daemon", (
        _f("version", "int", "the protocol version"),
        _f("daemon", "str", "the daemon's software and version"),
        _f("max_message", "int", "the longest line a client may send, newline included"),
        _f("mode", "str"),
        _f("tq", "number", "seconds"),
        _f("features", "list", "those asked for that the daemon serves; absent when none were "
                               "asked"),
    ), answers=("hello",), doc="the daemon speaks this version"),
    Message("REGISTERED", "registered", "daemon", (
        _f("client", "str", "the daemon's id for this client"),
        _f("gpu", "int", "the GPU it was placed on"),
        _f("mode", "str"),
        _f("tq", "number", "seconds, on its GPU"),
        _f("evict", "str", "the evictor the daemon carries out for it"),
        _f("pool", "str", "what it got, when the access policy downgraded its claim"),
        _f("priority", "str", "likewise"),
        _f("warning", "str", "why it was downgraded"),
        _f("pin_budget", "int", "`memory` feature: the most host memory, in bytes, the client "
                                "may keep pinned ahead for its evictions (the vmm evictor's "
                                "shadows and staging ring); absent: its own default"),
    ), answers=("register",), doc="the connection is a scheduling client now"),
    Message("GRANT", "grant", "daemon", (
        _GPU,
        _f("quantum", "number", "seconds"),
    ), answers=("acquire", "release"), event=True,
        doc="you hold the GPU now; if you were waiting, this ends the wait"),
    Message("WAITING", "waiting", "daemon", (
        _f("position", "int", "1-based place in the queue"),
    ), answers=("acquire", "release"), event=True,
        doc="queued; as an event only to clients whose `hello` asked for `position`: your "
            "place in the queue moved"),
    Message("RELEASED", "released", "daemon", (
        _f("evict", "bool", "the next holder needed the room"),
    ), answers=("release",), doc="the GPU (or the wait) is given back"),
    Message("DROP", "drop", "daemon", (
        _GPU,
        _f("reason", "str", "one of the reasons below"),
        _f("evict", "bool", "the next holder needs the memory: move your working set to host "
                            "memory first"),
        _f("grace", "number", "seconds before the GPU is revoked"),
    ), answers=("release",), event=True,
        doc="give the GPU back: finish or pause the work in flight, then send `release`; to "
            "go on, `acquire` after the release (you join the tail of the queue). Also the "
            "reply to `release` with `evict_first`, then carrying its `seq`"),
    Message("REVOKED", "revoked", "daemon", (
        _GPU,
        _f("reason", "str", "`grace`"),
    ), event=True, doc="you ignored a `drop` for longer than `grace`: the daemon took the GPU "
                       "back and granted it to the next waiter. Stop GPU work and `acquire` "
                       "again"),
    Message("PAUSE", "pause", "daemon", (_GPU,), event=True,
            doc="only to holders that registered `pausable`: keep the GPU and your memory, but "
                "start no GPU work until `resume`; a holder beside you has its turn"),
    Message("RESUME", "resume", "daemon", (_GPU,), event=True,
            doc="your turn: GPU work may go on"),
    Message("EVICT", "evict", "daemon", (
        _GPU,
        _f("bytes", "int", "the room needed"),
        _f("for", "str", "the display name of who needs the room"),
    ), event=True, doc="`memory` feature, only to an idle client that pages itself (`managed` or "
                       "`vmm`): move your memory to host memory now; report progress in "
                       "`working_set` and the end in `evicted`. A holder gets `drop` with "
                       "`evict` instead"),
    Message("SPILL", "spill", "daemon", (
        _GPU,
        _f("bytes", "int", "host memory to free; absent: all of it"),
    ), event=True, doc="`tiers` feature, only to an idle client whose memory is in host memory: "
                       "move it to your spill files now; report progress in `working_set` and "
                       "the end in `tier_moved`"),
    Message("FETCH", "fetch", "daemon", (
        _GPU,
        _f("tier", "str", "`host`: from disk to host memory; `gpu`: on to the GPU, where "
                          "there is room for it now"),
    ), event=True, doc="`tiers` feature, a hint to an idle client: it is about to work, bring "
                       "its memory a tier closer; the end in `tier_moved` (`host`) or in "
                       "`working_set` with `host` 0 (`gpu`)"),
    Message("PIN_BUDGET", "pin_budget", "daemon", (
        _f("pin_budget", "int", "bytes", required=True),
    ), event=True, doc="`tiers` feature: the most host memory the client may keep pinned ahead "
                       "from now on; over it, unpin or drop the shadows of memory that is on "
                       "the GPU and report `working_set`"),
    Message("CHANGED", "changed", "daemon", event=True,
            doc="only to connections whose `hello` asked for `changes`: the status document "
                "reads otherwise now; ask for it with `status`"),
    Message("MODE", "mode", "daemon", (
        _f("mode", "str"),
        _f("tq", "number", "seconds"),
    ), event=True, doc="the scheduler's mode or TQ changed (sent to every connection)"),
    Message("OK", "ok", "daemon", (
        _f("mode", "str", "after `set_mode` and `set_tq`"),
        _f("tq", "number", "likewise"),
    ), answers=("working_set", "evicted", "tier_moved", "intent", "set_mode", "set_tq"),
        doc="done"),
    Message("PONG", "pong", "daemon", answers=("ping",), doc="alive"),
    Message("STATUS_REPLY", "status", "daemon", (
        _f("status", "object", "the status document"),
    ), answers=("status",), doc="the status document"),
    Message("ERROR", "error", "daemon", (
        _f("code", "str", "one of the codes below"),
        _f("message", "str", "for people"),
    ), answers=("hello", "register", "acquire", "release", "working_set", "evicted",
                "tier_moved", "intent", "status", "set_mode", "set_tq", "ping"), event=True,
        doc="the request was refused; without a `seq` when the line had none or could not "
            "be read"),
)

ERRORS: Final[tuple[Word, ...]] = (
    Word("E_MALFORMED", "malformed", "not JSON, not UTF-8, a string that is no sequence of "
                                     "Unicode scalar values (a lone UTF-16 surrogate such as "
                                     "`\"\\ud800\"`; a pair is fine), not an object, no "
                                     "string `op`, a field of the wrong type", fatal=True),
    Word("E_TOO_LARGE", "too_large", "a line over 65,536 bytes", fatal=True),
    Word("E_UNKNOWN_OP", "unknown_op", "an `op` this version does not define", fatal=True),
    Word("E_VERSION", "version", "`hello` with another version, or a request before `hello`",
         fatal=True),
    Word("E_PERMISSION", "permission", "an admin request from a non-admin peer"),
    Word("E_INVALID", "invalid", "a value the daemon does not know (unknown mode, unknown GPU, "
                                 "unknown `evict`, `requeue` with `evict_first`), or a claim it "
                                 "cannot be (a `resident` larger than the GPU)"),
    Word("E_STATE", "state", "not possible now (acquire before register, register twice)"),
    Word("E_LIMIT", "limit", "a bound exceeded: a TQ outside 0.01 s..1 day, a byte count "
                             "outside 0..2^50, a name, display name, pool, kind, label key or "
                             "value over 256 UTF-8 bytes or holding a control character, more "
                             "than 64 labels, more than 2 MiB of labels on the node, more than "
                             "2,048 clients, a uid past its share of either (half of what "
                             "the other uids leave, at most `connections.uid_share`) or a pod "
                             "past its share of its uid's; the message says which. Also the "
                             "last line of a connection closed for a connection limit"),
    Word("E_ROOM", "room", "`memory` feature, as an event to a waiter: the room it needs cannot "
                           "be made (the message names who holds the memory); it is idle "
                           "again"),
)

FEATURES: Final[tuple[Word, ...]] = (
    Word("FEATURE_POSITION", "position", "`waiting` events as the queue position changes"),
    Word("FEATURE_CHANGES", "changes", "`changed` events when the status document changes"),
    Word("FEATURE_MEMORY", "memory", "resident memory: `evict` events, the `evicted` request, "
                                     "`resident`/`host` in `register` and `working_set`, "
                                     "`release` with `evicting`, `error` `room` events"),
    Word("FEATURE_TIERS", "tiers", "memory tiers (with `memory`): `spill`, `fetch` and "
                                   "`pin_budget` events, the `tier_moved` and `intent` requests, "
                                   "`disk`/`pinned` figures"),
)

REASONS: Final[tuple[Word, ...]] = (
    Word("REASON_QUANTUM", "quantum", "your quantum ended and someone waits"),
    Word("REASON_PREEMPT", "preempt", "a non-preemptible request of a pool below its "
                                      "guarantee"),
    Word("REASON_MODE", "mode", "the scheduler was turned on while several held"),
    Word("REASON_ROOM", "room", "auto mode: a request does not fit beside you"),
    Word("REASON_MAXIMUM", "maximum", "your pool reached its maximum share of the GPU's time"),
    Word("REASON_GRACE", "grace", "(in `revoked`) the holder ignored a drop past its grace "
                                  "period"),
    Word("REASON_RELEASE", "release", "the reply to `release` with `evict_first`: evict, then "
                                      "release"),
)

#: The values some string fields take (a mode, a priority, an evictor), in the docs' order.
MODES: Final[tuple[str, ...]] = ("on", "off", "auto")
PRIORITIES: Final[tuple[str, ...]] = ("HIGH", "NORMAL", "LOW")
EVICTORS: Final[tuple[str, ...]] = ("managed", "checkpoint", "vmm")

CONSTANTS: Final[tuple[Constant, ...]] = (
    Constant("VERSION", 1, "The protocol version spoken by this code. A peer announcing another "
                           "one is refused."),
    Constant("MAX_REQUEST_BYTES", 64 * 1024,
             "Largest line a client may send, newline included. Requests are small; anything "
             "larger is a broken or hostile peer, and the daemon must not buffer without bound "
             "for it."),
    Constant("MAX_REPLY_BYTES", 16 * 1024 * 1024,
             "Largest line the daemon may send. Status documents grow with the number of "
             "clients (about 300 bytes each), so replies get far more room than requests."),
    Constant("DEFAULT_SOCKET", "/var/run/kiwi/scheduler.sock",
             "Where the node daemon listens unless told otherwise (``KIWI_SOCKET``, "
             "``--socket``)."),
    Constant("DEFAULT_POOL", "default", "The pool a client joins unless it names one "
                                        "(``KIWI_POOL``)."),
    Constant("DEFAULT_PRIORITY", "NORMAL", "The priority a client asks for unless it names one "
                                           "(``KIWI_PRIORITY``)."),
)


def requests() -> tuple[Message, ...]:
    return tuple(m for m in MESSAGES if m.sender == "request")


def daemon_messages() -> tuple[Message, ...]:
    return tuple(m for m in MESSAGES if m.sender == "daemon")


def request(op: str) -> Message:
    for message in MESSAGES:
        if message.sender == "request" and message.op == op:
            return message
    raise KeyError(op)


def daemon_message(op: str) -> Message:
    for message in MESSAGES:
        if message.sender == "daemon" and message.op == op:
            return message
    raise KeyError(op)
