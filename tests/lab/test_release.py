"""Release engineering as pyproject.toml and .github/workflows/release.yml describe it: which
wheels cibuildwheel makes, that the release builds them from the sdist, and what a build from
source says when it cannot build the panel."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the project's floor is 3.10
    import tomli as tomllib
from test_sdist_install import REPO, path_without_node

WORKFLOW = REPO / ".github" / "workflows" / "release.yml"
#: What requires-python (>=3.10) allows and the release builds, one wheel each.
CPYTHONS = ["cp310", "cp311", "cp312", "cp313", "cp314"]


def test_cibuildwheel_makes_one_manylinux_wheel_per_supported_cpython() -> None:
    cibuildwheel = shutil.which("cibuildwheel", path=os.path.dirname(sys.executable))
    if cibuildwheel is None:
        pytest.skip("cibuildwheel is not installed (pip install -e '.[test]')")
    done = subprocess.run(
        [cibuildwheel, "--print-build-identifiers", "--platform", "linux", "--archs", "x86_64",
         str(REPO)], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [f"{cp}-manylinux_x86_64" for cp in CPYTHONS]


def test_the_release_builds_its_wheels_from_its_sdist_and_publishes_only_tags() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    jobs = workflow["jobs"]
    assert jobs["wheels"]["needs"] == "sdist"
    [build] = [s for s in jobs["wheels"]["steps"] if s.get("uses", "").startswith(
        "pypa/cibuildwheel@")]
    assert build["with"]["package-dir"] == "${{ steps.sdist.outputs.path }}"
    assert set(jobs["publish"]["needs"]) == {"sdist", "wheels"}
    assert "refs/tags/v" in jobs["publish"]["if"]
    assert jobs["publish"]["permissions"] == {"id-token": "write"}


def test_the_workflow_is_one_github_accepts() -> None:
    """The dry run of the release where no container engine runs: the workflow against GitHub's
    own schema of workflows (shipped in check-jsonschema), and cibuildwheel's config above."""
    checker = shutil.which("check-jsonschema", path=os.path.dirname(sys.executable))
    if checker is None:
        pytest.skip("check-jsonschema is not installed (pip install -e '.[test]')")
    done = subprocess.run([checker, "--builtin-schema", "vendor.github-workflows", str(WORKFLOW)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_tag_attaches_the_sdist_and_the_manylinux_2_28_wheels_to_its_github_release() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    jobs = workflow["jobs"]
    release = jobs["github-release"]
    assert set(release["needs"]) == {"sdist", "wheels"}
    assert "refs/tags/v" in release["if"]
    assert release["permissions"] == {"contents": "write"}
    [create] = [s for s in release["steps"] if "gh release create" in s.get("run", "")]
    assert "dist/*.tar.gz" in create["run"] and "dist/*.whl" in create["run"]
    checks = [s for s in jobs["wheels"]["steps"] if "manylinux_2_28" in s.get("run", "")]
    assert checks, "nothing checks the wheels' tag"
    linux = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["cibuildwheel"]["linux"]
    assert linux["manylinux-x86_64-image"] == linux["manylinux-aarch64-image"] == "manylinux_2_28"


def test_pypi_is_published_to_only_once_the_repository_says_so() -> None:
    publish = yaml.safe_load(WORKFLOW.read_text())["jobs"]["publish"]
    assert "vars.PUBLISH_TO_PYPI == 'true'" in publish["if"]


@pytest.mark.slow
def test_without_npm_a_build_from_a_clone_stops_with_one_line(tmp_path: Path) -> None:
    """A clone has no built panel: without npm the build says so in one line, no traceback."""
    clone = tmp_path / "clone"
    listed = subprocess.run(["git", "ls-files", "-z"], capture_output=True, cwd=REPO, check=True)
    for name in listed.stdout.decode().split("\0"):
        if name and (REPO / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, clone / name)
    env = {**os.environ, "PATH": path_without_node(tmp_path / "bin"),
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
         str(tmp_path / "wheels"), str(clone)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    said = [line for line in output.splitlines() if line.strip().startswith("kiwi-jupyter:")]
    assert len(said) == 1 and "npm is not on PATH" in said[0], output
    assert "Traceback" not in output, output
    assert not re.search(r"Could not find cmd \(npm\)", output), output
