"""The Makefile a newcomer meets: `make help`, what `make lab` serves, and targets that install
only what they need."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BINDER = REPO / "binder"
MAKEFILE = (REPO / "Makefile").read_text()


def prerequisites(target: str) -> list[str]:
    found = re.search(rf"^{re.escape(target)}:([^#\n]*)", MAKEFILE, re.M)
    assert found, f"no target {target}"
    return found.group(1).split()


def test_make_help_lists_every_target_with_what_it_does() -> None:
    shown = subprocess.run(["make", "-s", "-C", str(REPO), "help"], capture_output=True,
                           text=True, timeout=30, check=True).stdout
    targets = re.findall(r"^\.PHONY: (.*(?:\\\n.*)*)", MAKEFILE, re.M)[0]
    for target in targets.replace("\\", " ").split():
        assert re.search(rf"^  make {re.escape(target)} +\S", shown, re.M), (target, shown)


def test_help_is_what_a_bare_make_does() -> None:
    first = re.search(r"^([a-z][a-z-]*):", MAKEFILE, re.M)
    assert first is not None and first.group(1) == "help"


def test_lint_bench_and_images_install_only_their_own_extras() -> None:
    assert prerequisites("lint") == ["$(VENV)/.lint-installed"]
    assert "install" not in prerequisites("bench")
    assert "install" not in prerequisites("images")


def test_make_lab_serves_the_demos_folder() -> None:
    makefile = (BINDER.parent / "Makefile").read_text()
    assert re.search(r"^LAB_DIR \?= binder$", makefile, re.M)
    assert re.search(r"^\tjupyter lab .*--ServerApp\.root_dir=\$\(LAB_DIR\)",
                     makefile.replace("$(BIN)/", "").replace("\\\n", " "), re.M)


def test_what_a_newcomer_makes_in_the_lab_stays_out_of_the_sdist(tmp_path: Path) -> None:
    """Notebooks made in `make lab` land in binder/; the sdist (hatchling, which leaves out what
    .gitignore names) takes the demo's own files only."""
    from hatchling.builders.sdist import SdistBuilder

    repo = BINDER.parent
    for name in ("pyproject.toml", ".gitignore", "README.md"):
        shutil.copy(repo / name, tmp_path / name)
    shutil.copytree(BINDER, tmp_path / "binder",
                    ignore=lambda folder, names: [n for n in names if n.startswith(".")])
    tracked = sorted(path.name for path in (tmp_path / "binder").iterdir())
    (tmp_path / "binder" / "Untitled.ipynb").write_text("{}")
    (tmp_path / "binder" / "Untitled Folder").mkdir()
    (tmp_path / "binder" / "Untitled Folder" / "notes.txt").write_text("mine")
    listed = sorted(f.distribution_path for f in SdistBuilder(str(tmp_path))
                    .recurse_included_files() if f.distribution_path.startswith("binder/"))
    assert listed == [f"binder/{name}" for name in tracked]
