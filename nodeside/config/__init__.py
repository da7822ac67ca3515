"""The daemon's configuration: one object holding every limit and default, read from YAML or TOML.

Validation happens here, once, with messages that name the key and what was wrong, so that a
typo in a ConfigMap is a clear error at start instead of a silent default.

Split by role: ``settings`` is the object (``SchedulerConfig``), ``values`` the parsers every
section shares, ``pools``, ``access`` and ``interactive`` one section each, and ``loading``
reads a file and lays its top level over the defaults. ``nodeside.config`` stays the one import
path: callers import from here, never from the modules.
"""

from __future__ import annotations

from nodeside.config.access import parse_access
from nodeside.config.interactive import InteractiveSettings, parse_interactive
from nodeside.config.loading import from_mapping, load, parse_connections, read_file
from nodeside.config.pools import parse_pools
from nodeside.config.settings import (
    DEFAULT_TQ,
    POLICY_INTERACTIVE,
    POLICY_ROUND_ROBIN,
    SchedulerConfig,
)
from nodeside.config.values import (
    ConfigError,
    argument_type,
    one_of,
    parse_mode,
    parse_policy,
    parse_size,
    parse_tq,
)
from nodeside.protocol import DEFAULT_POOL
from nodeside.protocol import DEFAULT_SOCKET as DEFAULT_SOCKET  # where it used to live

__all__ = [
    "DEFAULT_POOL",
    "DEFAULT_SOCKET",
    "DEFAULT_TQ",
    "POLICY_INTERACTIVE",
    "POLICY_ROUND_ROBIN",
    "ConfigError",
    "InteractiveSettings",
    "SchedulerConfig",
    "argument_type",
    "from_mapping",
    "load",
    "one_of",
    "parse_access",
    "parse_connections",
    "parse_interactive",
    "parse_mode",
    "parse_policy",
    "parse_pools",
    "parse_size",
    "parse_tq",
    "read_file",
]
