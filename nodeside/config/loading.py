"""From a file to a ``SchedulerConfig``: reading YAML or TOML, and laying the top-level keys
(and the small ``connections:`` and ``gpus:`` sections) over the defaults."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import fields as dataclass_fields
from dataclasses import replace
from pathlib import Path
from typing import Any

from nodeside import limits
from nodeside.config.access import parse_access
from nodeside.config.interactive import parse_interactive
from nodeside.config.pools import parse_pools
from nodeside.config.settings import SchedulerConfig
from nodeside.config.values import (
    ConfigError,
    parse_mode,
    parse_policy,
    parse_size,
    parse_tq,
    section,
)

_TOP_KEYS = {"tq", "mode", "pools", "gpus", "grace", "window", "memory_reserve", "connections",
             "admin_group", "socket_group", "socket_mode", "policy", "access", "interactive"}


def parse_connections(raw: Any) -> limits.ConnectionLimits:
    """The ``connections:`` section: hello_timeout, idle_timeout (seconds), per_uid, backlog."""
    raw = section(raw, "connections", (f.name for f in dataclass_fields(limits.ConnectionLimits)))
    changes: dict[str, Any] = {}
    for key, value in raw.items():
        where = f"connections.{key}"
        if key.endswith("_timeout"):
            changes[key] = parse_tq(value, where)
        elif isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1 << 20:
            raise ConfigError(f"{where}: expected a whole number from 1 to {1 << 20}, "
                              f"got {value!r}")
        else:
            changes[key] = value
    return replace(limits.ConnectionLimits(), **changes)


def from_mapping(raw: Mapping[str, Any], base: SchedulerConfig | None = None) -> SchedulerConfig:
    """Validate a parsed config file and lay it over ``base`` (the defaults)."""
    config = base or SchedulerConfig()
    raw = section(raw, "", _TOP_KEYS)
    changes: dict[str, Any] = {}
    if "tq" in raw:
        changes["tq"] = parse_tq(raw["tq"])
    if "mode" in raw:
        changes["mode"] = parse_mode(raw["mode"])
    if "pools" in raw:
        changes["pools"] = parse_pools(raw["pools"])
    if "gpus" in raw:
        changes["gpu_tq"] = _parse_gpus(raw["gpus"])
    if "grace" in raw:
        changes["grace"] = parse_tq(raw["grace"], "grace")
    if "window" in raw:
        changes["window"] = parse_tq(raw["window"], "window")
    if "connections" in raw:
        changes["connections"] = parse_connections(raw["connections"])
    if "memory_reserve" in raw:
        changes["memory_reserve"] = parse_size(raw["memory_reserve"])
    for key in ("admin_group", "socket_group"):
        if key in raw:
            changes[key] = None if raw[key] is None else str(raw[key])
    if "access" in raw:
        changes["access"] = parse_access(raw["access"])
    if "policy" in raw:
        changes["policy"] = parse_policy(raw["policy"])
    if "interactive" in raw:
        changes["interactive"] = parse_interactive(raw["interactive"])
    if "socket_mode" in raw:
        mode = raw["socket_mode"]
        try:
            changes["socket_mode"] = int(mode, 8) if isinstance(mode, str) else int(mode)
        except ValueError:
            raise ConfigError(f"socket_mode: expected octal permissions such as '0660', "
                              f"got {mode!r}") from None
    return replace(config, **changes)


def _parse_gpus(raw: Any) -> dict[int, float]:
    if not isinstance(raw, Mapping):
        raise ConfigError("gpus: expected a mapping of GPU index to {tq: seconds}")
    out: dict[int, float] = {}
    for index, spec in raw.items():
        try:
            gpu = int(index)
        except (TypeError, ValueError):
            raise ConfigError(f"gpus: GPU index must be an integer, got {index!r}") from None
        if not isinstance(spec, Mapping) or set(spec) - {"tq"}:
            raise ConfigError(f"gpus.{index}: expected {{tq: seconds}}")
        if "tq" in spec:
            out[gpu] = parse_tq(spec["tq"], f"gpus.{index}.tq")
    return out


def read_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a YAML or TOML file (by extension; YAML otherwise) into a mapping."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
    try:
        if path.suffix.lower() == ".toml":
            try:
                import tomllib
            except ModuleNotFoundError:  # Python 3.10
                import tomli as tomllib  # type: ignore[no-redef,unused-ignore]
            return tomllib.loads(text)
        import yaml

        data = yaml.safe_load(text)
    except Exception as exc:  # the parsers' own errors carry line and column
        raise ConfigError(f"{path}: {exc}") from None
    return data if data is not None else {}


def load(path: str | os.PathLike[str] | None, base: SchedulerConfig | None = None
         ) -> SchedulerConfig:
    if path is None:
        return base or SchedulerConfig()
    try:
        return from_mapping(read_file(path), base)
    except ConfigError as exc:
        if str(exc).startswith(str(path)):
            raise
        raise ConfigError(f"{path}: {exc}") from None
