"""The wire protocol between the node daemon and its clients: the one definition.

Every message is one JSON object on one line of UTF-8, ended by ``\\n``, over a Unix stream
socket. docs/protocol.md is the prose version of this file, written for someone implementing a
client in another language (the CUDA shim speaks it from C); the two must agree.

This module is sans-I/O: it turns bytes into messages and messages into bytes, and checks that a
message is well formed. It never touches a socket.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Final, NoReturn

from nodeside.limits import MAX_INTEGER

#: The protocol version spoken by this code. A peer announcing another one is refused.
VERSION: Final = 1

#: Largest line a client may send, newline included. Requests are small; anything larger is a
#: broken or hostile peer, and the daemon must not buffer without bound for it.
MAX_REQUEST_BYTES: Final = 64 * 1024

#: Largest line the daemon may send. Status documents grow with the number of clients (about
#: 300 bytes each), so replies get far more room than requests.
MAX_REPLY_BYTES: Final = 16 * 1024 * 1024

# Typed out: mypyc's type check cannot infer them through the scheduler's import cycle.
PRIORITIES: Final[tuple[str, ...]] = ("HIGH", "NORMAL", "LOW")
MODES: Final[tuple[str, ...]] = ("on", "off", "auto")

# Defaults every peer shares. They live here, not in nodeside.config, so that a client (a kernel,
# kiwictl) learns them without importing the scheduler or the config loader.
#: Where the node daemon listens unless told otherwise (``KIWI_SOCKET``, ``--socket``).
DEFAULT_SOCKET: Final = "/var/run/kiwi/scheduler.sock"
#: The pool a client joins unless it names one (``KIWI_POOL``).
DEFAULT_POOL: Final = "default"
#: The priority a client asks for unless it names one (``KIWI_PRIORITY``).
DEFAULT_PRIORITY: Final = "NORMAL"

# Requests a client sends. Each may carry an integer "seq"; the reply to it carries the same
# "seq", so a client can match replies to requests while events arrive in between.
HELLO: Final = "hello"              # must come first: {"version": 1, "software": str?,
                                    #   "features": [str]?}; welcome lists those it serves
REGISTER: Final = "register"        # become a scheduling client (name, pool, priority, gpu, ...)
ACQUIRE: Final = "acquire"          # ask for the GPU; reply is "grant" or "waiting"
RELEASE: Final = "release"          # give it back, or cancel a wait; reply is "released", or
                                    # "drop" when {"evict_first": true} and the room is needed;
                                    # with {"requeue": true} release and ask again in one
                                    # request: the reply is acquire's ("grant" or "waiting")
WORKING_SET: Final = "working_set"  # {"bytes": int}: the GPU memory this client needs
STATUS: Final = "status"            # reply "status" with {"status": the status document}
SET_MODE: Final = "set_mode"        # {"mode": "on"|"off"|"auto"}; admin only
SET_TQ: Final = "set_tq"            # {"tq": seconds, "gpu": int?}; admin only
PING: Final = "ping"                # reply "pong"; liveness and benchmarks

REQUESTS: Final = frozenset(
    {HELLO, REGISTER, ACQUIRE, RELEASE, WORKING_SET, STATUS, SET_MODE, SET_TQ, PING}
)

# What the daemon sends: replies (carrying "seq" when the request had one) and events (no "seq").
WELCOME: Final = "welcome"          # reply to hello
REGISTERED: Final = "registered"    # reply to register: {"client": id, "gpu", "mode", "tq",
                                    #   "evict": the evictor the daemon carries out for it}
GRANT: Final = "grant"              # reply or event: the client now holds its GPU
WAITING: Final = "waiting"          # reply to acquire: queued, {"position": 1-based}; also an
                                    # event (no seq) when the position changes, to peers whose
                                    # hello asked for FEATURE_POSITION
RELEASED: Final = "released"        # reply to release
DROP: Final = "drop"                # event: give the GPU back soon {"reason", "evict", "grace"};
                                    # also the reply to release with evict_first (with its seq)
REVOKED: Final = "revoked"          # event: the daemon took the GPU back; stop using it
PAUSE: Final = "pause"              # event to a holder that registered "pausable": keep the GPU
                                    # and your memory, start no GPU work until "resume" {"gpu"}
RESUME: Final = "resume"            # event: your turn, GPU work may go on {"gpu"}
CHANGED: Final = "changed"          # event (no fields) to peers whose hello asked for
                                    # FEATURE_CHANGES: the status document people see changed
MODE: Final = "mode"                # event to every connection: {"mode", "tq"} changed
OK: Final = "ok"                    # reply to working_set, set_mode, set_tq
PONG: Final = "pong"
STATUS_REPLY: Final = "status"
ERROR: Final = "error"              # {"code", "message"}; codes below

# Error codes. The first four close the connection after the reply: the peer is not speaking
# this protocol and nothing it sends next can be trusted. The others leave it open.
E_MALFORMED: Final = "malformed"          # not JSON, not an object, missing or mistyped field
E_TOO_LARGE: Final = "too_large"          # a line over MAX_REQUEST_BYTES
E_UNKNOWN_OP: Final = "unknown_op"        # an "op" this version does not define
E_VERSION: Final = "version"              # hello with another version, or a request before hello
E_PERMISSION: Final = "permission"        # admin request from a peer that is not an admin
E_INVALID: Final = "invalid"              # well formed, but a value out of range
E_STATE: Final = "state"                  # not possible now (acquire before register, ...)
E_LIMIT: Final = "limit"                  # a bound of nodeside.limits exceeded (a name too long,
                                          # too many labels or connections); the message says which
FATAL_ERRORS: Final = frozenset({E_MALFORMED, E_TOO_LARGE, E_UNKNOWN_OP, E_VERSION})

# Optional behaviours a client asks for in hello's "features"; old clients hear nothing new.
FEATURE_POSITION: Final = "position"  # "waiting" events as the queue position changes
FEATURE_CHANGES: Final = "changes"    # "changed" events when the status document changes
FEATURES: Final = frozenset({FEATURE_POSITION, FEATURE_CHANGES})

# Why a holder is asked to drop the GPU, in "drop" and "revoked" events.
REASON_QUANTUM: Final = "quantum"    # its quantum ended and someone waits
REASON_PREEMPT: Final = "preempt"    # a non-preemptible request of a pool below its guarantee
REASON_MODE: Final = "mode"          # the scheduler was turned on while several held
REASON_ROOM: Final = "room"          # auto mode: a newcomer's working set does not fit
REASON_MAXIMUM: Final = "maximum"    # its pool reached its maximum share of the GPU's time
REASON_GRACE: Final = "grace"        # (revoked) the holder ignored a drop past its grace period
REASON_RELEASE: Final = "release"    # (reply to release with evict_first) evict, then release


class ProtocolError(Exception):
    """A message that breaks the protocol. ``code`` is one of the E_* codes."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def fatal(self) -> bool:
        return self.code in FATAL_ERRORS


# json.dumps with these settings would build an encoder for every message; every handoff
# encodes at least two.
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def encode(op: str, **fields: Any) -> bytes:
    """One message as the bytes of its line. ``None`` fields are left out."""
    body = {"op": op}
    body.update({k: v for k, v in fields.items() if v is not None})
    return _ENCODER.encode(body).encode() + b"\n"


# The lines of a handoff, written straight: each is exactly what ``encode`` makes of the same
# fields (tests/nodeside/test_protocol_fast.py holds them to that), without building a dict and
# walking the encoder's layers, which was a tenth of the daemon's work per handoff. Any value
# they do not expect takes ``encode``'s path.

def _seq_head(op: bytes, seq: int | None) -> bytes:
    return b'{"op":"%s"' % op if seq is None else b'{"op":"%s","seq":%d' % (op, seq)


# ``int`` spelled out: compiled (mypyc), a ``float`` parameter turns 30 into 30.0, which encodes
# apart.
def grant_line(gpu: int, quantum: float | int | None, seq: int | None = None) -> bytes:
    """``encode(GRANT, seq=seq, gpu=gpu, quantum=quantum)``."""
    if type(gpu) is int and (seq is None or type(seq) is int):
        if quantum is None:
            return _seq_head(b"grant", seq) + b',"gpu":%d}\n' % gpu
        if type(quantum) is float and math.isfinite(quantum):
            return _seq_head(b"grant", seq) + b',"gpu":%d,"quantum":%r}\n' % (gpu, quantum)
    return encode(GRANT, seq=seq, gpu=gpu, quantum=quantum)


def waiting_line(position: int | None, seq: int | None = None) -> bytes:
    """``encode(WAITING, seq=seq, position=position)``."""
    if type(position) is int and (seq is None or type(seq) is int):
        return _seq_head(b"waiting", seq) + b',"position":%d}\n' % position
    return encode(WAITING, seq=seq, position=position)


def released_line(evict: bool, seq: int | None = None) -> bytes:
    """``encode(RELEASED, seq=seq, evict=evict)``."""
    if type(evict) is bool and (seq is None or type(seq) is int):
        return _seq_head(b"released", seq) + (b',"evict":true}\n' if evict
                                              else b',"evict":false}\n')
    return encode(RELEASED, seq=seq, evict=evict)


def error(code: str, message: str, seq: int | None = None) -> bytes:
    return encode(ERROR, code=code, message=message, seq=seq)


def drop_line(gpu: int, reason: str, evict: bool, grace: float,
              seq: int | None = None) -> bytes:
    """A drop request; with ``seq``, the reply to a release with ``evict_first``."""
    return encode(DROP, seq=seq, gpu=gpu, reason=reason, evict=evict, grace=grace)


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a number this protocol carries")


def _bounded_int(text: str) -> int:
    value = int(text)
    if not -MAX_INTEGER <= value <= MAX_INTEGER:
        raise ValueError(f"integer {text[:24]}... is out of range")
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (math.inf, -math.inf):  # 1e999 parses to inf: as unwelcome as Infinity
        raise ValueError(f"{text[:24]} is out of a float's range")
    return value


# NaN, Infinity and numbers past a float's or an int64's range are refused where the line is
# read, so no value that breaks arithmetic (or the encoder, later) gets into the daemon at all.
_DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_int=_bounded_int,
                            parse_float=_finite_float)


# The requests of a handoff (acquire, release, ping) as every client we ship writes them:
# {"op":"<op>","seq":<digits>}. A line of exactly this form, with an op the daemon serves and at
# most 18 digits (always within MAX_INTEGER, no leading zero), means what the JSON decoder would
# make of it, and is read without it; any other line, however it differs (spaces, key order,
# more fields, an unknown op), takes the full path and decodes to the same message or error.
# Read byte by byte from the end, not with a regular expression or bytes methods: compiled, a
# byte comparison is a C comparison, where matching a pattern and taking its groups apart (or
# find, isdigit and int) went through Python calls, a tenth of a handoff's instructions.
_PLAIN_PREFIXES: Final[dict[bytes, str]] = {
    b'{"op":"%s","seq":' % op.encode(): op for op in REQUESTS}
_MAX_PLAIN_DIGITS: Final = 18
_ZERO: Final = 48   # b"0"
_NINE: Final = 57   # b"9"
_CLOSE: Final = 125  # b"}"


def _plain_request(line: bytes) -> dict[str, Any] | None:
    """The message of a line in the plain form, or None for any other line."""
    last = len(line) - 1
    if last < 1 or line[last] != _CLOSE:
        return None
    start = last  # the digits are line[start:last]
    while start > 0 and _ZERO <= line[start - 1] <= _NINE:
        start -= 1
    count = last - start
    if count == 0 or count > _MAX_PLAIN_DIGITS or (count > 1 and line[start] == _ZERO):
        return None
    op = _PLAIN_PREFIXES.get(line[:start])
    if op is None:
        return None
    seq = 0
    for i in range(start, last):
        seq = seq * 10 + line[i] - _ZERO
    return {"op": op, "seq": seq}


def decode(line: bytes) -> dict[str, Any]:
    """Parse one line (without its newline) into a message, or raise ProtocolError."""
    plain = _plain_request(line)
    if plain is not None:
        return plain
    try:
        message = _DECODER.decode(line.decode())
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise ProtocolError(E_MALFORMED, f"not a JSON line: {exc}") from None
    if not isinstance(message, dict):
        raise ProtocolError(E_MALFORMED, "a message must be a JSON object")
    op = message.get("op")
    if not isinstance(op, str):
        raise ProtocolError(E_MALFORMED, 'a message needs a string "op"')
    seq = message.get("seq")
    if seq is not None and (not isinstance(seq, int) or isinstance(seq, bool) or seq < 0):
        raise ProtocolError(E_MALFORMED, '"seq" must be a non-negative integer')
    return message


def check_request(message: dict[str, Any]) -> None:
    """Validate a request's fields for its op; raise ProtocolError naming the bad field."""
    op = message["op"]
    if op not in REQUESTS:
        raise ProtocolError(E_UNKNOWN_OP, f"unknown op {op!r}")
    for name, kinds, required in _FIELDS.get(op, ()):
        if name not in message:
            if required:
                raise ProtocolError(E_MALFORMED, f"{op}: missing field {name!r}")
            continue
        value = message[name]
        if value is None and not required:
            continue
        # bool is an int to Python, but not to JSON: true is no count of bytes.
        if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
            want = "/".join(k.__name__ for k in kinds)
            raise ProtocolError(E_MALFORMED, f"{op}: field {name!r} must be {want}")


_NUMBER = (int, float)
# (field, accepted types, required) per request. Range checks (a known mode, a positive TQ) are
# the daemon's business and answered with E_INVALID, which does not close the connection.
_FIELDS: dict[str, tuple[tuple[str, tuple[type, ...], bool], ...]] = {
    HELLO: (("version", (int,), True), ("software", (str,), False), ("features", (list,), False)),
    REGISTER: (
        ("name", (str,), False),
        ("pool", (str,), False),
        ("priority", (str,), False),
        ("gpu", (int,), False),
        ("working_set", (int,), False),
        ("kind", (str,), False),
        ("labels", (dict,), False),
        ("display_name", (str,), False),  # what people see (a notebook's path); name stays the key
        ("gpu_uuid", (str,), False),      # the GPU's UUID, matched by the daemon when it knows it
        ("evict", (str,), False),         # "vmm", "managed" or "checkpoint": how it is paged
        ("pausable", (bool,), False),     # it honours "pause" and "resume" (taking turns)
    ),
    RELEASE: (("evict_first", (bool,), False), ("requeue", (bool,), False)),
    WORKING_SET: (("bytes", (int,), True), ("evictable", (int,), False)),
    SET_MODE: (("mode", (str,), True),),
    SET_TQ: (("tq", _NUMBER, True), ("gpu", (int,), False)),
}


@dataclass
class LineBuffer:
    """Splits a byte stream into lines, refusing any line longer than ``limit``.

    Feed it what the socket gave; take complete lines out. The limit counts the newline, so a
    peer may not hold the daemon's memory hostage by never sending one.
    """

    limit: int = MAX_REQUEST_BYTES
    _pending: bytearray | None = None

    def feed(self, data: bytes) -> list[bytes]:
        if self._pending is None:
            self._pending = bytearray()
        self._pending += data
        lines: list[bytes] = []
        while True:
            end = self._pending.find(b"\n")
            if end < 0:
                break
            if end + 1 > self.limit:
                raise ProtocolError(E_TOO_LARGE, f"message over {self.limit} bytes")
            lines.append(bytes(self._pending[:end]))
            del self._pending[: end + 1]
        if len(self._pending) >= self.limit:
            raise ProtocolError(E_TOO_LARGE, f"message over {self.limit} bytes")
        return lines
