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

from typing import Any, Final

from nodeside.scheduler.clients import ClientRecord

#: Holds kept per GPU, newest last; the panel draws at most this many.
MAX_SPANS: Final = 50
#: Seconds after its end that a hold is still reported (the panel's longest window by default
#: is five minutes; this leaves room for a longer one).
KEEP_SECONDS: Final = 900.0


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
        self.max_spans = max_spans
        #: Newest last; the last ``max_spans`` count. A list cut down now and then rather than a
        #: deque with a maximum length: compiled, a list's append is a C call, a deque's a
        #: generic one (on every handoff).
        self._spans: list[HeldSpan] = []
        self._open: dict[str, HeldSpan] = {}

    # The client itself, not a protocol of what it has: compiled, a protocol's attributes are
    # looked up by name, a native class's read in place (a grant on every handoff).
    def opened(self, client: ClientRecord, now: float) -> None:
        """``client`` was granted the GPU at ``now``."""
        span = HeldSpan(client.id, client.name, client.display_name, client.user, now)
        spans = self._spans
        spans.append(span)
        if len(spans) >= 2 * self.max_spans:
            del spans[:len(spans) - self.max_spans]
        self._open[client.id] = span

    def closed(self, client_id: str, now: float) -> None:
        span = self._open.get(client_id)
        if span is not None:
            del self._open[client_id]
            span.end = now

    def recent(self, now: float) -> list[dict[str, Any]]:
        """The spans for the status document, oldest first; times are seconds before ``now``
        (clients compare them with their own clock, never with the daemon's)."""
        spans = []
        for s in self._spans[max(0, len(self._spans) - self.max_spans):]:
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
