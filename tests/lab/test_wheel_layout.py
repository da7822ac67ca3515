"""What the wheel carries: the product's packages only, and shared data whose every file has one
source, so repeated editable installs keep working.

After `make labextension` the venv's labextensions/kiwi-jupyter is a link to the built panel's
folder, so an editable install writes the panel's shared data through that link into the folder
itself. A second shared-data entry aimed inside a folder entry's target would come back in the
next build as the same wheel path twice, and hatchling refuses that build.
"""

from __future__ import annotations

import sys
from pathlib import PurePosixPath

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from test_sdist_install import REPO


def shared_data() -> dict[str, str]:
    with open(REPO / "pyproject.toml", "rb") as f:
        config = tomllib.load(f)
    return config["tool"]["hatch"]["build"]["targets"]["wheel"]["shared-data"]


def test_no_shared_data_entry_lands_inside_another_entrys_folder() -> None:
    entries = shared_data()
    folders = {target for source, target in entries.items() if (REPO / source).is_dir()
               or not PurePosixPath(source).suffix}
    for source, target in entries.items():
        for folder in folders - {target}:
            assert not PurePosixPath(target).is_relative_to(folder), \
                f"{source} -> {target} lands inside the folder entry {folder}"



def test_the_wheel_carries_the_products_packages_and_no_benchmark_or_simulator() -> None:
    """benchmarks/ and the fleet simulator in it run from a clone: the wheel installs only
    ``nodeside`` and ``kiwi_jupyter`` (it once installed a top-level ``benchmarks`` too). The
    files are the ones hatchling itself selects for the wheel; its build hooks add only the
    compiled shim and core (tests/lab/test_sdist_install.py looks inside a built wheel)."""
    from hatchling.builders.wheel import WheelBuilder

    files = {included.distribution_path
             for included in WheelBuilder(str(REPO)).recurse_included_files()}
    assert "nodeside/scheduler/core.py" in files and "kiwi_jupyter/__init__.py" in files
    assert {PurePosixPath(path).parts[0] for path in files} == {"nodeside", "kiwi_jupyter"}
    simulator = {f"nodeside/scheduler/{name}.py" for name in ("replay", "spans", "switching")}
    assert not files & simulator
    # What the tests drive ships (decision 0012); the fleet simulator built on it does not.
    assert {"nodeside/testing/replay.py", "nodeside/testing/node.py"} <= files
    # The shim's sources ship (a stale library is rebuilt from them), the tests' C never.
    assert not [path for path in files if PurePosixPath(path).name == "conformance.c"]
