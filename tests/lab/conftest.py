"""Fixtures for the Jupyter side: a real Jupyter server (pytest-jupyter) with the Kiwi extension,
pointed at a real daemon or left to start its embedded one.

pytest-jupyter's fixtures are imported here rather than enabled as a plugin, so they (and their
autouse cleanup of a ServerApp) apply to these tests only.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator

import pytest
from kiwiserver import kiwi_config
from pytest_jupyter.jupyter_server import *  # noqa: F403
from support import DaemonProcess, short_tmpdir


@pytest.fixture
def kiwi_daemon(start_daemon: Callable[..., DaemonProcess]) -> DaemonProcess:
    """A node daemon with a long TQ, so holders change only when a test says so."""
    return start_daemon("--tq", "30", "--grace", "1")


@pytest.fixture
def nowhere(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A KIWI_SOCKET at which nothing answers (in a folder removed afterwards)."""
    directory = short_tmpdir()
    path = str(directory / "absent.sock")
    monkeypatch.setenv("KIWI_SOCKET", path)
    yield path
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def jp_server_config(kiwi_daemon: DaemonProcess) -> dict:
    """By default: the extension talks to `kiwi_daemon`, no embedded scheduler. Tests that want
    something else override this fixture."""
    return kiwi_config(socket=kiwi_daemon.socket, embedded_scheduler=False)
