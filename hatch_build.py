"""Build hook: compiles the CUDA shim (kiwi_jupyter/shim/*.c) and the daemon's scheduler core
(mypyc, nodeside/compiled.py) into the wheel, and first checks that the JupyterLab panel can be
had: built already (an sdist carries it), or buildable with npm.

Runs for ``pip install .``, ``python -m build`` and editable installs (``pip install -e .``):
both are written next to their sources, where the shim's library_path() and Python's import
look first. How each is built lives in kiwi_jupyter/shim/build.py and nodeside/compiled.py,
loaded here by path because the packages are not importable while they are being built.

The compiled core is optional: without mypy, setuptools or a C compiler (or with
``KIWI_PURE_PYTHON=1``) the wheel carries the pure Python core only, and says so.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


def _load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it runs
    spec.loader.exec_module(module)
    return module


def _shim_build_module() -> Any:
    return _load("_kiwi_shim_build", Path(__file__).parent / "kiwi_jupyter" / "shim" / "build.py")


def _core_build_module() -> Any:
    return _load("_kiwi_core_build", Path(__file__).parent / "nodeside" / "compiled.py")


def _compiled_core(root: Path) -> list[Path]:
    """The compiled core's files, built in place unless they match the sources already;
    nothing when it cannot (or must not) be built: the pure Python core then runs."""
    core = _core_build_module()
    if core.pure_asked(os.environ):
        print(f"kiwi: {core.PURE_ENV} is set: the wheel carries the pure Python core only")
        return []
    if not core.up_to_date(root):
        try:
            core.build(root)
        except Exception as exc:  # no mypy, no compiler: pure Python still works
            print(f"kiwi: WARNING: the scheduler core was not compiled ({type(exc).__name__}: "
                  f"{exc}); the pure Python core will run")
            return []
    return [path for path in core.built_files(root) if path.exists()]


#: The built panel's file that pyproject.toml's jupyter-builder hook looks for.
PANEL_BUILT = Path("kiwi_jupyter") / "labextension" / "static" / "style.js"

NO_NPM = ("kiwi-jupyter: building from source needs node and npm to build the JupyterLab panel "
          "(labextension/), and npm is not on PATH: install Node.js (https://nodejs.org), or "
          "install a built wheel or the sdist, which carry the panel (README.md, Install)")


def _panel_or_npm(root: Path) -> None:
    """Stop the build with one line when the panel is neither built nor buildable.

    Otherwise hatch-jupyter-builder, which runs next, fails with a traceback that ends in
    "Could not find cmd (npm) in path". SystemExit carries only the message to pip or build.
    """
    if not (root / PANEL_BUILT).exists() and shutil.which("npm") is None:
        raise SystemExit(NO_NPM)


class ShimBuildHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        # An editable install without node still works (no panel): the panel's own hook says so.
        if version != "editable":
            _panel_or_npm(Path(self.root))
        if self.target_name != "wheel":
            return
        build = _shim_build_module()
        library = Path(self.root) / "kiwi_jupyter" / "shim" / build.LIBRARY_NAME
        build.compile_library(library)
        core = _compiled_core(Path(self.root))
        if version == "editable":
            return  # the editable install imports from the source tree, where they now are
        for path in core:
            build_data["force_include"][str(path)] = path.relative_to(self.root).as_posix()
        relative = f"kiwi_jupyter/shim/{build.LIBRARY_NAME}"
        stamp = relative + build.STAMP_SUFFIX
        build_data["force_include"][str(library)] = relative
        build_data["force_include"][str(library) + build.STAMP_SUFFIX] = stamp
        # A compiled library makes the wheel platform-specific.
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
