"""Warnings about peers, at most one line per kind per interval: a peer cannot flood the log.

A hostile or broken peer can make the daemon refuse thousands of requests a second. Each refusal
deserves a line the first time; after that, one line per interval says how many more there were.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from typing import Any

#: Kinds of warning remembered at once; past this the oldest are forgotten (and may log again).
_MAX_KINDS = 1024


class RateLimitedLog:
    def __init__(self, log: logging.Logger, interval: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log = log
        self.interval = interval
        self.clock = clock
        #: kind -> (when its last line was written, how many were held back since)
        self._last: dict[Hashable, tuple[float, int]] = {}

    def warning(self, kind: Hashable, message: str, *args: Any) -> bool:
        """Log ``message % args`` unless ``kind`` was logged within the interval; True if logged."""
        now = self.clock()
        last = self._last.get(kind)
        if last is not None and now - last[0] < self.interval:
            self._last[kind] = (last[0], last[1] + 1)
            return False
        if last is not None and last[1]:
            message += " (and %d more like it in the last %.0f s)"
            args = (*args, last[1], now - last[0])
        if kind not in self._last and len(self._last) >= _MAX_KINDS:
            del self._last[next(iter(self._last))]
        self._last[kind] = (now, 0)
        self.log.warning(message, *args)
        return True
