"""The share meter: GPU seconds per pool over a sliding window of one GPU's time.

Asked on the hot path (choosing between pools, preemption, maximums), so a question costs
O(pools + intervals straddling the window's start), not O(holds in the window): the meter keeps a
running sum of the intervals it has booked, per pool and preemptibility, and corrects it only for
the few that began before the window and ended inside it. An open or close costs
O(pools holding) (it books their seconds so far, see ``ShareMeter``).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterable

from nodeside.limits import MAX_SHARE_INTERVALS

_EPS = 1e-9


def _held(begin: float, end: float, holds: int, holders: int) -> float:
    """GPU seconds of ``holds`` of ``holders`` side by side from ``begin`` to ``end``."""
    # Whole when they are all the holders (one holder alone above all): exactly end - begin.
    return end - begin if holds == holders else (end - begin) * holds / holders


class _Interval:
    __slots__ = ("begin", "end", "pool", "preemptible", "held", "holds", "holders", "trimmed")

    def __init__(self, begin: float, end: float, pool: str, preemptible: bool,
                 holds: int = 1, holders: int = 1) -> None:
        self.begin, self.end, self.pool, self.preemptible = begin, end, pool, preemptible
        #: ``holds`` of this pool's holds among ``holders`` side by side, throughout: the GPU
        #: seconds are evenly spread over the span (one over ``holders`` for each hold), or
        #: nearly so once folded.
        self.holds, self.holders = holds, holders
        self.held = _held(begin, end, holds, holders)
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

    Holds side by side split the GPU's time: it time-slices between their processes, so while
    k holds are open each accrues 1/k GPU seconds a second, and a pool's share is its part of
    the GPU's time, not of its holders' wall time (two holders of one pool side by side for the
    whole window: 0.5 each, 1.0 together; the pools' shares never sum to more than 1). Every
    open and close books the open holds' seconds since the one before, so each interval is held
    at one rate throughout and spreading it evenly over its span is exact. With one holder at a
    time every hold is one interval of its whole wall time, as it always was.

    Each interval remembers whether its holder was preemptible: in KAI a pool's guarantee covers
    its non-preemptible work ("Pool A is below its guarantee (25/30 non-preemptible)"), so the
    question "is this pool below its guarantee?" counts only non-preemptible GPU time, while
    entitlements and maximums count all of it.

    The history stays bounded on a daemon that runs for months with nobody reading the status:
    intervals that left the window are trimmed as holds close, back-to-back intervals of one
    pool at one rate become one interval (exactly), and past ``max_intervals`` a new interval is
    folded into its pool's latest one, its seconds spread evenly over the joined span (exact
    while that span lies inside the window and at one rate, which it is unless holds are tiny
    and the window short).
    """

    def __init__(self, window: float, started: float,
                 max_intervals: int = MAX_SHARE_INTERVALS) -> None:
        self.window = window
        self.started = started
        self.max_intervals = max_intervals
        self._closed: deque[_Interval] = deque()  # in the order they were booked
        self._open: dict[object, tuple[str, bool]] = {}  # pool, preemptible
        #: The open holds by (pool, preemptible), and when they last changed: since then
        #: each has been accruing one over ``len(self._open)`` GPU seconds a second.
        self._holding: dict[tuple[str, bool], int] = {}
        self._cut_at = started
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
        self._booked_until = started

    def __len__(self) -> int:
        """Intervals kept: what long uptime must not grow."""
        return len(self._closed) + len(self._open)

    def open(self, key: object, pool: str, now: float, preemptible: bool = False) -> None:
        if key in self._open:
            self.close(key, now)
        self._cut(now)
        holding = pool, preemptible
        self._open[key] = holding
        self._holding[holding] = self._holding.get(holding, 0) + 1

    def close(self, key: object, now: float) -> None:
        opened = self._open.get(key)
        if opened is None:
            return
        self._cut(now)
        del self._open[key]
        if self._holding[opened] == 1:
            del self._holding[opened]
        else:
            self._holding[opened] -= 1

    def _cut(self, now: float) -> None:
        """Books the open holds' seconds since the last open or close, before their count changes.

        Between two opens or closes the same holds are open, so each pool's seconds in that
        stretch are spread evenly over it: one interval per (pool, preemptibility) holding.
        """
        begin = self._cut_at
        if now <= begin:
            return
        self._cut_at = now
        if not self._holding:
            return
        self._booked_until = max(self._booked_until, now)
        self._trim(self._start(now))
        holders = len(self._open)
        for (pool, preemptible), holds in self._holding.items():
            self._book(begin, now, pool, preemptible, holds, holders)

    def _book(self, begin: float, now: float, pool: str, preemptible: bool,
              holds: int, holders: int) -> None:
        last = self._closed[-1] if self._closed else None
        # Field by field, not as tuples: compiled, a tuple comparison is a generic call.
        if last is not None and last.pool == pool and last.preemptible == preemptible \
                and last.end == begin and last.holds == holds and last.holders == holders:
            # Back to back at the same rate: one interval, exactly.
            self._grow(last, now, _held(begin, now, holds, holders))
            return
        if len(self._closed) >= self.max_intervals:
            same = next((i for i in reversed(self._closed)
                         if (i.pool, i.preemptible) == (pool, preemptible)), None)
            if same is not None:
                self._grow(same, max(same.end, now), _held(begin, now, holds, holders))
                return
        interval = _Interval(begin, now, pool, preemptible, holds, holders)
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
        if now < self._booked_until:
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
        # The open holds' stretch since the last open or close, not yet booked.
        stretch = max(now - max(self._cut_at, start), 0.0)
        holders = len(self._open)
        for (pool, low), holds in self._holding.items():
            if non_preemptible and low:
                seconds.setdefault(pool, 0.0)
                continue
            seconds[pool] = seconds.get(pool, 0.0) + _held(0.0, stretch, holds, holders)
        span = now - start
        if span <= _EPS:
            return {pool: 0.0 for pool in seconds}
        return {pool: max(s, 0.0) / span for pool, s in seconds.items()}
