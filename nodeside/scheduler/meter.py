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
from typing import Final

from nodeside.limits import MAX_SHARE_INTERVALS

_EPS: Final = 1e-9


def _held(begin: float, end: float, holds: int, holders: int) -> float:
    """GPU seconds of ``holds`` of ``holders`` side by side from ``begin`` to ``end``."""
    # Whole when they are all the holders (one holder alone above all): exactly end - begin.
    return end - begin if holds == holders else (end - begin) * holds / holders


class _Stream:
    """One pool's holds of one preemptibility: how many are open, and the seconds booked for
    them. Each open hold and each booked interval points at its stream, so that an open, a
    close and a booking change counts in place, with no key to build and hash; the meter keeps
    a stream while it has an open hold or a booked interval, and no longer."""

    __slots__ = ("pool", "preemptible", "holds", "total", "intervals")

    def __init__(self, pool: str, preemptible: bool) -> None:
        self.pool, self.preemptible = pool, preemptible
        #: Holds open now: each has been accruing one over ``len(ShareMeter._open)`` GPU
        #: seconds a second since the last open or close.
        self.holds = 0
        #: Sum of ``held`` over its booked intervals, and how many there are.
        self.total = 0.0
        self.intervals = 0


class _Interval:
    __slots__ = ("begin", "end", "stream", "held", "holds", "holders", "trimmed")

    def __init__(self, begin: float, end: float, stream: _Stream, holds: int = 1,
                 holders: int = 1) -> None:
        self.begin, self.end, self.stream = begin, end, stream
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

    A handoff closes one hold and opens the next at the same instant (the share meter's part
    of every handoff): the close books the holder's stretch, which one pool's back-to-back holds
    grow into one interval, and the open books nothing, as no time passed.
    """

    def __init__(self, window: float, started: float,
                 max_intervals: int = MAX_SHARE_INTERVALS) -> None:
        self.window = window
        self.started = started
        self.max_intervals = max_intervals
        self._closed: deque[_Interval] = deque()  # in the order they were booked
        #: The newest of ``_closed`` (None when it is empty), read without indexing the deque.
        self._last: _Interval | None = None
        self._open: dict[object, _Stream] = {}
        #: Each pool's streams, non-preemptible and preemptible, while they have an open hold
        #: or a booked interval: a pool that came and went leaves nothing behind.
        self._streams: dict[str, _Stream] = {}
        self._low_streams: dict[str, _Stream] = {}
        #: Streams with open holds, and streams with booked intervals, each in the order they
        #: came to have them (the order the shares add up in).
        self._holding: dict[_Stream, None] = {}
        self._booked: dict[_Stream, None] = {}
        self._cut_at = started
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
        streams = self._low_streams if preemptible else self._streams
        stream = streams.get(pool)
        if stream is None:
            stream = streams[pool] = _Stream(pool, preemptible)
        self._open[key] = stream
        if stream.holds == 0:
            self._holding[stream] = None
        stream.holds += 1

    def close(self, key: object, now: float) -> None:
        stream = self._open.get(key)
        if stream is None:
            return
        self._cut(now)
        del self._open[key]
        stream.holds -= 1
        if stream.holds == 0:
            del self._holding[stream]
            self._forget_if_unused(stream)

    def _forget_if_unused(self, stream: _Stream) -> None:
        if stream.holds == 0 and stream.intervals == 0:
            del (self._low_streams if stream.preemptible else self._streams)[stream.pool]

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
        if now > self._booked_until:
            self._booked_until = now
        self._trim(self._start(now))
        holders = len(self._open)
        for stream in self._holding:
            self._book(begin, now, stream, stream.holds, holders)

    def _book(self, begin: float, now: float, stream: _Stream, holds: int,
              holders: int) -> None:
        last = self._last
        if last is not None and last.stream is stream and last.end == begin \
                and last.holds == holds and last.holders == holders:
            # Back to back at the same rate: one interval, exactly.
            self._grow(last, now, _held(begin, now, holds, holders))
            return
        if len(self._closed) >= self.max_intervals:
            same = next((i for i in reversed(self._closed) if i.stream is stream), None)
            if same is not None:
                self._grow(same, max(same.end, now), _held(begin, now, holds, holders))
                return
        interval = _Interval(begin, now, stream, holds, holders)
        self._closed.append(interval)
        self._last = interval
        if stream.intervals == 0:
            self._booked[stream] = None
        stream.total += interval.held
        stream.intervals += 1
        heapq.heappush(self._later, (begin, next(self._seq), interval))

    @staticmethod
    def _grow(interval: _Interval, end: float, seconds: float) -> None:
        interval.end = end
        interval.held += seconds
        interval.stream.total += seconds

    def _start(self, now: float) -> float:
        start = now - self.window
        return start if start > self.started else self.started

    def _trim(self, start: float) -> None:
        # A window that grows (a longer TQ) moves the start back: the intervals already taken
        # as straddling stay so, which costs nothing, since ``seconds_after`` counts an
        # interval that begins inside the window whole.
        later = self._later
        while later and later[0][0] < start:
            self._straddling.append(heapq.heappop(later)[2])
        closed = self._closed
        gone = False
        while closed and closed[0].end <= start:
            interval = closed.popleft()
            interval.trimmed = True
            stream = interval.stream
            if stream.intervals == 1:
                stream.intervals = 0
                stream.total = 0.0  # no rounding carried on
                del self._booked[stream]
                self._forget_if_unused(stream)
            else:
                stream.intervals -= 1
                stream.total -= interval.held
            gone = True
        if gone:
            if not closed:
                self._last = None
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
            spans = [(i.begin, i.end, i.stream.pool, i.stream.preemptible, i.held)
                     for i in self._closed]
            for begin, end, pool, low, held in spans:
                overlap = min(end, now) - max(begin, start)
                if not (non_preemptible and low) and overlap > 0:
                    seconds[pool] = seconds.get(pool, 0.0) + held * overlap / (end - begin)
                else:
                    seconds.setdefault(pool, 0.0)
        else:
            for stream in self._booked:
                pool = stream.pool
                if not (non_preemptible and stream.preemptible):
                    seconds[pool] = seconds.get(pool, 0.0) + stream.total
                else:
                    seconds.setdefault(pool, 0.0)
            for interval in self._straddling:
                if not (non_preemptible and interval.stream.preemptible):
                    seconds[interval.stream.pool] -= \
                        interval.held - interval.seconds_after(start)
        # The open holds' stretch since the last open or close, not yet booked.
        stretch = max(now - max(self._cut_at, start), 0.0)
        holders = len(self._open)
        for stream in self._holding:
            pool = stream.pool
            if non_preemptible and stream.preemptible:
                seconds.setdefault(pool, 0.0)
                continue
            seconds[pool] = seconds.get(pool, 0.0) + _held(0.0, stretch, stream.holds, holders)
        span = now - start
        if span <= _EPS:
            return {pool: 0.0 for pool in seconds}
        return {pool: max(s, 0.0) / span for pool, s in seconds.items()}
