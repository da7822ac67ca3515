"""The daemon's configuration: one object holding every limit and default, read from YAML or TOML.

Validation happens here, once, with messages that name the key and what was wrong, so that a
typo in a ConfigMap is a clear error at start instead of a silent default.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Any, TypeVar

from nodeside import limits
from nodeside.protocol import DEFAULT_POOL, MODES, PRIORITIES
from nodeside.protocol import DEFAULT_SOCKET as DEFAULT_SOCKET  # where it used to live
from nodeside.scheduler.access import ANY, ON_VIOLATION, AccessPolicy, AccessRule
from nodeside.scheduler.pools import UNLIMITED, Pool

DEFAULT_TQ = 30.0

#: How the next holder is chosen within the pools' rules (docs/policy.md says when to use which).
POLICY_ROUND_ROBIN = "round-robin"
POLICY_INTERACTIVE = "interactive"

T = TypeVar("T")


class ConfigError(ValueError):
    """The configuration is wrong; the message says where and how."""


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


@dataclass(frozen=True)
class SchedulerConfig:
    tq: float = DEFAULT_TQ
    mode: str = "on"
    #: Pools by name. Empty means one implicit pool, ``default``, guaranteed the whole GPU.
    pools: Mapping[str, Pool] = field(default_factory=dict)
    #: Per-GPU TQ overrides, by GPU index.
    gpu_tq: Mapping[int, float] = field(default_factory=dict)
    #: Seconds a holder has, after a drop request, before the GPU is taken from it. Giving the
    #: GPU back may mean moving tens of GiB to host memory, so this is generous.
    grace: float = 10.0
    #: Seconds over which pool shares are measured; None: 50 quanta of the GPU's TQ, long
    #: enough that one quantum moves a share by 0.02, short enough to forget last hour's burst.
    window: float | None = None
    #: Bytes of GPU memory kept free in auto mode, for the driver and the CUDA contexts.
    memory_reserve: int = 512 * 1024**2
    #: Group (name or gid) whose members may change mode and TQ, besides root and the daemon's uid.
    admin_group: str | None = None
    #: Group owning the socket; its members may connect. None: the daemon's group.
    socket_group: str | None = None
    socket_mode: int = 0o660
    #: Hello deadline, idle limit, per-uid cap and listen backlog (``connections:``).
    connections: limits.ConnectionLimits = field(default_factory=limits.ConnectionLimits)
    #: Who may claim which pools and priorities; None: anyone may claim anything.
    access: AccessPolicy | None = None
    #: How the next holder is chosen: a name in ``nodeside.scheduler.policies.POLICIES``,
    #: ``round-robin`` (the seed's rule, default) or ``interactive``.
    policy: str = POLICY_ROUND_ROBIN
    interactive: InteractiveSettings = field(default_factory=InteractiveSettings)

    def share_window(self, tq: float) -> float:
        return self.window if self.window is not None else 50 * tq

    def tq_for(self, gpu: int) -> float:
        return self.gpu_tq.get(gpu, self.tq)

    def pool(self, name: str) -> Pool:
        """The named pool; a name the config does not know gets guarantee 0, weight 1."""
        if name in self.pools:
            return self.pools[name]
        if not self.pools and name == DEFAULT_POOL:
            return Pool(DEFAULT_POOL, guarantee=1.0, weight=1.0, maximum=UNLIMITED)
        return Pool(name, guarantee=0.0, weight=1.0, maximum=UNLIMITED)

    def with_runtime(self, **changes: Any) -> SchedulerConfig:
        return replace(self, **changes)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
          "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
          "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}


def argument_type(parse: Callable[[Any], T]) -> Callable[[str], T]:
    """Adapt a parser of this module to argparse, so flags and files are checked alike."""
    def convert(text: str) -> T:
        try:
            return parse(text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return convert


def parse_size(text: str | int) -> int:
    """``8GiB``, ``512MiB``, ``80GB`` or a plain byte count, as bytes."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ConfigError(f"size must not be negative: {text}")
        nbytes = text
    else:
        match = _SIZE.match(str(text))
        unit = (match.group(2) or "").upper() if match else None
        if not match or unit not in _UNITS:
            raise ConfigError(f"not a size: {text!r} (try 8GiB, 512MiB or a byte count)")
        try:  # a thousand-digit number reads as an infinite float
            nbytes = int(float(match.group(1)) * _UNITS[unit])
        except OverflowError:
            nbytes = limits.MAX_BYTES + 1
    try:
        return limits.byte_count(nbytes, "size")
    except limits.LimitError as exc:
        raise ConfigError(str(exc)) from None


def parse_tq(value: Any, where: str = "tq") -> float:
    """Seconds within the TQ's one range (``limits.tq_seconds``), or ConfigError saying why."""
    try:
        return limits.tq_seconds(value, where)
    except limits.LimitError as exc:
        raise ConfigError(str(exc)) from None


def parse_connections(raw: Any) -> limits.ConnectionLimits:
    """The ``connections:`` section: hello_timeout, idle_timeout (seconds), per_uid, backlog."""
    if not isinstance(raw, Mapping):
        raise ConfigError("connections: expected a mapping")
    unknown = set(raw) - {f.name for f in dataclass_fields(limits.ConnectionLimits)}
    if unknown:
        raise ConfigError(f"connections: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
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


def one_of(value: Any, spellings: Iterable[str], where: str) -> str:
    """One of an enumeration's words, matched whatever its case and given back as spelled here:
    a config written by hand says ``Interactive`` or ``ROUND-ROBIN`` and means the same word.
    Every enumeration of the config is read so (priorities, in upper case, likewise)."""
    spellings = tuple(spellings)
    if isinstance(value, str):
        for spelling in spellings:
            if value.casefold() == spelling.casefold():
                return spelling
    raise ConfigError(f"{where}: must be one of {', '.join(spellings)} (any case), "
                      f"got {value!r}")


def parse_mode(value: Any, where: str = "mode") -> str:
    # YAML 1.1 reads a bare `on`/`off` as a boolean: take it back to the word the user wrote.
    if value is True:
        value = "on"
    elif value is False:
        value = "off"
    return one_of(value, MODES, where)


def parse_policy(value: Any, where: str = "policy") -> str:
    from nodeside.scheduler.policies import POLICIES  # the policies are listed there

    return one_of(value, sorted(POLICIES), where)


_POOL_KEYS = ("guarantee", "weight", "maximum")
_TOP_KEYS = {"tq", "mode", "pools", "gpus", "grace", "window", "memory_reserve", "connections",
             "admin_group", "socket_group", "socket_mode", "policy", "access", "interactive"}
_INTERACTIVE_KEYS = ("first_quantum", "half_life", "pass_bound", "link_bandwidth")


def _fraction(value: Any, where: str, *, allow_unlimited: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    try:
        number = float(value)
    except OverflowError:  # an integer past a float's range: as out of range as inf
        number = math.inf
    if allow_unlimited and number == -1:
        return UNLIMITED
    if not math.isfinite(number) or number < 0:
        hint = " (or -1 for no maximum)" if allow_unlimited else ""
        raise ConfigError(f"{where}: must be a non-negative number{hint}, got {value!r}")
    return number


def parse_pools(raw: Any) -> dict[str, Pool]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError("pools: expected a mapping of pool name to {guarantee, weight, maximum}")
    pools: dict[str, Pool] = {}
    for name, spec in raw.items():
        where = f"pools.{name}"
        if not isinstance(name, str) or not name:
            raise ConfigError(f"pools: pool names must be non-empty strings, got {name!r}")
        spec = spec or {}
        if not isinstance(spec, Mapping):
            raise ConfigError(f"{where}: expected a mapping with guarantee, weight, maximum")
        unknown = set(spec) - set(_POOL_KEYS)
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))}; "
                              f"a pool takes {', '.join(_POOL_KEYS)}")
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


def from_mapping(raw: Mapping[str, Any], base: SchedulerConfig | None = None) -> SchedulerConfig:
    """Validate a parsed config file and lay it over ``base`` (the defaults)."""
    config = base or SchedulerConfig()
    if not isinstance(raw, Mapping):
        raise ConfigError("the config must be a mapping at the top level")
    unknown = set(raw) - _TOP_KEYS
    if unknown:
        raise ConfigError(f"unknown key(s) {', '.join(sorted(map(str, unknown)))}; "
                          f"known keys are {', '.join(sorted(_TOP_KEYS))}")
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


def parse_interactive(raw: Any) -> InteractiveSettings:
    if raw is None:
        return InteractiveSettings()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"interactive: expected a mapping with {', '.join(_INTERACTIVE_KEYS)}")
    unknown = set(raw) - set(_INTERACTIVE_KEYS)
    if unknown:
        raise ConfigError(f"interactive: unknown key(s) {', '.join(sorted(map(str, unknown)))}; "
                          f"it takes {', '.join(_INTERACTIVE_KEYS)}")
    settings = InteractiveSettings()
    changes: dict[str, Any] = {}
    try:
        for key in ("first_quantum", "half_life"):
            if key in raw:
                changes[key] = limits.tq_seconds(raw[key], f"interactive.{key}")
        if "pass_bound" in raw:
            changes["pass_bound"] = limits.pass_bound(raw["pass_bound"], "interactive.pass_bound")
    except limits.LimitError as exc:
        raise ConfigError(str(exc)) from None
    if "link_bandwidth" in raw:
        bandwidth = parse_size(raw["link_bandwidth"])
        if bandwidth <= 0:
            raise ConfigError("interactive.link_bandwidth: must be a positive number of bytes "
                              f"per second (try 25GB), got {raw['link_bandwidth']!r}")
        changes["link_bandwidth"] = bandwidth
    return replace(settings, **changes)


_ACCESS_KEYS = {"on_violation", "default", "rules"}
_RULE_KEYS = {"uids", "gids", "namespaces", "pools", "priorities"}
#: A Kubernetes namespace name: a DNS-1123 label.
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def parse_access(raw: Any) -> AccessPolicy | None:
    """The ``access`` section: which uids, gids and namespaces may claim which pools and
    priorities."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigError("access: expected a mapping with on_violation, default and rules")
    unknown = set(raw) - _ACCESS_KEYS
    if unknown:
        raise ConfigError(f"access: unknown key(s) {', '.join(sorted(map(str, unknown)))}; "
                          f"known keys are {', '.join(sorted(_ACCESS_KEYS))}")
    policy = AccessPolicy()
    on_violation = one_of(raw.get("on_violation", policy.on_violation), ON_VIOLATION,
                          "access.on_violation")
    default = policy.default
    if "default" in raw:
        default = _parse_rule(raw["default"], "access.default", who=False)
    rules = raw.get("rules") or []
    if not isinstance(rules, list):
        raise ConfigError("access.rules: expected a list of "
                          "{uids, gids, namespaces, pools, priorities}")
    return AccessPolicy(default=default, on_violation=on_violation,
                        rules=tuple(_parse_rule(r, f"access.rules[{i}]", who=True)
                                    for i, r in enumerate(rules)))


def _parse_rule(raw: Any, where: str, *, who: bool) -> AccessRule:
    keys = _RULE_KEYS if who else _RULE_KEYS - {"uids", "gids", "namespaces"}
    if not isinstance(raw, Mapping) or set(raw) - keys:
        raise ConfigError(f"{where}: expected a mapping with {', '.join(sorted(keys))}")
    uids = frozenset(_ids(raw.get("uids"), f"{where}.uids", _uid_of))
    gids = frozenset(_ids(raw.get("gids"), f"{where}.gids", _gid_of))
    namespaces = frozenset(_namespaces(raw.get("namespaces"), f"{where}.namespaces"))
    if who and not uids and not gids and not namespaces:
        raise ConfigError(f"{where}: names nobody; give uids, gids or namespaces")
    pools = _names(raw.get("pools", [ANY]), f"{where}.pools")
    priorities = {str(x).upper() for x in _names(raw.get("priorities", PRIORITIES),
                                                f"{where}.priorities")}
    wrong = priorities - set(PRIORITIES)
    if wrong:
        raise ConfigError(f"{where}.priorities: {', '.join(sorted(wrong))} is not one of "
                          f"{', '.join(PRIORITIES)}")
    return AccessRule(uids=uids, gids=gids, pools=frozenset(pools),
                      priorities=frozenset(priorities), namespaces=namespaces)


def _namespaces(raw: Any, where: str) -> list[str]:
    if raw is None:
        return []
    names = _names(raw, where)
    for name in names:
        if not _NAMESPACE.fullmatch(name):
            raise ConfigError(f"{where}: {name!r} is not a Kubernetes namespace name (at most "
                              f"63 characters: lower-case letters, digits and '-', starting "
                              f"and ending with a letter or digit)")
    return names


def _names(raw: Any, where: str) -> list[str]:
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, (list, tuple)) or not all(isinstance(x, str) and x for x in raw):
        raise ConfigError(f"{where}: expected a list of names")
    return list(raw)


def _ids(raw: Any, where: str, resolve: Callable[[str], int]) -> list[int]:
    if raw is None:
        return []
    if not isinstance(raw, (list, tuple)):
        raw = [raw]
    out = []
    for item in raw:
        if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
            out.append(item)
        elif isinstance(item, str) and item:
            try:
                out.append(int(item) if item.isdigit() else resolve(item))
            except KeyError:
                raise ConfigError(f"{where}: no such name on this node: {item!r}") from None
        else:
            raise ConfigError(f"{where}: expected ids or names, got {item!r}")
    return out


def _uid_of(name: str) -> int:
    import pwd

    return pwd.getpwnam(name).pw_uid


def _gid_of(name: str) -> int:
    import grp

    return grp.getgrnam(name).gr_gid


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
