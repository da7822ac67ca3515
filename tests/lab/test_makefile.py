"""The Makefile a newcomer meets: `make help`, what `make lab` serves, and targets that install
only what they need."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

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


def test_make_images_removes_the_working_containers_its_tests_or_builds_left() -> None:
    recipe = MAKEFILE[MAKEFILE.index("\nimages:"):].split("\n\n", 1)[0]
    assert "tests/images; \\\n\t\tstatus=$$?; images/build.sh --remove-containers; exit $$status" \
        in recipe


@pytest.mark.skipif(shutil.which("buildah") is None or os.getuid() != 0,
                    reason="needs buildah, as root (apt-get install buildah)")
def test_only_the_working_containers_of_kiwis_images_are_removed() -> None:
    def buildah(*args: str) -> str:
        return subprocess.run(["buildah", *args], capture_output=True, text=True, timeout=120,
                              check=True).stdout.strip()

    ours, theirs = "localhost/kiwi-stand-in/leftover-test:1", "localhost/not-kiwi-test:1"
    for image in (ours, theirs):
        buildah("commit", "--quiet", "--rm", buildah("from", "scratch"), image)
    left = buildah("from", "--pull=never", "--quiet", ours)
    kept = buildah("from", "--pull=never", "--quiet", theirs)
    try:
        subprocess.run([str(REPO / "images" / "build.sh"), "--remove-containers"], check=True,
                       timeout=120, cwd=REPO)
        names = buildah("containers", "--format", "{{.ContainerName}}").split()
        assert left not in names and kept in names
    finally:
        subprocess.run(["buildah", "rm", left, kept], capture_output=True, timeout=120)
        subprocess.run(["buildah", "rmi", ours, theirs], capture_output=True, timeout=120)
