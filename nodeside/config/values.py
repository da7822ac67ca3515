"""The value parsers every section shares (sizes, seconds, enumerations) and ConfigError.

Command-line flags and kiwictl use them through ``argument_type``, so a value is checked the
same way wherever it was written.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from nodeside import limits
from nodeside.model import POLICY_NAMES
from nodeside.protocol import MODES

T = TypeVar("T")


class ConfigError(ValueError):
    """The configuration is wrong; the message says where and how."""


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
          "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
          "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}


def argument_type(parse: Callable[[Any], T]) -> Callable[[str], T]:
    """Adapt a parser of this module to argparse, so flags and files are checked alike."""
    def convert(text: str) -> T:
        try:
            return parse(text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return convert


def parse_size(text: str | int) -> int:
    """``8GiB``, ``512MiB``, ``80GB`` or a plain byte count, as bytes."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ConfigError(f"size must not be negative: {text}")
        nbytes = text
    else:
        match = _SIZE.match(str(text))
        unit = (match.group(2) or "").upper() if match else None
        if not match or unit not in _UNITS:
            raise ConfigError(f"not a size: {limits.shown(text)} (try 8GiB, 512MiB or a byte "
                          "count)")
        try:  # a thousand-digit number reads as an infinite float
            nbytes = int(float(match.group(1)) * _UNITS[unit])
        except OverflowError:
            nbytes = limits.MAX_BYTES + 1
    try:
        return limits.byte_count(nbytes, "size")
    except limits.LimitError as exc:
        raise ConfigError(str(exc)) from None


def parse_tq(value: Any, where: str = "tq") -> float:
    """Seconds within the TQ's one range (``limits.tq_seconds``), or ConfigError saying why."""
    try:
        return limits.tq_seconds(value, where)
    except limits.LimitError as exc:
        raise ConfigError(str(exc)) from None


def parse_seconds_or_never(value: Any, where: str) -> float:
    """0 (never) or seconds within the TQ's range, or ConfigError saying why."""
    if not isinstance(value, bool) and value in (0, "0"):
        return 0.0
    return parse_tq(value, where)


def one_of(value: Any, spellings: Iterable[str], where: str) -> str:
    """One of an enumeration's words, matched whatever its case and given back as spelled here:
    a config written by hand says ``Interactive`` or ``ROUND-ROBIN`` and means the same word.
    Every enumeration of the config is read so (priorities, in upper case, likewise)."""
    spellings = tuple(spellings)
    if isinstance(value, str):
        for spelling in spellings:
            if value.casefold() == spelling.casefold():
                return spelling
    raise ConfigError(f"{where}: must be one of {', '.join(spellings)} (any case), "
                      f"got {limits.shown(value)}")


def parse_mode(value: Any, where: str = "mode") -> str:
    # YAML 1.1 reads a bare `on`/`off` as a boolean: take it back to the word the user wrote.
    if value is True:
        value = "on"
    elif value is False:
        value = "off"
    return one_of(value, MODES, where)


def parse_policy(value: Any, where: str = "policy") -> str:
    return one_of(value, sorted(POLICY_NAMES), where)


#: Unknown keys an error names at most: enough for a typo or two, never a file's worth.
SHOWN_KEYS = 3
#: What a config key looks like. A key that does not (``root:$6$...:19000:0:99999:7::``, which is
#: how YAML reads a line of /etc/shadow) is file content, not a word someone mistyped.
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


def section(raw: Any, where: str, keys: Iterable[str]) -> Mapping[str, Any]:
    """``raw`` as a mapping whose keys are all among ``keys``, else a ConfigError naming
    ``where`` (a section's path; empty for the file's top level) and the keys it takes.

    The unknown keys it names are the file's own text, so only those that look like config
    words, a few at most, each cut short; a top level with no config key and keys that are no
    words (the config path pointing at some other file) names none."""
    known = sorted(keys)
    prefix = f"{where}: " if where else "the config's top level: "
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{prefix}expected a mapping with {', '.join(known)}")
    unknown = [key for key in raw if key not in known]
    if not unknown:
        return raw
    words = [key for key in unknown if isinstance(key, str) and _WORD.fullmatch(key)]
    if not where and len(unknown) == len(raw) and len(words) < len(unknown):
        raise ConfigError(f"not a Kiwi config: none of its {len(raw)} top-level key(s) is a "
                          f"config key ({', '.join(known)})")
    named = [key if len(key) <= limits.SHOWN_CHARS else key[:limits.SHOWN_CHARS - 1] + "…"
             for key in words[:SHOWN_KEYS]]
    if len(unknown) > len(named):
        named.append(f"{len(unknown) - len(named)} more")
    raise ConfigError(f"{prefix}unknown key(s) {', '.join(named)}; known keys are "
                      f"{', '.join(known)}")
