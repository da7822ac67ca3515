"""kiwictl (and a Client given no path) find the scheduler: ``$KIWI_SOCKET``, else the node's
socket, else the one a Jupyter server published for its user; and when nothing answers, the
error says where it looked and how to point elsewhere. Real daemons on real sockets; each test
has its own ``$XDG_RUNTIME_DIR`` (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import DaemonProcess, wait_on_client

from nodeside.client import Client, ControlClient, discovery
from nodeside.protocol import DEFAULT_SOCKET

pytestmark = pytest.mark.skipif(discovery.is_socket(DEFAULT_SOCKET),
                                reason=f"a node daemon listens at {DEFAULT_SOCKET} here")


def kiwictl(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KIWI_SOCKET"}
    return subprocess.run([sys.executable, "-m", "nodeside.ctl", *args], capture_output=True,
                          text=True, timeout=60, env=env)


@pytest.fixture
def no_kiwi_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KIWI_SOCKET", raising=False)


def test_the_published_socket_is_in_the_users_runtime_dir(private_runtime_dir: Path) -> None:
    assert discovery.published_socket_path() == private_runtime_dir / "kiwi" / "scheduler.sock"


def test_kiwictl_finds_a_published_scheduler_with_no_flag(daemon: DaemonProcess) -> None:
    assert discovery.publish(daemon.socket) is not None
    result = kiwictl("-S", "off")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[INFO] Successfully turned off the Kiwi scheduler.\n"
    with ControlClient(daemon.socket) as control:
        assert control.status()["mode"] == "off"


def test_kiwictl_says_where_it_looked_and_how_to_point_elsewhere() -> None:
    result = kiwictl("status")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert DEFAULT_SOCKET in result.stderr
    assert str(discovery.published_socket_path()) in result.stderr
    assert "--socket" in result.stderr and "KIWI_SOCKET" in result.stderr


def test_kiwictl_says_a_published_link_is_stale_when_its_server_has_gone(scratch: Path) -> None:
    """A Jupyter server killed outright (SIGKILL, a lost machine) cannot remove its link."""
    gone = scratch / "kiwi-gone" / "scheduler.sock"
    assert discovery.publish(str(gone)) is not None
    result = kiwictl("status")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert f"{discovery.published_socket_path()} (a stale link to {gone}" in result.stderr


def test_kiwi_socket_is_the_only_place_looked_at_when_set(
        daemon: DaemonProcess, scratch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    discovery.publish(daemon.socket)
    monkeypatch.setenv("KIWI_SOCKET", str(scratch / "elsewhere.sock"))
    with pytest.raises(ConnectionError, match="elsewhere.sock") as failed:
        ControlClient().status()
    assert daemon.socket not in str(failed.value)


def test_a_client_given_no_path_finds_the_published_scheduler(
        daemon: DaemonProcess, no_kiwi_socket: None) -> None:
    discovery.publish(daemon.socket)
    with Client(name="found") as client:
        client.acquire(timeout=5)
        assert client.status()["clients"][0]["name"] == "found"


def test_an_unreachable_client_names_where_it_looked(no_kiwi_socket: None) -> None:
    with Client(name="lost", reconnect_timeout=0.2) as client:
        wait_on_client(client, lambda: client.last_error != "not connected yet",
                       what="a failed attempt")
        with pytest.raises(ConnectionError) as failed:
            client.status()
    message = str(failed.value)
    assert DEFAULT_SOCKET in message and str(discovery.published_socket_path()) in message
    assert "KIWI_SOCKET" in message


def test_unpublishing_leaves_a_later_servers_link(scratch: Path) -> None:
    first, second = str(scratch / "first.sock"), str(scratch / "second.sock")
    discovery.publish(first)
    link = discovery.publish(second)
    discovery.unpublish(first)  # the first server stops after the second started
    assert link is not None and os.readlink(link) == second
    discovery.unpublish(second)
    assert not os.path.lexists(link)


def test_when_a_later_lab_stops_kiwictl_finds_the_earlier_ones_scheduler_again(
        start_daemon: Any) -> None:
    """Two Labs of one user: the second's scheduler takes the published link; when the second
    stops, the link goes back to the first's, which still runs."""
    first, second = start_daemon(), start_daemon()
    discovery.publish(first.socket)
    link = discovery.publish(second.socket)
    assert link is not None and os.readlink(link) == second.socket
    discovery.unpublish(second.socket)
    assert os.readlink(link) == first.socket
    result = kiwictl("status", "--json")
    assert result.returncode == 0, result.stderr
    discovery.unpublish(first.socket)
    assert not os.path.lexists(link)
    assert list(link.parent.iterdir()) == []


def test_a_server_that_went_without_a_word_is_not_handed_the_link(
        start_daemon: Any, scratch: Path) -> None:
    killed = str(scratch / "killed.sock")  # published, then its server was killed: no socket
    alive = start_daemon()
    discovery.publish(killed)
    discovery.publish(alive.socket)
    link = discovery.publish(str(scratch / "last.sock"))
    discovery.unpublish(str(scratch / "last.sock"))
    assert link is not None and os.readlink(link) == alive.socket
