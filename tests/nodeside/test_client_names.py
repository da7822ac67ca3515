"""A client's display name and user reach the status document and kiwictl's report: people
see notebooks and users, the key stays the name. Real daemons on real sockets."""

from __future__ import annotations

import getpass
import json
import subprocess
import sys

from support import DaemonProcess, wait_on_client

from nodeside import limits
from nodeside.client import Client
from nodeside.names import ELLIPSIS


def row(observer: Client, client: Client) -> dict:
    return next(c for c in observer.status()["clients"] if c["id"] == client.id)


def test_a_client_registers_its_display_name_and_keeps_its_name_as_the_key(
        daemon: DaemonProcess) -> None:
    with Client(daemon.socket, name="3f2a9c1e-0b7d-4e55-9a61-5d2f7c8e9a01",
                display_name="~/team/forecast.ipynb") as client:
        wait_on_client(client, lambda: client.connected, what="the registration")
        entry = row(client, client)
    assert entry["name"] == "3f2a9c1e-0b7d-4e55-9a61-5d2f7c8e9a01"
    assert entry["display_name"] == "~/team/forecast.ipynb"
    assert entry["user"] == getpass.getuser()


def test_a_display_name_over_the_bound_is_cut_with_an_ellipsis_not_refused(
        daemon: DaemonProcess) -> None:
    long_path = "/srv/" + "/".join(f"folder-{i:03}" for i in range(60)) + "/notebook.ipynb"
    with Client(daemon.socket, name="long", display_name=long_path) as client:
        client.acquire(timeout=5)
        shown = row(client, client)["display_name"]
    assert len(shown.encode()) <= limits.MAX_NAME_BYTES
    assert shown.startswith(ELLIPSIS) and shown.endswith("/notebook.ipynb")


def test_kiwictl_status_names_clients_by_display_name_and_user(daemon: DaemonProcess) -> None:
    with Client(daemon.socket, name="3f2a9c1e-0b7d-4e55-9a61-5d2f7c8e9a01",
                display_name="~/team/forecast.ipynb") as holder, \
            Client(daemon.socket, name="afd00fc2-b218-4c1e-9f3a-0123456789ab") as bare:
        holder.acquire(timeout=5)
        wait_on_client(bare, lambda: bare.connected, what="the second client")
        out = subprocess.run([sys.executable, "-m", "nodeside.ctl", "--socket", daemon.socket,
                              "status"], capture_output=True, text=True, timeout=60).stdout
    # kiwictl's viewer is this user: its own clients need no "(user)" (nodeside.names.label).
    user = getpass.getuser()
    assert "holding: ~/team/forecast.ipynb (" in out and f"forecast.ipynb ({user})" not in out
    assert "kernel afd00fc2 " in out  # a kernel with no notebook: its id's first group
    assert "3f2a9c1e-0b7d" not in out


def test_kiwictl_status_shows_a_long_notebook_path_as_its_folder_and_name_and_json_whole(
        daemon: DaemonProcess) -> None:
    notebook = "/home/jovyan/work/projects/deep-learning/experiments/train.ipynb"
    with Client(daemon.socket, name="3f2a9c1e-0b7d-4e55-9a61-5d2f7c8e9a01",
                display_name=notebook) as holder:
        holder.acquire(timeout=5)
        ctl = [sys.executable, "-m", "nodeside.ctl", "--socket", daemon.socket, "status"]
        text = subprocess.run(ctl, capture_output=True, text=True, timeout=60).stdout
        document = json.loads(subprocess.run([*ctl, "--json"], capture_output=True, text=True,
                                             timeout=60).stdout)
    assert "holding: …/experiments/train.ipynb (" in text
    assert "jovyan" not in text
    assert [c["display_name"] for c in document["clients"]] == [notebook]


def test_a_client_takes_its_display_name_from_the_environment(
        daemon: DaemonProcess, monkeypatch) -> None:
    # What a process a Kiwi kernel starts (`!python train.py`) inherits from the launcher.
    monkeypatch.setenv("KIWI_DISPLAY_NAME", "~/runs/train.ipynb")
    with Client(daemon.socket, name="child") as client:
        wait_on_client(client, lambda: client.connected, what="the registration")
        assert row(client, client)["display_name"] == "~/runs/train.ipynb"
