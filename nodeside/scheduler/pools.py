"""Pools: how GPU time is divided between teams, after the KAI scheduler's rules.

Quantities are fractions of one GPU's time. While pools contend for a GPU, each gets its
guarantee first, the rest is divided by weight, and no pool passes its maximum; what a capped
pool cannot take flows to the others. ``entitlements`` computes that division; ``ShareMeter``
measures what each pool actually got over a sliding window, so the core can serve the pool
furthest below its entitlement.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from nodeside.limits import MAX_SHARE_INTERVALS

UNLIMITED = -1.0
_EPS = 1e-9


@dataclass(frozen=True)
class Pool:
    name: str
    guarantee: float = 0.0
    weight: float = 1.0
    maximum: float = UNLIMITED
    #: False when the config left out guarantee, weight or maximum. KAI turns preemption off for
    #: every pool when any pool is partially configured; so do we.
    complete: bool = True
    #: Which of guarantee, weight and maximum the config left out (for the reason shown to users).
    missing: tuple[str, ...] = ()

    @property
    def cap(self) -> float:
        return 1.0 if self.maximum < 0 else min(self.maximum, 1.0)


def entitlements(pools: Iterable[Pool]) -> dict[str, float]:
    """The fraction of one GPU's time each contending pool is entitled to.

    Guarantees first (each clipped to its pool's cap), then the remainder by weight, water-filled
    so that a pool reaching its maximum stops taking and its part goes to the others. With the
    seed's pools (0.3/1/0.7 and 0.5/3/unlimited) this gives 0.35 and 0.65.
    """
    pools = list(pools)
    share = {p.name: min(p.guarantee, p.cap) for p in pools}
    remaining = 1.0 - sum(share.values())
    open_pools = [p for p in pools if share[p.name] < p.cap - _EPS]
    while remaining > _EPS and open_pools:
        total_weight = sum(max(p.weight, 0.0) for p in open_pools)
        if total_weight <= _EPS:
            break
        capped = []
        for p in open_pools:
            offer = remaining * max(p.weight, 0.0) / total_weight
            if share[p.name] + offer >= p.cap - _EPS:
                capped.append(p)
        if not capped:
            for p in open_pools:
                share[p.name] += remaining * max(p.weight, 0.0) / total_weight
            remaining = 0.0
            break
        for p in capped:
            remaining -= p.cap - share[p.name]
            share[p.name] = p.cap
        open_pools = [p for p in open_pools if p not in capped]
    return share


class ShareMeter:
    """GPU seconds per pool over the last ``window`` seconds of one GPU's time.

    Holds closed hold intervals and the open ones. Shares are measured against the window's
    length, or against the time observed so far while the meter is younger than its window, so
    that the first quanta already count.

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
        #: [begin, end, pool, preemptible, GPU seconds], in the order the holds closed.
        self._closed: deque[list[Any]] = deque()
        self._open: dict[object, tuple[float, str, bool]] = {}

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
        self._trim(now)
        last = self._closed[-1] if self._closed else None
        if last is not None and last[2:4] == [pool, preemptible] and last[1] == begin:
            last[1] = now  # back to back: one interval, exactly
            last[4] += now - begin
            return
        if len(self._closed) >= self.max_intervals:
            same = next((entry for entry in reversed(self._closed)
                         if entry[2:4] == [pool, preemptible]), None)
            if same is not None:
                same[1] = max(same[1], now)
                same[4] += now - begin
                return
        self._closed.append([begin, now, pool, preemptible, now - begin])

    def _trim(self, now: float) -> None:
        start = max(now - self.window, self.started)
        while self._closed and self._closed[0][1] <= start:
            self._closed.popleft()

    def shares(self, now: float, pools: Iterable[str] = (), *,
               non_preemptible: bool = False) -> dict[str, float]:
        """Each pool's fraction of the window; only non-preemptible holds if so asked."""
        start = max(now - self.window, self.started)
        self._trim(now)
        seconds: dict[str, float] = dict.fromkeys(pools, 0.0)
        spans = [*self._closed,
                 *([s, now, p, low, now - s] for s, p, low in self._open.values())]
        for begin, end, pool, preemptible, held in spans:
            if non_preemptible and preemptible:
                seconds.setdefault(pool, 0.0)
                continue
            overlap = min(end, now) - max(begin, start)
            if overlap > 0:
                # Exact for a single hold (held == end - begin); a folded interval's seconds
                # are taken as spread evenly over its span.
                seconds[pool] = seconds.get(pool, 0.0) + held * overlap / (end - begin)
        span = now - start
        if span <= _EPS:
            return {pool: 0.0 for pool in seconds}
        return {pool: s / span for pool, s in seconds.items()}


def preemption_enabled(pools: Mapping[str, Pool]) -> bool:
    return all(p.complete for p in pools.values())


def preemption_off_reason(pools: Mapping[str, Pool]) -> str | None:
    """Why preemption is off, in the words of the KAI troubleshooting guide; None when it is on."""
    partial = [p for p in pools.values() if not p.complete]
    if not partial:
        return None
    lacking = "; ".join(f"{p.name} lacks {', '.join(p.missing) or 'a setting'}" for p in partial)
    return (f"preemption is off: every pool must set guarantee, weight and maximum, "
            f"and {lacking}")
