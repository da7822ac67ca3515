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
- after the exec the shim is loaded, which is the loop guard: the second run finds it and starts
  the kernel;
- the cost is one more interpreter start (tens of milliseconds), paid only where a GPU exists.

The preload is skipped, and the kernel starts at once, when ``KIWI_SHIM=0``, when a Kiwi shim is
preloaded already (in a pod the device plugin puts its own copy in ``LD_PRELOAD``, at another
path and maybe another version: two shims would each register and queue behind each other),
when the shim is not built, or when no CUDA driver can be loaded (no GPU: nothing to
intercept; ``KIWI_SHIM=1`` preloads anyway). Processes the kernel starts (``!python train.py``)
inherit ``LD_PRELOAD`` and so are arbitrated too, each as a client of its own under the kernel's
name.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from kiwi_jupyter.kernel.identity import (
    DISPLAY_NAME_ENV,
    KERNEL_ID_ENV,
    connection_file_from_argv,
    display_name,
    kernel_id_from_connection_file,
)

#: ``0``: never preload the shim; ``1``: preload it even where no CUDA driver is found (a driver
#: mounted after start, or a test); unset: preload when the shim is built and a driver loads.
SHIM_ENV = "KIWI_SHIM"
#: A shim library to use instead of the one built into the package.
SHIM_LIBRARY_ENV = "KIWI_SHIM_LIBRARY"
#: The driver library the shim wraps; if it cannot be loaded there is no GPU to arbitrate.
CUDA_DRIVER = "libcuda.so.1"
#: A symbol every Kiwi shim exports (shim/api.c): found in this process, a shim is loaded here,
#: whatever its path or version.
SHIM_SYMBOL = "kiwi_shim_active"
#: How Kiwi shims are named, ours (libkiwishim.so) and the device plugin's (libkiwi.so), for an
#: ``LD_PRELOAD`` entry that is not loaded in this process (yet).
_SHIM_FILE = re.compile(r"^libkiwi(shim)?(-[\w.]+)?\.so(\.[\d.]+)?$")


def shim_library() -> Path | None:
    """The shim built for the installed sources; never builds it (that is install time's job).

    ``kiwi_jupyter.shim`` only locates the library here; nothing is loaded before the exec.
    """
    try:
        from kiwi_jupyter.shim import library_path
    except ImportError:
        return None  # a package without the shim's glue: nothing to preload
    try:
        return Path(library_path(build=False))
    except OSError:  # FileNotFoundError: not built for these sources
        return None


def cuda_driver_present() -> bool:
    try:
        ctypes.CDLL(CUDA_DRIVER)
    except OSError:
        return False
    return True


def shim_in_process() -> bool:
    """Whether a Kiwi shim is loaded in this process (LD_PRELOAD took effect at its start)."""
    try:
        getattr(ctypes.CDLL(None), SHIM_SYMBOL)
    except AttributeError:
        return False
    return True


def preloaded_shim(environ: Mapping[str, str], library: Path | None = None) -> str | None:
    """The Kiwi shim already in ``LD_PRELOAD`` (or loaded here), or None. ``library``: ours,
    which counts whatever its file is called."""
    entries = environ.get("LD_PRELOAD", "").replace(":", " ").split()
    for entry in entries:
        if _SHIM_FILE.match(Path(entry).name) or (library is not None and entry == str(library)):
            return entry
    if entries and shim_in_process():
        return "a library in LD_PRELOAD"
    return None


def preload_plan(environ: Mapping[str, str]) -> Path | None:
    """The shim to preload by re-executing, or None to start the kernel as we are."""
    setting = environ.get(SHIM_ENV, "")
    if setting == "0":
        return None
    chosen = environ.get(SHIM_LIBRARY_ENV)
    library = Path(chosen).resolve() if chosen else shim_library()
    if library is None or not library.is_file():
        if setting == "1":
            print(f"kiwi: {SHIM_ENV}=1 but no shim library was found "
                  f"({chosen or 'not built'}); starting without it", file=sys.stderr)
        return None
    if preloaded_shim(environ, library) is not None:
        return None  # ours after the re-exec, or one the device plugin preloaded: not a second
    if setting != "1" and not cuda_driver_present():
        return None
    return library


#: PyTorch's allocator settings; PyTorch 2.9 reads the first, older ones the second.
ALLOC_CONF_ENVS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


def without_expandable_segments(conf: str) -> str:
    """PyTorch allocator settings (``key:value,...``) with expandable segments off."""
    options = [o for o in conf.split(",") if o.strip()]
    kept = [o for o in options if o.split(":", 1)[0].strip() != "expandable_segments"]
    if len(kept) == len(options):
        return conf
    return ",".join([*kept, "expandable_segments:False"])


def _alloc_conf_for_the_shim(env: dict[str, str]) -> None:
    for name in ALLOC_CONF_ENVS:
        conf = env.get(name, "")
        if "expandable_segments:true" not in conf.replace(" ", "").lower():
            continue
        env[name] = without_expandable_segments(conf)
        print(f"kiwi: {name}: expandable_segments turned off: its memory (cuMemCreate) cannot "
              "be paged to host memory, so this kernel could not give the GPU's memory back",
              file=sys.stderr)


def _reexec_with(library: Path, environ: Mapping[str, str]) -> None:
    env = dict(environ)
    env["LD_PRELOAD"] = " ".join(filter(None, [str(library), environ.get("LD_PRELOAD", "")]))
    _alloc_conf_for_the_shim(env)
    # orig_argv keeps interpreter options (-X, -W) that sys.argv has lost.
    os.execve(sys.executable, list(sys.orig_argv), env)


def _name_this_kernel(argv: list[str]) -> None:
    # Everything this kernel starts, the shim included, registers under the kernel's id, and
    # shows its notebook to people.
    connection_file = connection_file_from_argv(argv)
    kernel_id = kernel_id_from_connection_file(connection_file) if connection_file else None
    if kernel_id:
        os.environ[KERNEL_ID_ENV] = kernel_id
        os.environ["KIWI_CLIENT_NAME"] = kernel_id
    notebook = display_name(os.environ)
    if notebook:
        os.environ[DISPLAY_NAME_ENV] = notebook


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    _name_this_kernel(argv)
    library = preload_plan(os.environ)
    if library is not None:
        _reexec_with(library, os.environ)  # does not return

    # As ipykernel_launcher does: the notebook's folder must not shadow the kernel's own
    # modules while they load; IPython puts it back on sys.path for user code.
    if sys.path and (sys.path[0] == "" or Path(sys.path[0]) == Path.cwd()):
        del sys.path[0]

    from kiwi_jupyter.kernel.app import KiwiKernelApp

    KiwiKernelApp.launch_instance(argv=argv)
