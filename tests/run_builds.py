"""Test artefacts (the sanitized shim, the fake driver, the conformance build) built once a run
and shared by pytest-xdist's workers: whichever worker asks first builds while the others wait
on a lock, instead of each compiling its own at the same time (conftest.py's ``build_once``)."""

from __future__ import annotations

import fcntl
import shutil
from collections.abc import Callable
from pathlib import Path

#: build_once(name, build): what ``build(directory)`` made in a fresh directory, a path in it.
BuildOnce = Callable[[str, Callable[[Path], Path]], Path]


def builder(shared: Path) -> BuildOnce:
    """``build_once`` over ``shared``, a directory every worker of the run sees."""

    def once(name: str, build: Callable[[Path], Path]) -> Path:
        directory = shared / f"built-{name}"
        made = directory / ".made"  # the path build returned, relative: the build finished
        with open(shared / f"built-{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if made.is_file():
                return directory / made.read_text()
            shutil.rmtree(directory, ignore_errors=True)  # what a failed build left
            directory.mkdir()
            built = build(directory)
            made.write_text(str(built.relative_to(directory)))
            return built

    return once
