"""The share meter: GPU seconds per pool over a sliding window of one GPU's time.

Asked on the hot path (choosing between pools, preemption, maximums), so a question costs
O(pools + holds straddling the window's start), not O(holds in the window): the meter keeps a
running sum of the closed holds it holds, per pool and preemptibility, and corrects it only for
the few holds that began before the window and ended inside it.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterable

from nodeside.limits import MAX_SHARE_INTERVALS

_EPS = 1e-9


class _Interval:
    __slots__ = ("begin", "end", "pool", "preemptible", "held", "trimmed")

    def __init__(self, begin: float, end: float, pool: str, preemptible: bool) -> None:
        self.begin, self.end, self.pool, self.preemptible = begin, end, pool, preemptible
        self.held = end - begin  # GPU seconds; end - begin, or less once folded
        self.trimmed = False

    def seconds_after(self, start: float) -> float:
        """Its GPU seconds after ``start``, spread evenly over its span."""
        if self.begin >= start:
            return self.held
        if self.end <= start:
            return 0.0
        return self.held * (self.end - start) / (self.end - self.begin)


class ShareMeter:
    """GPU seconds per pool over the last ``window`` seconds of one GPU's time.

    Shares are measured against the window's length, or against the time observed so far while
    the meter is younger than its window, so that the first quanta already count.

    Each interval remembers whether its holder was preemptible: in KAI a pool's guarantee covers
    its non-preemptible work ("Pool A is below its guarantee (25/30 non-preemptible)"), so the
    question "is this pool below its guarantee?" counts only non-preemptible GPU time, while
    entitlements and maximums count all of it.

    The history stays bounded on a daemon that runs for months with nobody reading the status:
    intervals that left the window are trimmed as holds close, back-to-back holds of one pool
    become one interval (exactly), and past ``max_intervals`` a closing hold is folded into its
    pool's latest interval, its seconds spread evenly over the joined span (exact while that span
    lies inside the window, which it does unless holds are tiny and the window short).
    """

    def __init__(self, window: float, started: float,
                 max_intervals: int = MAX_SHARE_INTERVALS) -> None:
        self.window = window
        self.started = started
        self.max_intervals = max_intervals
        self._closed: deque[_Interval] = deque()  # in the order the holds closed
        self._open: dict[object, tuple[float, str, bool]] = {}
        #: Sum of ``held`` over ``_closed``, by (pool, preemptible), and how many intervals
        #: each sum has: a key whose last interval left the window goes, so pools that came
        #: and went leave nothing behind.
        self._total: dict[tuple[str, bool], float] = {}
        self._intervals: dict[tuple[str, bool], int] = {}
        #: Closed intervals that began at or after the window's start as last seen (a heap by
        #: begin), and those that began before it: the only ones the window may cut.
        self._later: list[tuple[float, int, _Interval]] = []
        self._straddling: list[_Interval] = []
        self._seq = itertools.count()
        self._last_close = started

    def __len__(self) -> int:
        """Intervals kept: what long uptime must not grow."""
        return len(self._closed) + len(self._open)

    def open(self, key: object, pool: str, now: float, preemptible: bool = False) -> None:
        self._open[key] = (now, pool, preemptible)

    def close(self, key: object, now: float) -> None:
        opened = self._open.pop(key, None)
        if opened is None or now <= opened[0]:
            return
        begin, pool, preemptible = opened
        self._last_close = max(self._last_close, now)
        self._trim(self._start(now))
        last = self._closed[-1] if self._closed else None
        # Field by field, not as tuples: compiled, a tuple comparison is a generic call.
        if last is not None and last.pool == pool and last.preemptible == preemptible \
                and last.end == begin:
            self._grow(last, now, now - begin)  # back to back: one interval, exactly
            return
        if len(self._closed) >= self.max_intervals:
            same = next((i for i in reversed(self._closed)
                         if (i.pool, i.preemptible) == (pool, preemptible)), None)
            if same is not None:
                self._grow(same, max(same.end, now), now - begin)
                return
        interval = _Interval(begin, now, pool, preemptible)
        self._closed.append(interval)
        key = pool, preemptible
        self._total[key] = self._total.get(key, 0.0) + interval.held
        self._intervals[key] = self._intervals.get(key, 0) + 1
        heapq.heappush(self._later, (begin, next(self._seq), interval))

    def _grow(self, interval: _Interval, end: float, seconds: float) -> None:
        interval.end = end
        interval.held += seconds
        key = interval.pool, interval.preemptible
        self._total[key] = self._total.get(key, 0.0) + seconds

    def _start(self, now: float) -> float:
        return max(now - self.window, self.started)

    def _trim(self, start: float) -> None:
        # A window that grows (a longer TQ) moves the start back: the intervals already taken
        # as straddling stay so, which costs nothing, since ``seconds_after`` counts an
        # interval that begins inside the window whole.
        while self._later and self._later[0][0] < start:
            self._straddling.append(heapq.heappop(self._later)[2])
        gone = False
        while self._closed and self._closed[0].end <= start:
            interval = self._closed.popleft()
            interval.trimmed = True
            key = interval.pool, interval.preemptible
            if self._intervals[key] == 1:
                del self._intervals[key], self._total[key]  # no rounding carried on
            else:
                self._intervals[key] -= 1
                self._total[key] -= interval.held
            gone = True
        if gone:
            self._straddling = [i for i in self._straddling if not i.trimmed]

    def shares(self, now: float, pools: Iterable[str] = (), *,
               non_preemptible: bool = False) -> dict[str, float]:
        """Each pool's fraction of the window; only non-preemptible holds if so asked."""
        start = self._start(now)
        self._trim(start)
        seconds: dict[str, float] = dict.fromkeys(pools, 0.0)
        if now < self._last_close:
            # Asked about the past (never by the core, whose clock only moves on): count it
            # out interval by interval.
            spans = [(i.begin, i.end, i.pool, i.preemptible, i.held) for i in self._closed]
            for begin, end, pool, low, held in spans:
                overlap = min(end, now) - max(begin, start)
                if not (non_preemptible and low) and overlap > 0:
                    seconds[pool] = seconds.get(pool, 0.0) + held * overlap / (end - begin)
                else:
                    seconds.setdefault(pool, 0.0)
        else:
            for (pool, low), total in self._total.items():
                if not (non_preemptible and low):
                    seconds[pool] = seconds.get(pool, 0.0) + total
                else:
                    seconds.setdefault(pool, 0.0)
            for interval in self._straddling:
                if not (non_preemptible and interval.preemptible):
                    seconds[interval.pool] -= interval.held - interval.seconds_after(start)
        for begin, pool, low in self._open.values():
            if non_preemptible and low:
                seconds.setdefault(pool, 0.0)
                continue
            overlap = now - max(begin, start)
            seconds[pool] = seconds.get(pool, 0.0) + max(overlap, 0.0)
        span = now - start
        if span <= _EPS:
            return {pool: 0.0 for pool in seconds}
        return {pool: max(s, 0.0) / span for pool, s in seconds.items()}
