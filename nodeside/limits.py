"""Every bound the daemon puts on what a peer may send or hold: the one place they are set.

A peer with access to the socket may be buggy or hostile. Each value a peer, a file or a user can
set is checked against a bound here, so that the protocol, the config file, the state file, the
REST endpoint, ``%kiwi tq`` and ``kiwictl -T`` all refuse the same values with the same words.
"""

from __future__ import annotations

import math
from typing import Any, Final

#: The TQ's one documented range, in seconds: from 10 ms (tests, latency experiments) to a day.
TQ_MIN: Final = 0.01
TQ_MAX: Final = 86_400.0

#: A client's name, display name, pool name and each label key or value, in UTF-8 bytes.
MAX_NAME_BYTES: Final = 256
#: Labels on one client.
MAX_LABELS: Final = 64
#: Bytes a client may claim as its working set: 1 PiB, far past any GPU, well inside a float.
MAX_BYTES: Final = 2**50
#: Times a waiter may be passed over under ``policy: interactive`` (config ``pass_bound``):
#: past a few hundred the bound no longer bounds anything a person would wait for.
MAX_PASS_BOUND: Final = 1000


#: Closed hold intervals one GPU's share meter keeps (see scheduler.pools.ShareMeter): past
#: this, a closing hold is folded into its pool's latest interval, so memory stays flat.
MAX_SHARE_INTERVALS: Final = 1024


class LimitError(ValueError):
    """A value outside its bound. The message names the value and the bound."""


def tq_seconds(value: Any, where: str = "tq") -> float:
    """A TQ (or any duration in the TQ's range) as float seconds, or LimitError saying why."""
    return seconds_in_range(value, where, TQ_MIN, TQ_MAX)


def seconds_in_range(value: Any, where: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise LimitError(f"{where}: expected a number of seconds, got {value!r}")
    try:
        seconds = float(value)
    except (ValueError, OverflowError):
        raise LimitError(f"{where}: expected a number of seconds, got {value!r}") from None
    if not math.isfinite(seconds) or not low <= seconds <= high:
        raise LimitError(f"{where}: must be between {low:g} and {high:g} seconds, "
                         f"got {value!r}")
    return seconds


def byte_count(value: Any, where: str = "bytes") -> int:
    """A non-negative integer count of bytes up to MAX_BYTES, or LimitError saying why."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise LimitError(f"{where}: expected an integer count of bytes, got {value!r}")
    if not 0 <= value <= MAX_BYTES:
        raise LimitError(f"{where}: must be between 0 and {MAX_BYTES} bytes, got {value}")
    return value


def pass_bound(value: Any, where: str = "pass_bound") -> int:
    """A whole number of passes, 0 (never passed over: round robin) to MAX_PASS_BOUND."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise LimitError(f"{where}: expected a whole number, got {value!r}")
    if not 0 <= value <= MAX_PASS_BOUND:
        raise LimitError(f"{where}: must be between 0 and {MAX_PASS_BOUND}, got {value}")
    return value


def short_text(value: Any, where: str) -> str:
    """A name-like string of at most MAX_NAME_BYTES UTF-8 bytes, or LimitError saying why."""
    if not isinstance(value, str):
        raise LimitError(f"{where}: expected a string, got {type(value).__name__}")
    if len(value.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise LimitError(f"{where}: longer than {MAX_NAME_BYTES} bytes")
    return value


def labels(value: Any, where: str = "labels") -> dict[str, str]:
    """At most MAX_LABELS string labels, each key and value a short text."""
    if not isinstance(value, dict):
        raise LimitError(f"{where}: expected an object of strings")
    if len(value) > MAX_LABELS:
        raise LimitError(f"{where}: more than {MAX_LABELS} labels")
    return {short_text(k, f"{where} key"): short_text(v, f"{where}.{k}")
            for k, v in value.items()}
