"""Who this kernel is to the scheduler: its Jupyter kernel id.

The panel finds a notebook's kernel in the status document by name, so a kernel registers under
the id Jupyter gave it. Jupyter names a kernel's connection file ``kernel-<kernel id>.json``; that
file name is the one place the id reaches the kernel process.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

#: Set by the Kiwi launcher for the kernel and everything it starts (the CUDA shim included), so
#: every client of one kernel registers under one name.
KERNEL_ID_ENV = "KIWI_KERNEL_ID"

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
