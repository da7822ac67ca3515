"""From a file to a ``SchedulerConfig``: reading YAML or TOML, and laying the top-level keys
(and the small ``connections:`` and ``gpus:`` sections) over the defaults."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
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
    parse_seconds_or_never,
    parse_size,
    parse_tq,
    section,
)
from nodeside.files import FileRefused, read_trusted_text


def parse_connections(raw: Any) -> limits.ConnectionLimits:
    """The ``connections:`` section: hello_timeout, idle_timeout, stall_timeout (seconds),
    per_uid, backlog, uid_share (a fraction)."""
    raw = section(raw, "connections", (f.name for f in dataclass_fields(limits.ConnectionLimits)))
    changes: dict[str, Any] = {}
    for key, value in raw.items():
        where = f"connections.{key}"
        if key.endswith("_timeout"):
            changes[key] = parse_tq(value, where)
        elif key.endswith("_share"):
            try:
                changes[key] = limits.share(value, where)
            except limits.LimitError as exc:
                raise ConfigError(str(exc)) from None
        elif isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1 << 20:
            raise ConfigError(f"{where}: expected a whole number from 1 to {1 << 20}, "
                              f"got {limits.shown(value)}")
        else:
            changes[key] = value
    return replace(limits.ConnectionLimits(), **changes)


def from_mapping(raw: Mapping[str, Any], base: SchedulerConfig | None = None) -> SchedulerConfig:
    """Validate a parsed config file and lay it over ``base`` (the defaults)."""
    config = base or SchedulerConfig()
    raw = section(raw, "", _PARSERS)
    changes: dict[str, Any] = {}
    for key, value in raw.items():
        name, parse = _PARSERS[key]
        changes[name] = parse(value)
    return replace(config, **changes)


def _parse_group(raw: Any) -> str | None:
    return None if raw is None else str(raw)


def _parse_socket_mode(raw: Any) -> int:
    try:
        return int(raw, 8) if isinstance(raw, str) else int(raw)
    except ValueError:
        raise ConfigError(f"socket_mode: expected octal permissions such as '0660', "
                          f"got {limits.shown(raw)}") from None


def _parse_gpus(raw: Any) -> dict[int, float]:
    if not isinstance(raw, Mapping):
        raise ConfigError("gpus: expected a mapping of GPU index to {tq: seconds}")
    out: dict[int, float] = {}
    for index, spec in raw.items():
        try:
            gpu = int(index)
        except (TypeError, ValueError):
            raise ConfigError(f"gpus: GPU index must be an integer, got "
                              f"{limits.shown(index)}") from None
        spec = section(spec, f"gpus.{gpu}", ("tq",))
        if "tq" in spec:
            out[gpu] = parse_tq(spec["tq"], f"gpus.{gpu}.tq")
    return out


#: A config file is a few KiB; a larger one is a mistake (or a symlink to something else).
MAX_CONFIG_BYTES = 1024 * 1024


def read_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse a YAML or TOML file (by extension; YAML otherwise) into a mapping."""
    path = Path(path)
    try:
        # Owned by root or the daemon's user, writable by no one else, UTF-8, bounded.
        text = read_trusted_text(path, MAX_CONFIG_BYTES)
    except FileNotFoundError:
        raise ConfigError(f"cannot read config {path}: no such file") from None
    except FileRefused as exc:
        raise ConfigError(f"refusing config {path}: {exc}") from None
    try:
        if path.suffix.lower() == ".toml":
            try:
                import tomllib
            except ModuleNotFoundError:  # Python 3.10
                import tomli as tomllib  # type: ignore[no-redef,unused-ignore]
            return tomllib.loads(text)
        import yaml

        data = yaml.safe_load(text)
    except Exception as exc:  # noqa: BLE001 - any parser error: said without the file's text
        raise ConfigError(f"{path}: {parse_error(exc)}") from None
    return data if data is not None else {}


def parse_error(exc: Exception) -> str:
    """A parser's error without the lines it quotes: where, and what kind of problem."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is not None:  # YAML: the message quotes the offending line; say where instead
        return f"not valid YAML at line {mark.line + 1}, column {mark.column + 1}" + \
            (f": {problem}" if problem and len(problem) < 80 else "")
    if type(exc).__name__ == "TOMLDecodeError":  # "Invalid value (at line 3, column 7)"
        return f"not valid TOML: {str(exc)[:120]}"
    return f"cannot be parsed ({type(exc).__name__})"


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


def _parse_switch(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"handoff_overlap must be true or false, not {value!r}")
    return value


#: Each top-level key: the SchedulerConfig field it sets and how its value is read.
_PARSERS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "tq": ("tq", parse_tq),
    "mode": ("mode", parse_mode),
    "pools": ("pools", parse_pools),
    "gpus": ("gpu_tq", _parse_gpus),
    "grace": ("grace", lambda value: parse_tq(value, "grace")),
    "checkpoint_timeout": ("checkpoint_timeout",
                           lambda value: parse_tq(value, "checkpoint_timeout")),
    "window": ("window", lambda value: parse_tq(value, "window")),
    "connections": ("connections", parse_connections),
    "memory_reserve": ("memory_reserve", parse_size),
    "pin_budget": ("pin_budget", parse_size),
    "host_budget": ("host_budget", parse_size),
    "spill_after": ("spill_after", lambda value: parse_seconds_or_never(value, "spill_after")),
    "tier_timeout": ("tier_timeout",
                     lambda value: parse_seconds_or_never(value, "tier_timeout")),
    "handoff_overlap": ("handoff_overlap", _parse_switch),
    "evict_timeout": ("evict_timeout", lambda value: parse_tq(value, "evict_timeout")),
    "evict_interval": ("evict_interval", lambda value: parse_seconds_or_never(
        value, "evict_interval")),
    "checkpoint_after": ("checkpoint_after", lambda value: parse_seconds_or_never(
        value, "checkpoint_after")),
    "admin_group": ("admin_group", _parse_group),
    "socket_group": ("socket_group", _parse_group),
    "socket_mode": ("socket_mode", _parse_socket_mode),
    "access": ("access", parse_access),
    "policy": ("policy", parse_policy),
    "interactive": ("interactive", parse_interactive),
}
