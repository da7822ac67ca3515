"""A real `jupyter lab` for browser tests and benchmarks: started as a process on a free port,
with its own settings, runtime and root directories, and the Kiwi extension as installed.

Kernels it starts are driven from the test with jupyter_client through their connection files,
as a second frontend: the browser sees their state change like a user's notebook would.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from jupyter_client import BlockingKernelClient

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]
#: Where browser tests leave their screenshots (gitignored).
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


FAKE_NVML = Path(__file__).with_name("fake_nvml.c")


def build_fake_nvml(folder: Path) -> Path:
    """Compile fake_nvml.c as ``folder/libnvidia-ml.so.1``; returns ``folder`` (for
    LD_LIBRARY_PATH). Only processes started with it there see the stand-in."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-Wl,-soname,libnvidia-ml.so.1",
                    "-o", str(folder / "libnvidia-ml.so.1"), str(FAKE_NVML)], check=True)
    return folder


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def empty_notebook() -> dict[str, Any]:
    return {
        "cells": [{"cell_type": "code", "execution_count": None, "id": "c1", "metadata": {},
                   "outputs": [], "source": ""}],
        "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                    "name": "python3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }


class LabServer:
    """`jupyter lab` with Kiwi; ``kiwi_args`` are extra ``--KiwiExtension.x=`` options."""

    def __init__(self, *kiwi_args: str, notebooks: tuple[str, ...] = ("a.ipynb", "b.ipynb"),
                 panel_settings: dict[str, Any] | None = None, fake_nvml: bool = False,
                 env: dict[str, str] | None = None):
        self.home = Path(tempfile.mkdtemp(prefix="kiwi-lab-", dir="/tmp"))
        #: More environment for the server (and so its kernels, terminals and scheduler).
        self.env = dict(env or {})
        if fake_nvml:  # the server and its scheduler see one GPU through a stand-in NVML
            self.env["LD_LIBRARY_PATH"] = str(build_fake_nvml(self.home / "nvml"))
        if panel_settings:  # the user's settings of the panel's plugin, as Settings would save
            plugin = self.home / "settings" / "kiwi-jupyter" / "plugin.jupyterlab-settings"
            plugin.parent.mkdir(parents=True)
            plugin.write_text(json.dumps(panel_settings))
        self.root = self.home / "root"
        self.runtime = self.home / "runtime"
        self.root.mkdir()
        for name in notebooks:
            (self.root / name).write_text(json.dumps(empty_notebook()))
        self.port = free_port()
        self.token = "kiwi-test-token"
        self.base = f"http://127.0.0.1:{self.port}"
        self.kiwi_args = list(kiwi_args)
        self.log_path = self.home / "lab.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 90.0) -> LabServer:
        env = {
            **os.environ,
            "JUPYTER_RUNTIME_DIR": str(self.runtime),
            "JUPYTERLAB_SETTINGS_DIR": str(self.home / "settings"),
            "JUPYTERLAB_WORKSPACES_DIR": str(self.home / "workspaces"),
            "PYTHONUNBUFFERED": "1",
            **self.env,
        }
        # Nothing answers here, so the server starts its embedded scheduler unless told not to.
        env["KIWI_SOCKET"] = str(self.home / "no-daemon.sock")
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root",
             f"--port={self.port}", "--ServerApp.ip=127.0.0.1",
             f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={self.root}",
             "--LabApp.news_url=", "--LabApp.check_for_updates_class="
             "jupyterlab.NeverCheckForUpdate", *self.kiwi_args],
            stdout=log, stderr=log, env=env, cwd=self.root,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"jupyter lab exited at start:\n{self.log()}")
            try:
                self.api("GET", "api/status")
                return self
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"jupyter lab did not answer:\n{self.log()}") from None
                time.sleep(0.2)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def url(self, path: str) -> str:
        return f"{self.base}/{path}?token={self.token}"

    def api(self, method: str, path: str, body: Any = None) -> Any:
        request = urllib.request.Request(
            f"{self.base}/{path}", method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"token {self.token}"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - localhost
            text = response.read()
        return json.loads(text) if text else None

    def kiwi_status(self) -> dict[str, Any]:
        return self.api("GET", "kiwi/api/status")

    def start_session(self, path: str, kernel: str = "python3") -> str:
        """A kernel for notebook ``path`` started through the REST API; its kernel id."""
        session = self.api("POST", "api/sessions", {
            "path": path, "name": path, "type": "notebook", "kernel": {"name": kernel}})
        return str(session["kernel"]["id"])

    def kernel_of(self, path: str) -> str | None:
        for session in self.api("GET", "api/sessions"):
            if session["path"] == path and session.get("kernel"):
                return str(session["kernel"]["id"])
        return None

    def kernel_client(self, kernel_id: str, timeout: float = 60.0) -> BlockingKernelClient:
        connection = self.runtime / f"kernel-{kernel_id}.json"
        deadline = time.monotonic() + timeout
        while not connection.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"no connection file for kernel {kernel_id}")
            time.sleep(0.1)
        client = BlockingKernelClient(connection_file=str(connection))
        client.load_connection_file()
        # The heartbeat declares a kernel dead after 1 s without an answer, which a loaded
        # 2-core machine exceeds at a kernel's start ("Kernel died before replying").
        client.hb_channel.time_to_dead = 10.0
        client.start_channels()
        client.wait_for_ready(timeout=timeout)
        return client

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.home, ignore_errors=True)


def run_cell(client: BlockingKernelClient, code: str, timeout: float = 60.0) -> None:
    """Run ``code`` in the kernel; fail with the kernel's traceback if it raises."""
    reply = client.execute_interactive(code, timeout=timeout, output_hook=lambda _msg: None)
    content = reply["content"]
    if content["status"] != "ok":
        raise AssertionError(f"cell failed: {content.get('ename')}: {content.get('evalue')}")


def hold_gpu_code(kernel_id: str, wait: bool) -> str:
    """A cell that registers as the kernel does (name = kernel id) and asks for the GPU. With
    ``wait`` false the request waits on a thread, so the cell ends while the kernel queues."""
    acquire = "kiwi.acquire(timeout=120)" if wait else (
        "import threading\n"
        "threading.Thread(target=kiwi.acquire, kwargs={'timeout': 120}, daemon=True).start()")
    return f"from nodeside.client import Client\nkiwi = Client(name={kernel_id!r})\n{acquire}\n"
