"""The ``access:`` section: its rules read into the domain's types (``nodeside.model``).

User and group names are resolved to ids here, once, on this node; the core only compares ids.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from nodeside.config.values import ConfigError, one_of, section
from nodeside.limits import shown
from nodeside.model import ANY, ON_VIOLATION, AccessPolicy, AccessRule
from nodeside.protocol import PRIORITIES

_ACCESS_KEYS = {"on_violation", "default", "rules"}
_RULE_KEYS = {"uids", "gids", "namespaces", "pools", "priorities"}
#: A Kubernetes namespace name: a DNS-1123 label.
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def parse_access(raw: Any) -> AccessPolicy | None:
    """The ``access`` section: which uids, gids and namespaces may claim which pools and
    priorities."""
    if raw is None:
        return None
    raw = section(raw, "access", _ACCESS_KEYS)
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
    raw = section(raw, where, keys)
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
            raise ConfigError(f"{where}: {shown(name)} is not a Kubernetes namespace name (at most "
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
                raise ConfigError(f"{where}: no such name on this node: {shown(item)}") from None
        else:
            raise ConfigError(f"{where}: expected ids or names, got {shown(item)}")
    return out


def _uid_of(name: str) -> int:
    import pwd

    return pwd.getpwnam(name).pw_uid


def _gid_of(name: str) -> int:
    import grp

    return grp.getgrnam(name).gr_gid
