"""Everything Kiwi runs in the notebook pod: the IPython extension and ``%kiwi`` magics, the CUDA
shim, the Jupyter server extension and the kernel launcher.

This module only wires entry points; each room lives in its own subpackage and is imported when
it is used, so a kernel never imports the server and the server never imports IPython.
"""

from __future__ import annotations

from typing import Any

from nodeside import __version__
from nodeside.client import Client

__all__ = ["Client", "__version__"]


def load_ipython_extension(ipython: Any) -> None:
    from kiwi_jupyter.kernel.extension import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    from kiwi_jupyter.kernel.extension import unload_ipython_extension as unload

    unload(ipython)


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    return [{"module": "kiwi_jupyter.server", "app": _extension_app()}]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "kiwi-jupyter"}]


def _extension_app() -> Any:
    from kiwi_jupyter.server.app import KiwiExtension

    return KiwiExtension
