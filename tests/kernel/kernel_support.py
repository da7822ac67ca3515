"""Real Kiwi kernels for the tests: started through jupyter_client, driven message by message.

A kernel is started the way Jupyter starts it, with a connection file named
``kernel-<id>.json``, so it registers with the daemon under that id as it would in JupyterLab.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_client.blocking import BlockingKernelClient
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from support import DaemonProcess, scaled, short_tmpdir

from nodeside.client import Client

Message = dict[str, Any]


@dataclass
class Execution:
    """One execute request: its iopub messages in order, and its reply."""

    code: str
    messages: list[Message] = field(default_factory=list)
    reply: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> str:
        return self.reply.get("status", "?")

    @property
    def ename(self) -> str | None:
        return self.reply.get("ename")

    def of_type(self, *msg_types: str) -> list[Message]:
        return [m for m in self.messages if m["header"]["msg_type"] in msg_types]

    def stream(self, name: str) -> str:
        return "".join(m["content"]["text"] for m in self.of_type("stream")
                       if m["content"]["name"] == name)

    @property
    def stdout(self) -> str:
        return self.stream("stdout")

    @property
    def stderr(self) -> str:
        return self.stream("stderr")

    @property
    def result(self) -> dict[str, Any]:
        results = self.of_type("execute_result")
        return results[-1]["content"]["data"] if results else {}

    @property
    def value(self) -> Any:
        """The cell's result, for cells whose last expression is a Python literal."""
        import ast

        return ast.literal_eval(self.result["text/plain"])


class KernelUnderTest:
    def __init__(self, manager: KernelManager, client: BlockingKernelClient, kernel_id: str):
        self.manager = manager
        self.client = client
        self.kernel_id = kernel_id
        self._iopub: dict[str, list[Message]] = defaultdict(list)
        self._idle: set[str] = set()
        self._replies: dict[str, Message] = {}

    @property
    def pid(self) -> int:
        return self.manager.provisioner.process.pid  # type: ignore[union-attr]

    def submit(self, code: str, *, silent: bool = False) -> str:
        return self.client.execute(code, silent=silent, store_history=not silent)

    def _pump(self, timeout: float) -> None:
        """Read one iopub message (if one comes within timeout) into the per-request lists."""
        try:
            message = self.client.get_iopub_msg(timeout=timeout)
        except queue.Empty:
            return
        parent = message["parent_header"].get("msg_id")
        if message["header"]["msg_type"] == "status":
            if message["content"]["execution_state"] == "idle":
                self._idle.add(parent)
            return
        self._iopub[parent].append(message)

    def collect(self, msg_id: str, code: str = "", timeout: float = 30.0) -> Execution:
        """Every iopub message of one request until the kernel is idle again, and its reply
        (``timeout``: a quiet machine's figure, stretched by the load factor)."""
        timeout = scaled(timeout)
        deadline = time.monotonic() + timeout
        while msg_id not in self._idle:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no idle status for {code!r} after {timeout:.0f} s; "
                                     f"got {self._iopub.get(msg_id)}")
            self._pump(min(left, 1.0))
        while msg_id not in self._replies:
            reply = self.client.get_shell_msg(timeout=max(deadline - time.monotonic(), 1.0))
            self._replies[reply["parent_header"].get("msg_id")] = reply
        return Execution(code, self._iopub.pop(msg_id, []), self._replies.pop(msg_id)["content"])

    def run(self, code: str, *, timeout: float = 30.0, silent: bool = False) -> Execution:
        return self.collect(self.submit(code, silent=silent), code, timeout)

    def seen(self, msg_id: str, msg_type: str) -> list[Message]:
        """The messages of a type that a request still running has published so far."""
        self._pump(0.05)
        return [m for m in self._iopub.get(msg_id, []) if m["header"]["msg_type"] == msg_type]

    def wait_seen(self, msg_id: str, msg_type: str, count: int = 1,
                  timeout: float = 30.0) -> list[Message]:
        """The messages of a type that a request still running has published, once there are
        ``count``: read from iopub as they come (``timeout``: a quiet machine's figure,
        stretched by the load factor). Fails at once if the request ends with fewer."""
        timeout = scaled(timeout)
        deadline = time.monotonic() + timeout
        while True:
            seen = [m for m in self._iopub.get(msg_id, []) if m["header"]["msg_type"] == msg_type]
            if len(seen) >= count:
                return seen
            left = deadline - time.monotonic()
            if msg_id in self._idle or left <= 0:
                raise AssertionError(f"{len(seen)} of {count} {msg_type} messages "
                                     + ("before the request ended" if msg_id in self._idle
                                        else f"after {timeout:.0f} s"))
            self._pump(min(left, 1.0))

    def interrupt(self) -> None:
        self.manager.interrupt_kernel()

    def shutdown(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


class Holder:
    """GPU work in a cell that lasts until the test ends it: the cell connects to a Unix socket
    the test listens on and reads until the test closes its end. The test knows when the cell's
    own code runs (``started``: past the gate, so the GPU is the kernel's) and says when it ends
    (``release``), so no check depends on a sleep outlasting it on a busy machine. An interrupt
    ends the read with KeyboardInterrupt, as it would end GPU work."""

    def __init__(self, directory: Path) -> None:
        self.path = str(directory / f"hold-{uuid.uuid4().hex[:8]}.sock")
        self._listening = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listening.bind(self.path)
        self._listening.listen(1)
        self._cell: socket.socket | None = None

    @property
    def code(self) -> str:
        """The statements that hold, on one line (to join others with ``;``)."""
        return (f"import socket as _hs; _h = _hs.socket(_hs.AF_UNIX); _h.connect({self.path!r}); "
                "_h.recv(1); _h.close()")

    def started(self, timeout: float = 30.0) -> None:
        """Wait until the cell's holding code runs (``timeout``: a quiet machine's figure,
        stretched by the load factor)."""
        if self._cell is None:
            self._listening.settimeout(scaled(timeout))
            try:
                self._cell, _ = self._listening.accept()
            except TimeoutError:
                raise AssertionError(f"the holding cell did not start in {scaled(timeout):.0f} s"
                                     ) from None

    def release(self) -> None:
        """End the hold: the cell goes on past it. A hold that never started is refused (the
        cell fails there, if it ever gets so far), so no kernel is left stuck in it."""
        if self._cell is not None:
            self._cell.close()
        self._listening.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def __enter__(self) -> Holder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def kernel_env(socket_path: str, **extra: str) -> dict[str, str]:
    env = {**os.environ, "KIWI_SOCKET": socket_path, "KIWI_SHIM": "0",
           "JUPYTER_PLATFORM_DIRS": "1", "PYDEVD_DISABLE_FILE_VALIDATION": "1"}
    for name in ("KIWI_POOL", "KIWI_PRIORITY", "KIWI_CLIENT_NAME", "KIWI_KERNEL_ID",
                 "KIWI_DISPLAY_NAME", "JPY_SESSION_NAME"):
        env.pop(name, None)
    env.update(extra)
    return env


def start_kernels(directory: Path, socket_path: str, count: int = 1, *,
                  kernel_name: str = "kiwi", kernel_dirs: list[str] | None = None,
                  gate_cells: str | None = "all", **extra_env: str) -> list[KernelUnderTest]:
    """Kernels from a kernelspec (the installed ``kiwi`` by default), named like Jupyter's.

    All are launched before any is waited for, so their start-ups overlap. The tests' cells
    stand in for GPU work with sleeps on the CPU, so in eager mode every cell waits for the GPU
    (``gate_cells='all'``); None leaves the kernel's default, which waits only for cells that
    may touch the GPU (kiwi_jupyter/kernel/gpu_cells.py).
    """
    arguments = [] if gate_cells is None else [f"--KiwiKernelConfig.gate_cells={gate_cells}"]
    specs = KernelSpecManager(kernel_dirs=kernel_dirs) if kernel_dirs else KernelSpecManager()
    started = []
    for _ in range(count):
        kernel_id = str(uuid.uuid4())
        manager = KernelManager(kernel_name=kernel_name, kernel_spec_manager=specs,
                                connection_file=str(directory / f"kernel-{kernel_id}.json"))
        manager.start_kernel(env=kernel_env(socket_path, **extra_env),
                             extra_arguments=arguments)
        started.append((manager, kernel_id))
    kernels = []
    try:
        for manager, kernel_id in started:
            client = manager.client()
            client.start_channels()
            kernels.append(KernelUnderTest(manager, client, kernel_id))
            client.wait_for_ready(timeout=scaled(60))
    except BaseException:
        for manager, _ in started:
            manager.shutdown_kernel(now=True)
        raise
    return kernels


def running_daemon(directory: Path, *args: str) -> Iterator[DaemonProcess]:
    """A fixture's body: ``kiwi-scheduler`` started in ``directory`` for as long as it is used."""
    daemon = DaemonProcess(directory, *args).start()
    yield daemon
    daemon.cleanup()


def one_kernel(daemon: DaemonProcess) -> Iterator[KernelUnderTest]:
    """A fixture's body: one Kiwi kernel on ``daemon`` for as long as it is used."""
    (kernel,) = start_kernels(daemon.directory, daemon.socket)
    yield kernel
    kernel.shutdown()


def scheduler_status(socket_path: str) -> dict[str, Any]:
    """The status document, read by a control-only client as kiwictl would."""
    with Client(socket_path, register=False, reconnect_timeout=scaled(5)) as control:
        return control.status()


def entry(document: dict[str, Any], name: str) -> dict[str, Any] | None:
    """A client's row in the status document, by the name it registered under."""
    return next((c for c in document["clients"] if c["name"] == name), None)


def holders(socket_path: str) -> list[str]:
    document = scheduler_status(socket_path)
    names = {c["id"]: c["name"] for c in document["clients"]}
    return [names.get(h, h) for h in document["gpus"][0]["holders"]]


def state_of(socket_path: str, name: str) -> str | None:
    row = entry(scheduler_status(socket_path), name)
    return None if row is None else row["state"]


# The names of the clients holding the GPU, asked from inside a cell while it runs.
HOLDERS_NOW = ("_s = get_ipython().run_line_magic('kiwi', 'status --json'); "
               "[c['name'] for c in _s['clients'] if c['id'] in _s['gpus'][0]['holders']]")


# A real IPython shell with Kiwi's extension that becomes ``nobody`` before it connects (the
# daemon treats it as any other user: no admin, and the access policy's default rule).
_NOBODY_SHELL = """
import os
from traitlets.config import Config
from IPython.core.interactiveshell import InteractiveShell
import json, stack_data, kiwi_jupyter.kernel.extension, kiwi_jupyter.kernel.magics
config = Config()
config.HistoryManager.enabled = False
shell = InteractiveShell.instance(config=config)
shell.run_cell("pass")  # imports what running a cell needs while files are still readable
os.setgid(65534)
os.setuid(65534)
shell.extension_manager.load_extension("kiwi_jupyter")
"""


def run_as_nobody(config: str, code: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``code`` run by that shell (as ``shell``) against a daemon of its own with ``config``;
    needs root, to become ``nobody``."""
    directory = short_tmpdir()
    directory.chmod(0o755)
    (directory / "kiwi.yaml").write_text(config)
    daemon = DaemonProcess(directory, "--config", str(directory / "kiwi.yaml")).start()
    try:
        return subprocess.run([sys.executable, "-c", _NOBODY_SHELL + code], capture_output=True,
                              text=True, timeout=timeout, env=kernel_env(daemon.socket))
    finally:
        daemon.cleanup()
