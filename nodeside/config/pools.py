"""The ``pools:`` section: each pool's guarantee, weight and maximum, checked together."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from nodeside.config.values import ConfigError, section
from nodeside.limits import shown, shown_name
from nodeside.model import UNLIMITED, Pool

_POOL_KEYS = ("guarantee", "weight", "maximum")


def _fraction(value: Any, where: str, *, allow_unlimited: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: expected a number, got {shown(value)}")
    try:
        number = float(value)
    except OverflowError:  # an integer past a float's range: as out of range as inf
        number = math.inf
    if allow_unlimited and number == -1:
        return UNLIMITED
    if not math.isfinite(number) or number < 0:
        hint = " (or -1 for no maximum)" if allow_unlimited else ""
        raise ConfigError(f"{where}: must be a non-negative number{hint}, got {shown(value)}")
    return number


def parse_pools(raw: Any) -> dict[str, Pool]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError("pools: expected a mapping of pool name to {guarantee, weight, maximum}")
    pools: dict[str, Pool] = {}
    for name, spec in raw.items():
        where = f"pools.{shown_name(name)}"  # the file's own text: whole only when short
        if not isinstance(name, str) or not name:
            raise ConfigError(f"pools: pool names must be non-empty strings, got {shown(name)}")
        spec = spec or {}
        spec = section(spec, where, _POOL_KEYS)
        guarantee = _fraction(spec.get("guarantee", 0.0), f"{where}.guarantee")
        weight = _fraction(spec.get("weight", 1.0), f"{where}.weight")
        maximum = _fraction(spec.get("maximum", UNLIMITED), f"{where}.maximum",
                            allow_unlimited=True)
        if guarantee > 1:
            raise ConfigError(f"{where}.guarantee: {guarantee} is more than one GPU's time")
        if maximum != UNLIMITED and maximum < guarantee:
            raise ConfigError(f"{where}: maximum {maximum} is below guarantee {guarantee}")
        missing = tuple(k for k in _POOL_KEYS if k not in spec)
        pools[name] = Pool(name, guarantee, weight, maximum,
                           complete=not missing, missing=missing)
    total = sum(p.guarantee for p in pools.values())
    if total > 1 + 1e-9:
        listing = ", ".join(f"{p.name} {p.guarantee:g}" for p in pools.values())
        raise ConfigError(f"pools: guarantees add up to {total:g}, more than one GPU's time "
                          f"({listing}); lower them so they sum to at most 1")
    return pools
