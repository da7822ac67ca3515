"""What both clients share: the error type, how a refusal becomes a Python exception, the
status and admin calls, and the defaults a client takes from its environment."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from nodeside import limits
from nodeside import protocol as p


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


class Commands:
    """The requests every client makes alike, the status document and the admin calls, over
    the client's own ``call`` (one request and its reply; KiwiError for a refusal). The admin
    calls return the daemon's reply, whose ``mode`` and ``tq`` the client keeps."""

    def __init__(self, call: Callable[..., dict[str, Any]]) -> None:
        self._call = call

    def status(self) -> dict[str, Any]:
        document: dict[str, Any] = self._call(p.STATUS)["status"]
        return document

    def set_mode(self, mode: str) -> dict[str, Any]:
        if mode not in p.MODES:
            raise ValueError(f"mode must be one of {', '.join(p.MODES)}, not {mode!r}")
        return self._admin(p.SET_MODE, mode=mode)

    def set_tq(self, seconds: float, gpu: int | None = None) -> dict[str, Any]:
        return self._admin(p.SET_TQ, tq=limits.tq_seconds(seconds), gpu=gpu)

    def _admin(self, op: str, **fields: Any) -> dict[str, Any]:
        try:
            return self._call(op, **fields)
        except KiwiError as exc:
            raise admin_refusal(exc) from None


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
