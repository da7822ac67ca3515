"""The ``interactive:`` section: the tunables of ``policy: interactive`` and their parser."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from nodeside import limits
from nodeside.config.values import ConfigError, parse_size, section

_INTERACTIVE_KEYS = ("first_quantum", "half_life", "pass_bound", "link_bandwidth", "turns")


@dataclass(frozen=True)
class InteractiveSettings:
    """The tunables of ``policy: interactive`` (nodeside/scheduler/interactive.py)."""

    #: Seconds a holder keeps the GPU, at least, before a client that used far less GPU time
    #: recently may cut its quantum short (raised when moving memory would cost more).
    first_quantum: float = 0.25
    #: Seconds after which GPU time used counts half: how long a training run is remembered.
    #: About a person's think time between cells (the fleet model's median is 40 s): a cell
    #: run after reading the last one's output starts nearly afresh, while a client that asks
    #: again at once (a run split into many requests) still carries what it used. Five
    #: minutes made nearly every notebook look heavy (fleet --explain; docs/policy.md).
    half_life: float = 30.0
    #: How many times a waiter may be passed over by later requests of its own pool and
    #: priority; after that it is served in request order, as under round robin.
    pass_bound: int = 3
    #: Host-link bytes per second, to price moving working sets (25 GB/s: PCIe Gen4).
    link_bandwidth: int = 25 * 10**9
    #: Mode auto: seconds of a turn when holders side by side take turns at the GPU's time,
    #: least attained first, instead of the driver time-slicing between them (``taking_turns``);
    #: 0, the default, leaves them to the driver. Only clients that can pause take turns.
    turns: float = 0.0


def parse_interactive(raw: Any) -> InteractiveSettings:
    if raw is None:
        return InteractiveSettings()
    raw = section(raw, "interactive", _INTERACTIVE_KEYS)
    settings = InteractiveSettings()
    changes: dict[str, Any] = {}
    try:
        for key in ("first_quantum", "half_life"):
            if key in raw:
                changes[key] = limits.tq_seconds(raw[key], f"interactive.{key}")
        if "turns" in raw:
            changes["turns"] = _turns(raw["turns"])
        if "pass_bound" in raw:
            changes["pass_bound"] = limits.pass_bound(raw["pass_bound"], "interactive.pass_bound")
    except limits.LimitError as exc:
        raise ConfigError(str(exc)) from None
    if "link_bandwidth" in raw:
        bandwidth = parse_size(raw["link_bandwidth"])
        if bandwidth <= 0:
            raise ConfigError("interactive.link_bandwidth: must be a positive number of bytes "
                              f"per second (try 25GB), got {limits.shown(raw['link_bandwidth'])}")
        changes["link_bandwidth"] = bandwidth
    return replace(settings, **changes)


def _turns(value: Any) -> float:
    """0 (off) or a turn's seconds in the TQ's range."""
    if value is False:
        return 0.0
    seconds = limits.seconds_in_range(value, "interactive.turns", 0.0, limits.TQ_MAX)
    if 0.0 < seconds < limits.TQ_MIN:
        raise limits.LimitError(f"interactive.turns: 0 (off) or between {limits.TQ_MIN:g} and "
                                f"{limits.TQ_MAX:g} seconds, got {limits.shown(value)}")
    return seconds
