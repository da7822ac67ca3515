"""What a replay records: each hold and each wait as a span of simulated time, and what is
measured from them (GPU seconds and shares by pool, the hold or wait in progress).

``Replay`` (replay.py) opens a span at each request and each grant and closes it when the wait
or the hold ends; the tests and the fleet benchmark read them here.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Span:
    """One hold of one GPU, for timelines and share accounting."""

    client: str
    name: str
    pool: str
    gpu: int
    start: float
    end: float | None = None
    #: Seconds at the start of the hold spent moving memory (no work done).
    switching: float = 0.0
    #: Stretches of the hold paused while another holder had its turn (start, end), and
    #: since when it is paused now (None: it is not).
    paused: list[tuple[float, float]] = field(default_factory=list)
    paused_since: float | None = None

    def working(self, until: float) -> tuple[float, float]:
        """The part of the hold, up to ``until``, in which the holder worked."""
        stop = min(self.end if self.end is not None else until, until)
        return min(self.start + self.switching, stop), stop


class SpanLog:
    """The spans of one replay; ``Replay`` opens them and sets the time."""

    now: float
    spans: list[Span]  # holds
    wait_spans: list[Span]  # from a request to its grant
    _open_spans: dict[str, Span]
    _open_waits: dict[str, Span]

    def _close_span(self, client: str, spans: dict[str, Span] | None = None) -> None:
        span = (self._open_spans if spans is None else spans).pop(client, None)
        if span is not None:
            span.end = self.now

    # -- measuring ------------------------------------------------------------------------

    def open_span(self, client: str) -> Span | None:
        """The hold ``client`` is in now, if any (its ``switching`` says how long memory moves)."""
        return self._open_spans.get(client)

    def open_waits(self) -> dict[str, Span]:
        """The waits in progress, by client: from each request to now."""
        return dict(self._open_waits)

    def gpu_seconds_by_pool(self, start: float, end: float, gpu: int = 0) -> dict[str, float]:
        """GPU seconds each pool held ``gpu`` for between ``start`` and ``end``."""
        seconds: dict[str, float] = {}
        for span in self.spans:
            if span.gpu != gpu:
                continue
            overlap = min(span.end if span.end is not None else self.now, end) - max(
                span.start, start)
            if overlap > 0:
                seconds[span.pool] = seconds.get(span.pool, 0.0) + overlap
        return seconds

    def shares_between(self, start: float, end: float, gpu: int = 0) -> dict[str, float]:
        """Each pool's fraction of the GPU time used between ``start`` and ``end``."""
        seconds = self.gpu_seconds_by_pool(start, end, gpu)
        total = sum(seconds.values())
        return {pool: s / total for pool, s in seconds.items()} if total else {}
