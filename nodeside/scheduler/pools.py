"""Pools: how GPU time is divided between teams, after the KAI scheduler's rules.

Quantities are fractions of one GPU's time. While pools contend for a GPU, each gets its
guarantee first, the rest is divided by weight, and no pool passes its maximum; what a capped
pool cannot take flows to the others. ``entitlements`` computes that division; ``ShareMeter``
measures what each pool actually got over a sliding window, so the core can serve the pool
furthest below its entitlement. A ``Pool`` itself is the domain's (``nodeside.model``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from nodeside.model import Pool
from nodeside.scheduler.meter import ShareMeter

__all__ = ["ShareMeter", "entitlements", "preemption_enabled", "preemption_off_reason"]

_EPS: Final = 1e-9


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
