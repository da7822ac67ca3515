"""Who held a GPU lately, hold by hold: the spans people see on a timeline.

The share meter (meter.py) books pools' GPU seconds for the rules and folds them as it goes; it
cannot say which client held when. This keeps each hold whole, with the names people know the
client by, so every view (the panel in any browser tab, after any reload) draws the same last
minutes from the status document instead of from what it happened to see. Nothing here steers
scheduling.

Bounded for a daemon that runs for months: the last ``MAX_SPANS`` holds of the GPU, and of those
only the ones still open or ended within ``KEEP_SECONDS`` are reported.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Final, Protocol

#: Holds kept per GPU, newest last; the panel draws at most this many.
MAX_SPANS: Final = 50
#: Seconds after its end that a hold is still reported (the panel's longest window by default
#: is five minutes; this leaves room for a longer one).
KEEP_SECONDS: Final = 900.0


class Holder(Protocol):
    """What a hold records of its client (the scheduler's ``Client`` has it)."""

    id: str
    name: str
    display_name: str
    user: str | None


class HeldSpan:
    __slots__ = ("client", "name", "display_name", "user", "start", "end")

    def __init__(self, client: str, name: str, display_name: str, user: str | None,
                 start: float) -> None:
        self.client, self.name, self.display_name, self.user = client, name, display_name, user
        self.start = start
        self.end: float | None = None


class HolderHistory:
    """The recent holds of one GPU, opened at each grant and closed at each hold's end."""

    def __init__(self, max_spans: int = MAX_SPANS, keep: float = KEEP_SECONDS) -> None:
        self.keep = keep
        self._spans: deque[HeldSpan] = deque(maxlen=max_spans)
        self._open: dict[str, HeldSpan] = {}

    def opened(self, client: Holder, now: float) -> None:
        """``client`` was granted the GPU at ``now``."""
        span = HeldSpan(client.id, client.name, client.display_name, client.user, now)
        self._spans.append(span)
        self._open[client.id] = span

    def closed(self, client_id: str, now: float) -> None:
        span = self._open.pop(client_id, None)
        if span is not None:
            span.end = now

    def recent(self, now: float) -> list[dict[str, Any]]:
        """The spans for the status document, oldest first; times are seconds before ``now``
        (clients compare them with their own clock, never with the daemon's)."""
        spans = []
        for s in self._spans:
            if s.end is not None and now - s.end > self.keep:
                continue
            started = round(now - s.start, 3)
            ended = None if s.end is None else round(now - s.end, 3)
            # started/ended: the same figures under their first names (docs/interfaces.md
            # section 10 keeps them), which read as times that end before they begin.
            spans.append({"client": s.client, "name": s.name, "display_name": s.display_name,
                          "user": s.user, "started_ago": started, "ended_ago": ended,
                          "started": started, "ended": ended})
        return spans
