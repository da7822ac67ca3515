"""Fixtures for the Jupyter side: a real Jupyter server (pytest-jupyter) with the Kiwi extension,
pointed at a real daemon or left to start its embedded one.

pytest-jupyter's fixtures are imported here rather than enabled as a plugin, so they (and their
autouse cleanup of a ServerApp) apply to these tests only.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from jupyter_server.auth.authorizer import Authorizer
from pytest_jupyter.jupyter_server import *  # noqa: F403
from support import DaemonProcess, short_tmpdir


class KiwiReadOnly(Authorizer):
    """An authorizer that lets users see the Kiwi panel but not change the scheduler."""

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        return not (resource == "kiwi" and action == "write")


class NoKiwi(Authorizer):
    """An authorizer that keeps users away from every Kiwi endpoint."""

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        return resource != "kiwi"


@pytest.fixture
def kiwi_daemon(start_daemon: Callable[..., DaemonProcess]) -> DaemonProcess:
    """A node daemon with a long TQ, so holders change only when a test says so."""
    return start_daemon("--tq", "30", "--grace", "1")


@pytest.fixture
def nowhere(monkeypatch: pytest.MonkeyPatch) -> str:
    """A KIWI_SOCKET at which nothing answers."""
    path = str(short_tmpdir() / "absent.sock")
    monkeypatch.setenv("KIWI_SOCKET", path)
    return path


def kiwi_config(**kiwi: Any) -> dict[str, Any]:
    """Server config enabling the extension, with ``c.KiwiExtension`` options."""
    return {
        "ServerApp": {"jpserver_extensions": {"kiwi_jupyter": True}},
        "KiwiExtension": kiwi,
    }


@pytest.fixture
def jp_server_config(request: pytest.FixtureRequest, kiwi_daemon: DaemonProcess) -> dict:
    """By default: the extension talks to `kiwi_daemon`, no embedded scheduler. Tests that want
    something else override this fixture or parametrize it indirectly."""
    return kiwi_config(socket=kiwi_daemon.socket, embedded_scheduler=False)


async def get_status(jp_fetch: Callable[..., Any]) -> dict[str, Any]:
    response = await jp_fetch("kiwi", "api", "status")
    assert response.code == 200
    return json.loads(response.body)


def kiwi_app(serverapp: Any) -> Any:
    """The running KiwiExtension instance of a server."""
    (app,) = serverapp.extension_manager.extension_apps["kiwi_jupyter"]
    return app
