"""The daemon restarting never kills a client: it reconnects, registers again, and resumes."""

from __future__ import annotations

import threading
import time

import pytest
from support import DaemonProcess, scaled, wait_for, wait_for_status

from nodeside.client import Client


def test_client_reconnects_and_registers_again_by_itself(daemon: DaemonProcess) -> None:
    with Client(daemon.socket, name="survivor") as c:
        daemon.kill()
        wait_for(lambda: not c.connected, 5, what="the client to notice")
        daemon.start()
        wait_for(lambda: c.connected, 10, what="the client to reconnect")
        names = [x["name"] for x in c.status()["clients"]]
        assert names == ["survivor"]


def test_holder_loses_the_gpu_with_the_daemon_and_gets_it_back(daemon: DaemonProcess) -> None:
    with Client(daemon.socket, name="holder") as c:
        c.acquire(timeout=5)
        daemon.kill()
        wait_for(lambda: not c.holding, 5, what="the hold to end with the daemon")
        assert c.drop_requested.is_set()
        daemon.start()
        wait_for(lambda: c.holding, 10, what="the hold to come back after the restart")


def test_pending_acquire_resumes_after_a_restart(daemon: DaemonProcess) -> None:
    with Client(daemon.socket, name="holder") as holder, \
            Client(daemon.socket, name="waiter") as waiter:
        holder.acquire(timeout=5)
        outcome: list[object] = []
        thread = threading.Thread(target=lambda: outcome.append(waiter.acquire(timeout=20)),
                                  daemon=True)
        thread.start()
        wait_for_status(daemon.socket, lambda doc: doc["gpus"][0]["queue"],
                        what="the waiter to queue")
        daemon.kill()
        holder.close()  # the holder is gone for good; only the waiter comes back
        daemon.start()
        thread.join(scaled(15))
        assert outcome == [None] and waiter.holding


def test_acquire_fails_with_connection_error_after_its_timeout(daemon: DaemonProcess) -> None:
    with Client(daemon.socket, name="lonely") as c:
        daemon.kill()
        wait_for(lambda: not c.connected, 5, what="the client to notice")
        started = time.monotonic()
        with pytest.raises(ConnectionError, match="cannot reach the Kiwi scheduler"):
            c.acquire(timeout=0.5)
        assert time.monotonic() - started < scaled(3)


def test_untimed_acquire_gives_up_after_the_reconnect_timeout(scratch) -> None:
    c = Client(str(scratch / "absent.sock"), name="x", reconnect_timeout=0.5)
    try:
        with pytest.raises(ConnectionError):
            c.acquire()
    finally:
        c.close()


def test_status_fails_fast_when_nothing_listens(scratch) -> None:
    with Client(str(scratch / "absent.sock"), register=False) as c:
        started = time.monotonic()
        with pytest.raises(ConnectionError):
            c.status()
        assert time.monotonic() - started < scaled(2)


def test_state_file_keeps_runtime_changes_across_a_restart(start_daemon, scratch) -> None:
    state = scratch / "state.json"
    daemon = start_daemon("--state-file", str(state), "--tq", "30")
    with Client(daemon.socket, register=False) as c:
        c.set_mode("off")
        c.set_tq(7.5)
    daemon.restart()
    with Client(daemon.socket, register=False) as c:
        doc = c.status()
    assert (doc["mode"], doc["tq"]) == ("off", 7.5)
    daemon.wait_log(r"Restored runtime settings")
