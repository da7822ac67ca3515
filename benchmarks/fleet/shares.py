"""Pool shares during sustained contention: the fleet benchmark's share-error measure."""

from __future__ import annotations

from dataclasses import dataclass, field

from nodeside.scheduler.core import Action
from nodeside.testing import Replay


@dataclass
class Contention:
    """Per GPU, each pool's GPU seconds during sustained contention between pools.

    An episode is a stretch of time during which more than one pool contends for a GPU. Only
    episodes of at least ``min_quanta`` quanta count: the policy acts once per quantum, so a
    notebook that waits ten seconds behind another's burst says nothing about shares.

    The scheduler's state changes only when actions are applied, so between two calls of
    ``observe`` it is what the earlier call saw: that snapshot is what the elapsed time is
    charged to.
    """

    min_length: float
    last: float = 0.0
    held: dict[str, float] = field(default_factory=dict)  # sustained episodes, all GPUs
    sustained: float = 0.0  # seconds of GPU time in sustained episodes
    contended: float = 0.0  # seconds of GPU time in any episode
    concurrent_peak: int = 0
    _holding: dict[int, list[str]] = field(default_factory=dict)  # contended GPU -> pools held
    _episodes: dict[int, tuple[float, dict[str, float]]] = field(default_factory=dict)

    def observe(self, replay: Replay, _: list[Action]) -> None:
        self._charge(replay.now)
        self._holding = {}
        for index, gpu in replay.scheduler.gpus.items():
            if len({c.pool for c in (*gpu.holders.values(), *gpu.waiters.values())}) > 1:
                self._holding[index] = [h.pool for h in gpu.holders.values()]
            elif index in self._episodes:
                self._close(index, replay.now)
        wanting = sum(len(g.holders) + len(g.waiters) for g in replay.scheduler.gpus.values())
        self.concurrent_peak = max(self.concurrent_peak, wanting)

    def finish(self, now: float) -> None:
        self._charge(now)  # the stretch after the last event, too
        for index in list(self._episodes):
            self._close(index, now)

    def _charge(self, now: float) -> None:
        """Charge the time since the last call to the pools holding each contended GPU."""
        dt = now - self.last
        for index, pools in self._holding.items():
            seconds = self._episodes.setdefault(index, (self.last, {}))[1]
            # Holders side by side take turns on the GPU: each had 1/k of its time, as the
            # share meter counts it (one holder: dt exactly, as before).
            each = dt / max(len(pools), 1)
            for pool in pools:
                seconds[pool] = seconds.get(pool, 0.0) + each
        self.last = now

    def _close(self, index: int, now: float) -> None:
        began, seconds = self._episodes.pop(index)
        self.contended += now - began
        if now - began >= self.min_length:
            self.sustained += now - began
            for pool, value in seconds.items():
                self.held[pool] = self.held.get(pool, 0.0) + value
