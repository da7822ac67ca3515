"""Helpers for the policy tests: a scheduler on an injected clock, and the seed's pools."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nodeside.config import from_mapping
from nodeside.scheduler.core import Action, GpuSpec, Scheduler
from nodeside.testing import Replay

GiB = 1024**3

#: The KAI guide's two pools, as fractions of one GPU's time (seeds/kai-scheduler-pools.txt).
SEED_POOLS: dict[str, dict[str, float]] = {
    "training": {"guarantee": 0.3, "weight": 1, "maximum": 0.7},
    "simulation": {"guarantee": 0.5, "weight": 3, "maximum": -1},
}


def make_scheduler(config: Mapping[str, Any] | None = None, *, gpus: int = 1,
                   memory: int | None = None, now: float = 0.0) -> Scheduler:
    specs = [GpuSpec(i, memory_total=memory) for i in range(gpus)]
    return Scheduler(from_mapping(dict(config or {})), specs, now)


def kinds(actions: list[Action]) -> list[tuple[str, str]]:
    """Actions as (type, client) pairs, for readable assertions."""
    return [(type(a).__name__, a.client) for a in actions]


def greedy(replay: Replay, name: str, pool: str = "default", priority: str = "NORMAL",
           **kw: Any) -> str:
    """A client that wants the GPU without pause from now on."""
    worker = replay.add(name, pool=pool, priority=priority, **kw)
    replay.burst(worker, 1e12)
    return worker.id
