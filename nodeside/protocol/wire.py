"""The wire: bytes into messages and messages into bytes, and whether a request is well formed.

Every message is one JSON object on one line of UTF-8, ended by ``\\n``, over a Unix stream
socket. Which fields a request may carry, and their types, is the table's (``messages``). This
module is sans-I/O, and compiled (mypyc): the daemon reads and writes every line through it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Final, NoReturn

from nodeside.limits import MAX_INTEGER, lone_surrogate
from nodeside.protocol.names import (
    ACQUIRE,
    DROP,
    E_MALFORMED,
    E_TOO_LARGE,
    E_UNKNOWN_OP,
    ERROR,
    FATAL_ERRORS,
    GRANT,
    MAX_REQUEST_BYTES,
    RELEASE,
    RELEASED,
    REQUEST_FIELDS,
    REQUESTS,
    WAITING,
)

# Each field's type (messages.TYPES) as the Python types a value of it may have. The table
# itself (messages.py) is not imported: what the wire needs of it is generated into names.py.
_PYTHON_TYPES: Final[dict[str, tuple[type, ...]]] = {
    "int": (int,), "number": (int, float), "str": (str,), "bool": (bool,), "list": (list,),
    "object": (dict,)}


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
    if type(position) is int:
        # One formatting of one template: compiled, each % parses its template anew.
        if type(seq) is int:
            return b'{"op":"waiting","seq":%d,"position":%d}\n' % (seq, position)
        if seq is None:
            return b'{"op":"waiting","position":%d}\n' % position
    return encode(WAITING, seq=seq, position=position)


def released_line(evict: bool, seq: int | None = None) -> bytes:
    """``encode(RELEASED, seq=seq, evict=evict)``."""
    if type(evict) is bool:
        if type(seq) is int:
            return (b'{"op":"released","seq":%d,"evict":true}\n' if evict
                    else b'{"op":"released","seq":%d,"evict":false}\n') % seq
        if seq is None:
            return b'{"op":"released","evict":true}\n' if evict \
                else b'{"op":"released","evict":false}\n'
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
# The two of every handoff, told apart by a comparison of their bytes rather than looked up.
_ACQUIRE_PREFIX: Final = b'{"op":"acquire","seq":'
_RELEASE_PREFIX: Final = b'{"op":"release","seq":'
_MAX_PLAIN_DIGITS: Final = 18
_ZERO: Final = 48   # b"0"
_NINE: Final = 57   # b"9"
_CLOSE: Final = 125  # b"}"


def plain_request(line: bytes) -> tuple[str, int]:
    """The op and seq of a line in the plain form; ("", -1) for any other line."""
    last = len(line) - 1
    if last < 1 or line[last] != _CLOSE:
        return "", -1
    start = last  # the digits are line[start:last]
    while start > 0 and _ZERO <= line[start - 1] <= _NINE:
        start -= 1
    count = last - start
    if count == 0 or count > _MAX_PLAIN_DIGITS or (count > 1 and line[start] == _ZERO):
        return "", -1
    if start == len(_ACQUIRE_PREFIX) and line.startswith(_ACQUIRE_PREFIX):
        op = ACQUIRE
    elif start == len(_RELEASE_PREFIX) and line.startswith(_RELEASE_PREFIX):
        op = RELEASE
    else:
        found = _PLAIN_PREFIXES.get(line[:start])
        if found is None:
            return "", -1
        op = found
    seq = 0
    for i in range(start, last):
        seq = seq * 10 + line[i] - _ZERO
    return op, seq


def decode(line: bytes) -> dict[str, Any]:
    """Parse one line (without its newline) into a message, or raise ProtocolError."""
    op, seq = plain_request(line)
    if seq >= 0:
        return {"op": op, "seq": seq}
    try:
        message = _DECODER.decode(line.decode())
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise ProtocolError(E_MALFORMED, f"not a JSON line: {exc}") from None
    if not isinstance(message, dict):
        raise ProtocolError(E_MALFORMED, "a message must be a JSON object")
    # Only an escape can make a surrogate (the UTF-8 decode above refuses encoded ones).
    if line.find(b"\\u") >= 0:
        where = lone_surrogate(message)
        if where is not None:
            raise ProtocolError(E_MALFORMED, f"{where}: a lone UTF-16 surrogate is no text")
    if not isinstance(message.get("op"), str):
        raise ProtocolError(E_MALFORMED, 'a message needs a string "op"')
    number = message.get("seq")
    if number is not None and (not isinstance(number, int) or isinstance(number, bool)
                               or number < 0):
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


# (field, accepted types, required) per request, from the table (names.REQUEST_FIELDS). Range
# checks (a known mode, a positive TQ) are the daemon's business and answered with E_INVALID,
# which does not close the connection.
_FIELDS: Final[dict[str, tuple[tuple[str, tuple[type, ...], bool], ...]]] = {
    op: tuple((name, _PYTHON_TYPES[kind], required) for name, kind, required in fields)
    for op, fields in REQUEST_FIELDS.items()}


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
