"""The client package: the threaded ``Client`` for holders, the one-shot ``ControlClient`` for
kiwictl and the server, and what importing them costs. Real daemons on real sockets."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from support import DaemonProcess, wait_on_client

from nodeside import limits
from nodeside import protocol as p
from nodeside.client import Client, ControlClient, KiwiError


def test_importing_the_client_imports_neither_the_scheduler_nor_the_config() -> None:
    probe = ("import sys, nodeside.client, kiwi_jupyter\n"
             "print([m for m in sys.modules if m.startswith(('nodeside.scheduler', "
             "'nodeside.config', 'nodeside.daemon'))])\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=60, check=True)
    assert result.stdout.strip() == "[]"


def test_the_client_keeps_its_import_paths() -> None:
    import kiwi_jupyter
    from nodeside.client import Client as Same

    assert kiwi_jupyter.Client is Same is Client


def test_the_shared_defaults_live_in_the_protocol() -> None:
    from nodeside import config

    assert config.DEFAULT_SOCKET == p.DEFAULT_SOCKET == "/var/run/kiwi/scheduler.sock"
    assert config.DEFAULT_POOL == p.DEFAULT_POOL == "default"


def test_the_control_client_reads_status_and_sets_mode_and_tq_without_a_thread(
        daemon: DaemonProcess) -> None:
    threads = threading.active_count()
    with ControlClient(daemon.socket) as control:
        assert control.status()["mode"] == "on"
        control.set_mode("off")
        control.set_tq(2.5)
        assert (control.mode, control.tq) == ("off", 2.5)
        assert threading.active_count() == threads
        document = control.status()
    assert (document["mode"], document["tq"]) == ("off", 2.5)
    assert document["clients"] == []  # a control connection is nobody's client


def test_the_control_client_skips_events_that_cross_its_request(daemon: DaemonProcess) -> None:
    with ControlClient(daemon.socket) as watcher, ControlClient(daemon.socket) as admin:
        watcher.ping()
        admin.set_mode("off")  # broadcasts a mode event to the watcher's connection
        assert watcher.status()["mode"] == "off"
        assert watcher.mode == "off"


def test_the_control_client_refuses_a_tq_out_of_range_before_sending(
        daemon: DaemonProcess) -> None:
    with ControlClient(daemon.socket) as control:
        with pytest.raises(ValueError, match="between"):
            control.set_tq(float("nan"))
        with pytest.raises(ValueError, match="between"):
            control.set_tq(limits.TQ_MAX * 2)
        assert control.status()["tq"] == 0.2


def test_the_control_client_reaches_a_restarted_daemon_in_the_next_call(
        daemon: DaemonProcess) -> None:
    with ControlClient(daemon.socket, timeout=5) as control:
        control.ping()
        daemon.restart()
        assert control.status()["version"] == 1  # the old connection is gone: a new one


def test_the_control_client_says_so_when_its_daemon_is_gone(daemon: DaemonProcess) -> None:
    with ControlClient(daemon.socket, timeout=5) as control:
        control.ping()
        daemon.kill()
        with pytest.raises(ConnectionError, match="cannot reach the Kiwi scheduler"):
            control.ping()


def test_a_control_connection_closed_for_idleness_is_made_again_unnoticed(
        start_daemon: Callable[..., DaemonProcess], scratch: Path) -> None:
    config = scratch / "kiwi.yaml"
    config.write_text("connections: {idle_timeout: 0.5}\n")
    daemon = start_daemon("--config", str(config))
    with ControlClient(daemon.socket, timeout=5) as control:
        control.ping()
        daemon.wait_log(r"idle and unregistered")
        assert control.status()["version"] == 1


def test_the_control_client_raises_a_refusal_as_a_kiwi_error(daemon: DaemonProcess) -> None:
    with ControlClient(daemon.socket) as control:
        with pytest.raises(KiwiError) as refused:
            control.request(p.ACQUIRE)  # a control connection has not registered
        assert refused.value.code == p.E_STATE
        control.ping()  # and the connection stays usable


def test_every_client_reads_a_status_document_longer_than_any_request(
        daemon: DaemonProcess) -> None:
    labels = {f"label-{i:02}": "v" * 200 for i in range(limits.MAX_LABELS)}
    clients = [Client(daemon.socket, name=f"labelled-{i}", labels=labels) for i in range(6)]
    try:
        for client in clients:
            wait_on_client(client, lambda c=client: c.connected, what="the labelled client")
        with ControlClient(daemon.socket) as control:
            document = control.status()
        assert len(json.dumps(document)) > p.MAX_REQUEST_BYTES
        assert len(clients[0].status()["clients"]) == 6
        kiwictl = subprocess.run([sys.executable, "-m", "nodeside.ctl", "--socket",
                                  daemon.socket, "status", "--json"],
                                 capture_output=True, text=True, timeout=60)
        assert kiwictl.returncode == 0, kiwictl.stderr
        assert len(json.loads(kiwictl.stdout)["clients"]) == 6
    finally:
        for client in clients:
            client.close()


KIWICTL_THREADS = """
import sys, threading
started = []
_start = threading.Thread.start
def start(self):
    started.append(self.name)
    _start(self)
threading.Thread.start = start
from nodeside.ctl import main
code = main(sys.argv[1:])
print(started, file=sys.stderr)
raise SystemExit(code)
"""


def test_kiwictl_starts_no_connection_thread(daemon: DaemonProcess) -> None:
    result = subprocess.run([sys.executable, "-c", KIWICTL_THREADS, "--socket", daemon.socket,
                             "-T", "3"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[INFO] Successfully set the Kiwi scheduler's TQ to 3 seconds.\n"
    assert result.stderr.strip() == "[]"


def test_the_clients_are_made_of_parts_not_chains_of_base_classes() -> None:
    # httpcore's shape: the client holds a connection object, which holds what lends its
    # socket; no class of the package is built on another of the package's classes.
    import inspect
    import pkgutil

    import nodeside.client as package

    derived = []
    for info in pkgutil.iter_modules(package.__path__, f"{package.__name__}."):
        module = __import__(info.name, fromlist=["_"])
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__:
                continue
            derived += [f"{name}({base.__name__})" for base in cls.__bases__
                        if base.__module__.startswith(package.__name__)]
    assert derived == []
