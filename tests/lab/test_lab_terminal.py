"""After `make lab`, `kiwictl` works in JupyterLab's own terminal although no venv was
activated: the server puts its Python's commands on the terminal's PATH."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sysconfig

import pytest
from browser.labserver import LabServer
from support import scaled
from tornado.websocket import websocket_connect

from kiwi_jupyter.server.terminals import login_shell_keeping, with_on_path

SCRIPTS = sysconfig.get_path("scripts")


async def terminal_says(lab: LabServer, name: str, command: str, until: re.Pattern[str]) -> str:
    """Type ``command`` into terminal ``name`` and collect what it prints until ``until``
    matches (the terminal echoes the command too: ``until`` must not match that)."""
    url = f"ws://127.0.0.1:{lab.port}/terminals/websocket/{name}?token={lab.token}"
    socket = await websocket_connect(url)
    shown = ""
    try:
        socket.write_message(json.dumps(["stdin", f"{command}\r"]))
        while not until.search(shown):
            message = await asyncio.wait_for(socket.read_message(), scaled(60))
            assert message is not None, f"the terminal closed; it said:\n{shown}"
            kind, *text = json.loads(message)
            if kind == "stdout":
                shown += "".join(text)
    finally:
        socket.close()
    return shown


@pytest.mark.slow
def test_kiwictl_works_in_the_labs_terminal_without_an_activated_venv() -> None:
    # The PATH a user has after `make lab` in a fresh shell: no .venv/bin on it.
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != SCRIPTS)
    # Started with its output to a file, the server gives terminals a login shell, whose
    # profile sets PATH afresh (Debian's /etc/profile does): the harder case.
    lab = LabServer("--KiwiExtension.tq=120", env={"PATH": path, "SHELL": "/bin/bash"}).start()
    try:
        name = lab.api("POST", "api/terminals")["name"]
        shown = asyncio.run(terminal_says(
            lab, name, "command -v kiwictl; kiwictl status; echo KIWI-$?-DONE",
            re.compile(r"KIWI-\d+-DONE")))
    finally:
        lab.stop()
    assert os.path.join(SCRIPTS, "kiwictl") in shown, shown
    assert "command not found" not in shown, shown
    assert "KIWI-0-DONE" in shown, shown  # kiwictl found the server's scheduler and answered


def test_the_folder_goes_first_on_path_once() -> None:
    assert with_on_path("/v/bin", "/usr/bin:/v/bin:/bin") == "/v/bin:/usr/bin:/bin"
    assert with_on_path("/v/bin", "") == "/v/bin"


def test_a_login_shell_puts_the_folder_back_after_its_profile() -> None:
    command = login_shell_keeping("/v/bin", ["/bin/bash", "-l"])
    assert command is not None
    shell, login, flag, script = command
    assert (shell, login, flag) == ("/bin/bash", "-l", "-c")
    assert script.startswith('PATH=/v/bin:"$PATH"; export PATH; exec /bin/bash -i')


def test_a_shell_that_is_not_a_login_shell_or_not_posix_is_left_alone() -> None:
    assert login_shell_keeping("/v/bin", ["/bin/bash"]) is None
    assert login_shell_keeping("/v/bin", ["/usr/bin/fish", "-l"]) is None
