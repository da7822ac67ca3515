"""What both clients share: the error type, how a refusal becomes a Python exception, and the
defaults a client takes from its environment."""

from __future__ import annotations

import os
import sys
from typing import Any

from nodeside import __version__
from nodeside import protocol as p

#: What a client says in hello: who it is, and the optional behaviours it understands.
HELLO_FIELDS: dict[str, Any] = {
    "version": p.VERSION,
    "software": f"nodeside.client {__version__}",
    "features": [p.FEATURE_POSITION],
}


class KiwiError(RuntimeError):
    """The daemon refused a request; ``code`` is the protocol's error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def refusal(reply: dict[str, Any]) -> KiwiError:
    return KiwiError(str(reply.get("code", "?")), str(reply.get("message", "refused")))


def admin_refusal(exc: KiwiError) -> Exception:
    """An admin request's refusal as the exception the contract names: PermissionError for a
    non-admin, ValueError for a value out of range or over a bound, else the KiwiError."""
    if exc.code == p.E_PERMISSION:
        return PermissionError(str(exc))
    if exc.code in (p.E_INVALID, p.E_LIMIT):
        return ValueError(str(exc))
    return exc


def env_priority(value: str | None) -> str:
    priority = (value or os.environ.get("KIWI_PRIORITY") or p.DEFAULT_PRIORITY).upper()
    if priority not in p.PRIORITIES:
        raise ValueError(f"priority must be one of {', '.join(p.PRIORITIES)}, not {priority!r}")
    return priority


def default_name() -> str:
    return os.environ.get("KIWI_CLIENT_NAME") or \
        f"{os.path.basename(sys.argv[0] or 'python')}-{os.getpid()}"


def pod_labels() -> dict[str, str]:
    """Pod and namespace for metrics, where Kubernetes' downward API put them."""
    labels = {}
    for key, env in (("pod", "KIWI_POD_NAME"), ("namespace", "KIWI_POD_NAMESPACE")):
        if os.environ.get(env):
            labels[key] = os.environ[env]
    return labels
