"""``Client.request`` and ``Client.wait_for_grant``: acquire in two halves, "ask now, wait later".

A caller with its own work to do before it needs the GPU (a kernel compiling a cell) sends the
request first and waits for the grant afterwards, so the round trip to the daemon overlaps that
work. These tests use a real daemon on a real socket.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Callable
from typing import Any

import pytest
from support import (
    DaemonProcess,
    client_state,
    scaled,
    short_tmpdir,
    wait_for_status,
    wait_on_client,
)

from nodeside.client import Client, connection


def state_of(observer: Client, client: Client) -> str | None:
    row = next((c for c in observer.status()["clients"] if c["id"] == client.id), None)
    return None if row is None else row["state"]


def test_request_returns_at_once_and_the_grant_arrives_by_itself(daemon: DaemonProcess) -> None:
    with Client(daemon.socket, name="asker") as asker:
        wait_on_client(asker, lambda: asker.connected, what="the connection")
        asker.request()
        wait_on_client(asker, lambda: asker.holding, what="the grant, with nobody waiting for it")
        assert asker.wait_for_grant(timeout=0) is True
        assert state_of(asker, asker) == "holding"


def test_request_while_the_gpu_is_held_queues_without_blocking(daemon: DaemonProcess) -> None:
    with Client(daemon.socket, name="holder") as holder, \
            Client(daemon.socket, name="asker") as asker:
        holder.acquire(timeout=5)
        asker.request()
        wait_for_status(daemon.socket, lambda doc: client_state(doc, "asker") == "waiting",
                        what="the request in the queue")
        assert not asker.holding


def test_wait_for_grant_timing_out_keeps_the_request_queued(daemon: DaemonProcess) -> None:
    with Client(daemon.socket, name="holder") as holder, \
            Client(daemon.socket, name="asker") as asker:
        holder.acquire(timeout=5)
        asker.request()
        assert asker.wait_for_grant(timeout=0.05) is False
        assert state_of(holder, asker) == "waiting"
        holder.release()
        assert asker.wait_for_grant(timeout=5) is True
        assert state_of(holder, asker) == "holding"


def test_release_withdraws_a_pending_request(daemon: DaemonProcess) -> None:
    with Client(daemon.socket, name="holder") as holder, \
            Client(daemon.socket, name="asker") as asker, \
            Client(daemon.socket, name="next") as after:
        holder.acquire(timeout=5)
        asker.request()
        wait_for_status(daemon.socket, lambda doc: client_state(doc, "asker") == "waiting",
                        what="the request in the queue")
        asker.release()
        assert state_of(holder, asker) != "waiting"
        holder.release()
        after.acquire(timeout=5)  # the GPU went on past the withdrawn request
        assert not asker.holding


def test_an_interrupt_while_waiting_for_the_grant_withdraws_the_request(
        start_daemon) -> None:
    # A quantum far longer than the test: the holder keeps the GPU, so the request is still
    # waiting when the interrupt comes, however slow the machine.
    daemon = start_daemon("--tq", "60", "--grace", "60")
    with Client(daemon.socket, name="holder") as holder, \
            Client(daemon.socket, name="asker") as asker, \
            Client(daemon.socket, name="next") as after:
        holder.acquire(timeout=5)
        asker.request()
        wait_for_status(daemon.socket, lambda doc: client_state(doc, "asker") == "waiting",
                        what="the request in the queue")
        threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()
        with pytest.raises(KeyboardInterrupt):
            asker.wait_for_grant()
        assert state_of(holder, asker) != "waiting"
        holder.release()
        after.acquire(timeout=5)  # the GPU went on past the withdrawn request
        assert not asker.holding


def test_waiting_without_a_request_is_a_mistake(daemon: DaemonProcess) -> None:
    with Client(daemon.socket, name="asker") as asker, pytest.raises(RuntimeError):
        asker.wait_for_grant(timeout=1)


def test_a_control_only_client_cannot_request(daemon: DaemonProcess) -> None:
    with Client(daemon.socket, register=False) as control, pytest.raises(RuntimeError):
        control.request()


def test_request_while_holding_changes_nothing(daemon: DaemonProcess) -> None:
    with Client(daemon.socket, name="asker") as asker:
        asker.acquire(timeout=5)
        asker.request()
        assert asker.wait_for_grant(timeout=0) is True
        asker.release()
        assert state_of(asker, asker) == "idle"


def test_a_request_made_while_the_daemon_is_away_goes_out_when_it_is_back() -> None:
    late = DaemonProcess(short_tmpdir(), "--tq", "1")
    with Client(late.socket, name="early", reconnect_timeout=30) as early:
        early.request()
        assert early.wait_for_grant(timeout=0.1) is False
        try:
            late.start()
            assert early.wait_for_grant(timeout=10) is True
        finally:
            late.cleanup()


class _HandshakeEnd(socket.socket):
    """A real socket that calls ``hook`` (once) when the client stops timing its handshake:
    the moment between the handshake and the connection being published, where a connection
    thread on a loaded machine can lose the CPU."""

    hook: Callable[[], None] | None = None

    def settimeout(self, value: float | None) -> None:
        super().settimeout(value)
        if value is None and _HandshakeEnd.hook is not None:
            hook, _HandshakeEnd.hook = _HandshakeEnd.hook, None
            hook()


class _SocketModule:
    """The ``socket`` module as the client's connection sees it, making ``_HandshakeEnd``s."""

    socket = _HandshakeEnd

    def __getattr__(self, name: str) -> Any:
        return getattr(socket, name)


def test_a_request_made_while_the_client_connects_goes_out_once_it_is_connected(
        daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    made = threading.Event()
    clients: list[Client] = []
    callers: list[threading.Thread] = []
    asked = threading.Event()

    def request_from_another_thread() -> None:
        """In the connection thread, its handshake done: another thread asks, as a caller
        that ran while the connection thread was off the CPU would."""
        made.wait(scaled(10))
        caller = threading.Thread(target=clients[0].request)
        caller.start()
        caller.join(scaled(10))
        callers.append(caller)
        asked.set()

    monkeypatch.setattr(connection, "socket", _SocketModule())
    monkeypatch.setattr(_HandshakeEnd, "hook", request_from_another_thread)
    with Client(daemon.socket, name="asker") as asker:
        clients.append(asker)
        made.set()
        assert asked.wait(scaled(10)), "no request made at the end of the handshake"
        assert not callers[0].is_alive(), "request() blocked: the hook ran under the lock"
        wait_on_client(asker, lambda: asker.holding, what="the grant, with nobody waiting for it")
