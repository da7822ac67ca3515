"""A pip user's install: the sdist carries the built panel, so building and installing it needs
no node, npm or npm registry, and the wheel makes the panel known as the Python package's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from support import scaled

REPO = Path(__file__).resolve().parents[2]
PANEL = REPO / "kiwi_jupyter" / "labextension" / "static" / "style.js"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: What must not be on PATH: node and every package manager that could fetch or build the panel.
NODE_TOOLS = frozenset({"node", "nodejs", "npm", "npx", "yarn", "jlpm", "corepack", "pnpm"})
DATA = "kiwi_jupyter-0.1.0.data/data/share/jupyter/labextensions/kiwi-jupyter"


def path_without_node(folder: Path) -> str:
    """A PATH with every command of this one except node's: links in one folder."""
    folder.mkdir()
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            source = os.path.join(directory, name)
            target = folder / name
            if name in NODE_TOOLS or target.exists() or not os.access(source, os.X_OK):
                continue
            target.symlink_to(source)
    return str(folder)


def run(*command: str | Path, env: dict[str, str], cwd: Path = REPO) -> str:
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=scaled(600))
    assert done.returncode == 0, f"{command} failed:\n{done.stdout}\n{done.stderr}"
    return ANSI.sub("", done.stdout + done.stderr)


@pytest.mark.slow
@pytest.mark.timeout(int(scaled(1200)))
@pytest.mark.skipif(not PANEL.exists(), reason="the panel is not built (make labextension); "
                                               "the sdist is made from the built panel")
def test_the_sdist_installs_with_the_panel_and_no_node_or_npm(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("JUPYTER", "PYTHON", "VIRTUAL_ENV", "npm_", "NODE"))}
    env.update(PATH=path_without_node(tmp_path / "bin"), HOME=str(tmp_path / "home"),
               JUPYTER_PLATFORM_DIRS="1", PIP_DISABLE_PIP_VERSION_CHECK="1")

    # The maintainer's step, with the panel built: the sdist.
    run(sys.executable, "-m", "build", "--sdist", "--no-isolation", "-o", tmp_path / "dist",
        REPO, env={**env, "PATH": os.environ["PATH"]})
    [sdist] = (tmp_path / "dist").glob("kiwi_jupyter-*.tar.gz")

    # pip's step on the user's machine, without node: the sdist's wheel, and what it holds.
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
        tmp_path / "wheels", sdist, env=env, cwd=tmp_path)
    [wheel] = (tmp_path / "wheels").glob("kiwi_jupyter-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        install = json.loads(archive.read(f"{DATA}/install.json"))
    assert f"{DATA}/package.json" in names
    assert not any(n.startswith("benchmarks/") for n in names)  # the product's packages only
    # The compiled scheduler core (nodeside/compiled.py) came with it, never its C sources.
    assert "nodeside/compiled.sha256" in names
    assert any(re.fullmatch(r"nodeside/core__mypyc\..+\.so", n) for n in names), names
    assert not any(n.endswith(".c") and n.startswith("nodeside/") for n in names)
    assert f"{DATA}/static/style.js" in names
    assert install["packageManager"] == "python"
    assert install["packageName"] == "kiwi-jupyter"

    # The user's install into a fresh venv, and what Jupyter then sees.
    fresh = tmp_path / "fresh"
    run(sys.executable, "-m", "venv", fresh, env=env, cwd=tmp_path)
    run(fresh / "bin" / "python", "-m", "pip", "install", "-q", f"{wheel}[lab]", env=env,
        cwd=tmp_path)
    listing = run(fresh / "bin" / "jupyter", "labextension", "list", env=env, cwd=tmp_path)
    assert re.search(r"kiwi-jupyter v0\.1\.0 enabled OK \(python, kiwi-jupyter\)", listing), \
        listing
    servers = run(fresh / "bin" / "jupyter", "server", "extension", "list", env=env,
                  cwd=tmp_path)
    assert re.search(r"kiwi_jupyter \S+ OK", servers), servers
    kernels = run(fresh / "bin" / "jupyter", "kernelspec", "list", env=env, cwd=tmp_path)
    assert re.search(r"^\s*kiwi\s", kernels, re.M), kernels
    version = run(fresh / "bin" / "kiwi-scheduler", "--version", env=env, cwd=tmp_path)
    assert "scheduler core compiled (mypyc)" in version, version
