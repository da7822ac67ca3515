"""Small helpers the benchmarks share."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile by the nearest-rank method."""
    ordered = sorted(samples)
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def report_row(*cells: object) -> None:
    print("| " + " | ".join(str(c) for c in cells) + " |")
