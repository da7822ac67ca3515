"""How every view writes a duration and a size: kiwictl, ``%kiwi``, the kernel's lines under a
cell, the daemon's log, and the panel.

The rules are here once. The panel (TypeScript) cannot import them, so this module writes
``labextension/src/formats.generated.ts`` (``nodeside.formats_panel``): the rules' constants and
examples, made by the functions below, which the panel's own two formatters
(labextension/src/format.ts) are tested against (labextension/test/format.spec.ts).

Names are the third fact; their rules are in ``nodeside.names``, whose examples go in the same
file. Arithmetic is spelt out (``_round``) rather than left to ``round`` and ``%`` formats:
Python rounds halves to even and JavaScript up, and both languages must write the same text.
"""

from __future__ import annotations

import math

#: What a view writes where a figure is not known (a daemon that cannot say, no holder).
UNKNOWN_SIZE = "unknown"
NO_DURATION = "–"
#: Binary units, each 1024 of the one before.
SIZE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
#: Below a second a duration keeps hundredths (``0.05 s``), below this many seconds tenths (a
#: countdown: ``4.3 s``), both without a trailing zero (``5 s``); from it, whole
#: seconds (``12 s``); from a minute, minutes and seconds (``2 min 5 s``); from an hour, hours
#: and minutes (``1 h 5 min``).
TENTHS_BELOW = 10


def _round(value: float, places: int = 0) -> float:
    """Half away from zero for the positive figures shown, as JavaScript's Math.round."""
    scale = 10**places
    return math.floor(value * scale + 0.5) / scale


def _number(value: float) -> str:
    """A rounded figure without a trailing ``.0``: 5.0 -> ``5``, 4.3 -> ``4.3``."""
    whole = int(value)
    return str(whole) if value == whole else repr(value)


def seconds(value: float | None) -> str:
    """A duration for people, the same in every view: ``0.05 s``, ``0.4 s``, ``4.3 s``,
    ``5 s``, ``12 s``, ``2 min 5 s``, ``1 h 5 min``; ``–`` for None. A time quantum, a
    quantum's remainder, GPU time and waits are all written so."""
    if value is None or not math.isfinite(value):
        return NO_DURATION
    value = max(0.0, float(value))
    if value < 1:
        return f"{_number(_round(value, 2))} s"  # 0.05 s, a test's quantum, is not "0.1 s"
    if value < TENTHS_BELOW:
        tenths = _round(value, 1)
        if tenths < TENTHS_BELOW:
            return f"{_number(tenths)} s"
    whole = int(_round(value))
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        minutes, rest = divmod(whole, 60)
        return f"{minutes} min" if rest == 0 else f"{minutes} min {rest} s"
    minutes = int(_round(whole / 60))
    hours, rest = divmod(minutes, 60)
    return f"{hours} h" if rest == 0 else f"{hours} h {rest} min"


def size(nbytes: float | None) -> str:
    """Bytes in binary units, one decimal: ``512 B``, ``8.0 MiB``, ``7.8 MiB``, ``24.0 GiB``;
    ``unknown`` for None (or a figure no memory has)."""
    if nbytes is None or not math.isfinite(nbytes) or nbytes < 0:
        return UNKNOWN_SIZE
    if nbytes < 1024:
        return f"{int(nbytes)} B"
    value, unit = float(nbytes), 0
    while unit < len(SIZE_UNITS) - 1 and _round(value, 1) >= 1024:
        value /= 1024
        unit += 1
    return f"{_round(value, 1):.1f} {SIZE_UNITS[unit]}"


#: Figures whose text the panel must write as this module does (its spec checks each).
SECONDS_EXAMPLES: tuple[float | None, ...] = (
    None, -3, 0, 0.004, 0.05, 0.44, 0.445, 0.999, 1, 2.5, 4.96, 5, 9.94, 9.96, 10, 12.5, 29.6,
    59.4, 59.7, 60, 61.4, 119.6, 125, 3599.4, 3600, 3661, 5400, 86399)
SIZE_EXAMPLES: tuple[float | None, ...] = (
    None, -1, 0, 1, 512, 1023, 1024, 1536, 1048575, 1048576, 8 * 2**20, 8126464, 12 * 2**20,
    3 * 2**30, 24 * 2**30, 80 * 2**30, 2**40, 5 * 2**50)
