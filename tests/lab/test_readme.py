"""README tells a newcomer the truth: its quick start is the two commands, and what it says a
newcomer can install today matches the project (its version, the release's wheel tag, whether a
version was tagged)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the project's floor is 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_the_quick_start_is_two_commands_lab_and_test() -> None:
    start = README.index("## Quick start")
    commands = re.findall(r"^    (\S.*?)\s+#", README[start:], re.M)[:2]
    assert commands == ["make lab", "make test"]


def test_every_wheel_it_names_is_of_this_version() -> None:
    version = PROJECT["project"]["version"]
    named = set(re.findall(r"kiwi_jupyter-([\d.]+)-", README))
    assert named == {version}


def test_the_release_wheel_tag_it_promises_is_the_one_the_release_builds() -> None:
    image = PROJECT["tool"]["cibuildwheel"]["linux"]["manylinux-x86_64-image"]
    assert re.search(rf"-cp3\d+-cp3\d+-{image}_x86_64\.whl", README)


def test_it_says_whether_a_version_was_tagged() -> None:
    tags = subprocess.run(["git", "tag", "--list", "v*"], capture_output=True, text=True,
                          cwd=REPO, check=True).stdout.split()
    says_none = "No version has been tagged yet" in README
    assert says_none == (not tags), f"README says none is tagged, but there are: {tags}"
