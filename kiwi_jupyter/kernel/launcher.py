"""The Kiwi kernel: ``python -m kiwi_jupyter.kernel -f CONNECTION_FILE``.

An ordinary IPython kernel (ipykernel's ``IPKernelApp``) with two differences: the Kiwi extension
is always loaded, and the CUDA shim is preloaded when it can work.

Why preloading means re-executing
---------------------------------
The shim intercepts the CUDA driver API. The dynamic loader honours ``LD_PRELOAD`` only when a
process starts, and CUDA arrives later (``import torch`` dlopens libcuda), so the shim must be in
the process image from its first instruction; setting ``LD_PRELOAD`` in ``os.environ`` of a
running process does nothing for that process. So the launcher decides first, before importing
ipykernel, zmq or anything that could load CUDA, and if the shim is wanted and not yet loaded it
``execve``s the same interpreter with the same arguments and ``LD_PRELOAD`` set. Properties this
relies on:

- ``execve`` keeps the pid, so the kernel manager that spawned us still signals (interrupt) and
  reaps (shutdown) the right process;
- nothing has opened the connection file's ports or any socket yet, so nothing leaks across;
- after the exec the shim's path is in ``LD_PRELOAD``, which is the loop guard: the second run
  sees it and starts the kernel;
- the cost is one more interpreter start (tens of milliseconds), paid only where a GPU exists.

The preload is skipped, and the kernel starts at once, when ``KIWI_SHIM=0``, when the shim is not
built, or when no CUDA driver can be loaded (no GPU: nothing to intercept). Processes the kernel
starts (``!python train.py``) inherit ``LD_PRELOAD`` and so are arbitrated too, each as a client
of its own under the kernel's name.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
from pathlib import Path

from kiwi_jupyter.kernel.identity import (
    KERNEL_ID_ENV,
    connection_file_from_argv,
    kernel_id_from_connection_file,
)

SHIM_ENV = "KIWI_SHIM"
#: The driver library the shim wraps; if it cannot be loaded there is no GPU to arbitrate.
CUDA_DRIVER = "libcuda.so.1"


def shim_library() -> Path | None:
    """The built shim library, found without importing (and so loading) it."""
    spec = importlib.util.find_spec("kiwi_jupyter.shim")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        built = sorted(Path(folder).glob("*.so"))
        if built:
            return built[0]
    return None


def cuda_driver_present() -> bool:
    try:
        ctypes.CDLL(CUDA_DRIVER)
    except OSError:
        return False
    return True


def preload_plan(environ: dict[str, str]) -> Path | None:
    """The shim to preload by re-executing, or None to start the kernel as we are."""
    if environ.get(SHIM_ENV, "1") == "0":
        return None
    library = shim_library()
    if library is None:
        return None
    if str(library) in environ.get("LD_PRELOAD", "").replace(":", " ").split():
        return None  # already preloaded: this is the second run
    if not cuda_driver_present():
        return None
    return library


def _reexec_with(library: Path, environ: dict[str, str]) -> None:
    env = dict(environ)
    env["LD_PRELOAD"] = " ".join(filter(None, [str(library), environ.get("LD_PRELOAD", "")]))
    # orig_argv keeps interpreter options (-X, -W) that sys.argv has lost.
    os.execve(sys.executable, list(sys.orig_argv), env)


def _name_this_kernel(argv: list[str]) -> None:
    # Everything this kernel starts, the shim included, registers under the kernel's id.
    connection_file = connection_file_from_argv(argv)
    kernel_id = kernel_id_from_connection_file(connection_file) if connection_file else None
    if kernel_id:
        os.environ[KERNEL_ID_ENV] = kernel_id
        os.environ["KIWI_CLIENT_NAME"] = kernel_id


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    _name_this_kernel(argv)
    library = preload_plan(dict(os.environ))
    if library is not None:
        _reexec_with(library, dict(os.environ))  # does not return

    # As ipykernel_launcher does: the notebook's folder must not shadow the kernel's own
    # modules while they load; IPython puts it back on sys.path for user code.
    if sys.path and (sys.path[0] == "" or Path(sys.path[0]) == Path.cwd()):
        del sys.path[0]

    from kiwi_jupyter.kernel.app import KiwiKernelApp

    KiwiKernelApp.launch_instance(argv=argv)
