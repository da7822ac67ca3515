"""Wheel build hook: compiles the CUDA shim (kiwi_jupyter/shim/*.c) into the wheel.

Runs for ``pip install .``, ``python -m build`` and editable installs (``pip install -e .``):
the library is written next to its sources, where kiwi_jupyter.shim.library_path() looks
first. The flags live in kiwi_jupyter/shim/build.py, loaded here by path because the package
itself is not importable while it is being built.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


def _shim_build_module() -> Any:
    path = Path(__file__).parent / "kiwi_jupyter" / "shim" / "build.py"
    spec = importlib.util.spec_from_file_location("_kiwi_shim_build", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class ShimBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        build = _shim_build_module()
        library = Path(self.root) / "kiwi_jupyter" / "shim" / build.LIBRARY_NAME
        build.compile_library(library)
        if version == "editable":
            return  # the editable install imports from the source tree, where it now is
        relative = f"kiwi_jupyter/shim/{build.LIBRARY_NAME}"
        stamp = relative + build.STAMP_SUFFIX
        build_data["force_include"][str(library)] = relative
        build_data["force_include"][str(library) + build.STAMP_SUFFIX] = stamp
        # A compiled library makes the wheel platform-specific.
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
