"""``kiwictl`` in JupyterLab's own terminal, with no venv activated.

`make lab` runs ``.venv/bin/jupyter lab``: the server runs in the venv, but the venv's bin is not
on PATH, so a terminal opened in the Lab (and ``!kiwictl`` in a notebook) said "command not
found". The extension puts the folder of its Python's commands first on the server's PATH,
which kernels and terminals inherit.

That is not enough for a terminal that starts a login shell: jupyter_server_terminals does so
when the server has no terminal of its own (started by JupyterHub, a service, a test), and the
login profile sets PATH afresh (Debian's /etc/profile does). There the terminal's command
becomes: the same login shell, which reads its profile, puts the folder back in front and then
hands over to an interactive shell. A ``shell_command`` the user configured is left alone.
"""

from __future__ import annotations

import os
import shlex
from typing import Any

#: Shells that take ``-l -c`` and ``-i`` the POSIX way; any other login shell is left as it is.
POSIX_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh"})


def with_on_path(folder: str, path: str) -> str:
    """``path`` with ``folder`` first (once)."""
    rest = [entry for entry in path.split(os.pathsep) if entry and entry != folder]
    return os.pathsep.join([folder, *rest])


def login_shell_keeping(folder: str, command: list[str]) -> list[str] | None:
    """The terminal command that keeps ``folder`` first on PATH after a login shell's profile;
    None when ``command`` is not a login shell of a known kind (nothing to change)."""
    if len(command) != 2 or command[1] != "-l":
        return None
    shell = command[0]
    if os.path.basename(shell) not in POSIX_SHELLS:
        return None
    again = f'PATH={shlex.quote(folder)}:"$PATH"; export PATH; exec {shlex.quote(shell)} -i'
    return [shell, "-l", "-c", again]


def keep_on_terminal_path(manager: Any, folder: str, *, configured: bool) -> None:
    """Make the terminals ``manager`` starts keep ``folder`` on PATH (see the module's text).
    ``manager`` is jupyter_server_terminals' manager, or None where terminals are off."""
    if manager is None or configured:
        return
    command = login_shell_keeping(folder, list(getattr(manager, "shell_command", [])))
    if command is not None:
        manager.shell_command = command
