"""Every bound the daemon puts on what a peer may send or hold: the one place they are set.

A peer with access to the socket may be buggy or hostile. Each value a peer, a file or a user can
set is checked against a bound here, so that the protocol, the config file, the state file, the
REST endpoint, ``%kiwi tq`` and ``kiwictl -T`` all refuse the same values with the same words.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

#: The TQ's one documented range, in seconds: from 10 ms (tests, latency experiments) to a day.
TQ_MIN: Final = 0.01
TQ_MAX: Final = 86_400.0

#: A client's name, display name, pool name and each label key or value, in UTF-8 bytes.
MAX_NAME_BYTES: Final = 256
#: Labels on one client.
MAX_LABELS: Final = 64
#: Largest integer on the wire either way (a C peer's int64): JSON itself has no bound, and an
#: integer past a float's range would turn into inf the moment it met one.
MAX_INTEGER: Final = 2**63 - 1
#: Bytes a client may claim as its working set: 1 PiB, far past any GPU, well inside a float.
MAX_BYTES: Final = 2**50
#: Times a waiter may be passed over under ``policy: interactive`` (config ``pass_bound``):
#: past a few hundred the bound no longer bounds anything a person would wait for.
MAX_PASS_BOUND: Final = 1000


#: Booked intervals one GPU's share meter keeps (see scheduler.meter.ShareMeter): past this,
#: a new interval is folded into its pool's latest one, so memory stays flat.
MAX_SHARE_INTERVALS: Final = 1024

#: Bytes of the API server's answer to "this node's pods" read at most (nodeside/daemon/kube.py):
#: a pod object is a few KiB and a node runs at most a few hundred pods.
MAX_POD_LIST_BYTES: Final = 64 * 2**20


class LimitError(ValueError):
    """A value outside its bound. The message names the value and the bound."""


#: Characters of a refused value an error message shows at most: enough to recognise a typo,
#: too few to carry a line of a file the value came from (a config symlinked to a secret).
SHOWN_CHARS: Final = 32


def shown(value: Any, width: int = SHOWN_CHARS) -> str:
    """``repr(value)`` for an error message, cut short: what a file or a peer sent is never
    echoed whole."""
    text = repr(value)
    return text if len(text) <= width else text[:width - 1] + "…"


def shown_name(value: Any) -> str:
    """A key a file gave (a pool's name, a GPU index) for an error message: as it is when it is
    short printable text, else ``shown``."""
    if isinstance(value, str) and len(value) <= SHOWN_CHARS and value.isprintable():
        return value
    return shown(value)


def tq_seconds(value: Any, where: str = "tq") -> float:
    """A TQ (or any duration in the TQ's range) as float seconds, or LimitError saying why."""
    return seconds_in_range(value, where, TQ_MIN, TQ_MAX)


def seconds_in_range(value: Any, where: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise LimitError(f"{where}: expected a number of seconds, got {shown(value)}")
    try:
        seconds = float(value)
    except (ValueError, OverflowError):
        raise LimitError(f"{where}: expected a number of seconds, got {shown(value)}") from None
    if not math.isfinite(seconds) or not low <= seconds <= high:
        raise LimitError(f"{where}: must be between {low:g} and {high:g} seconds, "
                         f"got {shown(value)}")
    return seconds


def share(value: Any, where: str) -> float:
    """A fraction of a whole, above 0 and at most 1, or LimitError saying why."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or not 0 < value <= 1:
        raise LimitError(f"{where}: expected a fraction above 0 and at most 1, got {shown(value)}")
    return float(value)


def byte_count(value: Any, where: str = "bytes") -> int:
    """A non-negative integer count of bytes up to MAX_BYTES, or LimitError saying why."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise LimitError(f"{where}: expected an integer count of bytes, got {shown(value)}")
    if not 0 <= value <= MAX_BYTES:
        raise LimitError(f"{where}: must be between 0 and {MAX_BYTES} bytes, got {value}")
    return value


def pass_bound(value: Any, where: str = "pass_bound") -> int:
    """A whole number of passes, 0 (never passed over: round robin) to MAX_PASS_BOUND."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise LimitError(f"{where}: expected a whole number, got {shown(value)}")
    if not 0 <= value <= MAX_PASS_BOUND:
        raise LimitError(f"{where}: must be between 0 and {MAX_PASS_BOUND}, got {value}")
    return value


def short_text(value: Any, where: str) -> str:
    """A name-like string of at most MAX_NAME_BYTES UTF-8 bytes, or LimitError saying why."""
    if not isinstance(value, str):
        raise LimitError(f"{where}: expected a string, got {type(value).__name__}")
    if len(value.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise LimitError(f"{where}: longer than {MAX_NAME_BYTES} bytes")
    if not value.isprintable() and any(c < " " or "\x7f" <= c <= "\x9f" for c in value):
        # A control character shows as nothing useful and takes six bytes in every status
        # document that carries it; the size bounds count on names staying printable.
        raise LimitError(f"{where}: control characters are not allowed")
    return value


def lone_surrogate(message: Any) -> str | None:
    """Where a decoded message holds a string that is no sequence of Unicode scalar values (a
    lone UTF-16 surrogate, which JSON's ``\\ud800`` escape can make), or None when it holds none.

    Such a string cannot be encoded as UTF-8 again: stored as a name or a pool, it would break
    every status document and metrics scrape that carries it, so the protocol refuses the line
    where it is read (``nodeside.protocol.decode``). Walked without recursion: a line nests at
    most as deep as the JSON decoder let it, but the walk must not be the thing that breaks."""
    stack: list[tuple[str, Any]] = [("", message)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            if not value.isascii() and _has_surrogate(value):
                return where or "the message"
        elif isinstance(value, dict):
            for key, item in value.items():
                name = f"{where}.{key}" if where else str(key)
                if isinstance(key, str) and not key.isascii() and _has_surrogate(key):
                    return f"a key of {where or 'the message'}"
                stack.append((name, item))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", item) for i, item in enumerate(value))
    return None


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def labels(value: Any, where: str = "labels") -> dict[str, str]:
    """At most MAX_LABELS string labels, each key and value a short text."""
    if not isinstance(value, dict):
        raise LimitError(f"{where}: expected an object of strings")
    if len(value) > MAX_LABELS:
        raise LimitError(f"{where}: more than {MAX_LABELS} labels")
    return {short_text(k, f"{where} key"): short_text(v, f"{where}.{k}")
            for k, v in value.items()}


# -- what one connection may cost the daemon --------------------------------------------------

#: Requests answered for one connection before the others get their turn: a peer that pipelines
#: thousands of requests in one write is served a few at a time, between everyone else's.
REQUESTS_PER_TURN: Final = 32
#: Reply bytes the daemon may owe one connection (written but not yet read by the peer). Past
#: this, that connection's requests wait until the peer reads: a peer that never reads costs
#: the daemon this much memory, not one status document per request it sent.
MAX_OWED_BYTES: Final = 1024 * 1024
#: Bytes the daemon may owe all the peers that stopped reading together (past their own
#: MAX_OWED_BYTES, or behind on their events): past this, the one behind longest is cut off.
#: Thousands of peers that never read then cost the daemon this much, not a MiB each.
MAX_OWED_BYTES_TOTAL: Final = 32 * 1024 * 1024
#: Bytes of labels (keys and values) of all registered clients together: pod labels take a few
#: hundred bytes a client; this leaves room for thousands while keeping the status bounded.
MAX_LABEL_BYTES_TOTAL: Final = 2 * 1024 * 1024
#: Registered clients on the node. With the name and label bounds above (and names printable,
#: so JSON escapes at most triple them) the status document stays under MAX_REPLY_BYTES.
MAX_CLIENTS: Final = 2048


@dataclass(frozen=True)
class ConnectionLimits:
    """How long a connection may stay without saying who it is, and how many one user may hold.

    Set in the config file's ``connections:`` section; the defaults suit a busy node.
    """

    #: Seconds a new connection has to say hello before it is closed.
    hello_timeout: float = 5.0
    #: Seconds a connection that never registered may stay silent before it is closed (a status
    #: watcher polls far more often; a forgotten or hostile socket does not).
    idle_timeout: float = 300.0
    #: Seconds a peer may leave what the daemon owes it unread (past MAX_OWED_BYTES of replies,
    #: or behind on its events) before it is cut off, registered or not. Every client we ship
    #: reads its socket all the time; a peer that stops for this long is stuck or hostile.
    stall_timeout: float = 30.0
    #: Connections one uid may hold at once. At the cap, the uid's oldest connection that never
    #: registered makes room; when all of them are registered the newcomer is refused (E_LIMIT).
    per_uid: int = 4096
    #: The listen backlog: kernels of a busy node connecting at the same moment.
    backlog: int = 4096
    #: The fraction of the node's budgets (MAX_CLIENTS registered clients, MAX_LABEL_BYTES_TOTAL
    #: bytes of labels) one uid may hold, admins (root, the daemon's user, the admin group)
    #: excepted: one user can exhaust only their own share, never everyone's.
    uid_share: float = 0.25
