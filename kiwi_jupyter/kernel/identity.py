"""Who this kernel is to the scheduler: its Jupyter kernel id, and its notebook for people.

The panel finds a notebook's kernel in the status document by name, so a kernel registers under
the id Jupyter gave it. Jupyter names a kernel's connection file ``kernel-<kernel id>.json``; that
file name is the one place the id reaches the kernel process.

People know a kernel by its notebook, not its id. A Jupyter server starts a session's kernel with
``JPY_SESSION_NAME`` set to the notebook's path; the kernel registers that as its display name
(``name`` stays the kernel id, the key).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

#: Set by the Kiwi launcher for the kernel and everything it starts (the CUDA shim included), so
#: every client of one kernel registers under one name.
KERNEL_ID_ENV = "KIWI_KERNEL_ID"
#: What a Jupyter server sets in a session's kernel: the notebook's path (jupyter_server's
#: SessionManager.get_kernel_env).
SESSION_NAME_ENV = "JPY_SESSION_NAME"
#: The display name every client of this kernel registers with (``nodeside.client``'s default).
DISPLAY_NAME_ENV = "KIWI_DISPLAY_NAME"
#: The folder the Jupyter server serves (its root_dir), set by Kiwi's server extension for the
#: kernels it starts: a notebook is named by its path in there, as JupyterLab shows it.
NOTEBOOK_ROOT_ENV = "KIWI_NOTEBOOK_ROOT"

_CONNECTION_FILE = re.compile(r"^kernel-(?P<id>.+)\.json$")


def kernel_id_from_connection_file(path: str | os.PathLike[str]) -> str | None:
    """The kernel id in a connection file's name, or None for a name Jupyter did not make."""
    match = _CONNECTION_FILE.match(Path(path).name)
    return match.group("id") if match else None


def connection_file_from_argv(argv: list[str]) -> str | None:
    """The value of ``-f``/``--f``/``--IPKernelApp.connection_file`` in a kernel command line."""
    flags = ("-f", "--f", "--IPKernelApp.connection_file")
    for i, arg in enumerate(argv):
        if arg in flags and i + 1 < len(argv):
            return argv[i + 1]
        for flag in flags:
            if arg.startswith(flag + "="):
                return arg.split("=", 1)[1]
    return None


def current_kernel_id() -> str | None:
    """This kernel's Jupyter id: from the launcher, else from the running kernel app."""
    if os.environ.get(KERNEL_ID_ENV):
        return os.environ[KERNEL_ID_ENV]
    # Only look at ipykernel if it is already running here: importing it would be slow, and a
    # terminal IPython has no kernel id.
    kernelapp = sys.modules.get("ipykernel.kernelapp")
    if kernelapp is not None and kernelapp.IPKernelApp.initialized():
        return kernel_id_from_connection_file(kernelapp.IPKernelApp.instance().connection_file)
    return None


def client_name() -> str:
    """The name this kernel registers under: its kernel id when Jupyter gave it one."""
    return current_kernel_id() or os.environ.get("KIWI_CLIENT_NAME") or f"ipython-{os.getpid()}"


def notebook_name(environ: Mapping[str, str] = os.environ) -> str | None:
    """The notebook this kernel runs for, as people would write it: its path as JupyterLab
    shows it (in the folder the server serves), so that the panel, ``%kiwi``, kiwictl and the
    daemon's log all name it alike; else a path under the home directory starts with ``~``.
    None when no Jupyter session started this kernel."""
    path = environ.get(SESSION_NAME_ENV)
    if not path:
        return None
    root = environ.get(NOTEBOOK_ROOT_ENV)
    if root and os.path.isabs(path):
        with contextlib.suppress(ValueError):
            return Path(path).relative_to(root).as_posix()
    home = environ.get("HOME") or os.path.expanduser("~")
    if os.path.isabs(path) and home not in ("", "/"):
        with contextlib.suppress(ValueError):
            return "~/" + Path(path).relative_to(home).as_posix()
    return path


def display_name(environ: Mapping[str, str] = os.environ) -> str | None:
    """What this kernel is called for people: the launcher's choice, else its notebook."""
    return environ.get(DISPLAY_NAME_ENV) or notebook_name(environ)
