"""A process that has loaded the fake driver (built as KIWI_TEST_SANITIZE says) and evaluates
the tests' expressions through vmm_calls.py; the fake's own tests drive it (conftest.py's
``start_fake``)."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from shim_harness import SANITIZER_REPORT
from support import scaled

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


class FakeProcess:
    """A process that has loaded the fake driver and evaluates the test's expressions."""

    def __init__(self, library: Path, env: dict[str, str]) -> None:
        environment = {k: v for k, v in os.environ.items()
                       if not k.startswith(("FAKE_CUDA_", "KIWI_"))}
        environment.update({"PYTHONPATH": os.pathsep.join([str(HERE), str(REPO)]), **env})
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / "vmm_calls.py"), str(library)], env=environment,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.replies: queue.Queue[dict[str, Any]] = queue.Queue()
        self.stderr: list[str] = []
        self._next = 0
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        self._reply(0, 30.0)  # loaded

    @property
    def pid(self) -> int:
        return self.process.pid

    def _read(self) -> None:
        assert self.process.stdout
        for line in self.process.stdout:
            self.replies.put(json.loads(line))

    def _read_stderr(self) -> None:
        assert self.process.stderr
        for line in self.process.stderr:
            self.stderr.append(line)

    def _reply(self, request: int, timeout: float) -> Any:
        try:
            reply = self.replies.get(timeout=scaled(timeout))
        except queue.Empty:
            raise AssertionError(f"no answer to request {request}:\n"
                                 + "".join(self.stderr)) from None
        assert reply["id"] == request
        if "error" in reply:
            raise AssertionError(f"{reply['error']}\n" + "".join(self.stderr))
        return reply["result"]

    def call(self, expr: str, timeout: float = 10.0) -> Any:
        self._next += 1
        assert self.process.stdin
        self.process.stdin.write(json.dumps({"id": self._next, "expr": expr}) + "\n")
        self.process.stdin.flush()
        return self._reply(self._next, timeout)

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin
            self.process.stdin.close()
            try:
                self.process.wait(scaled(10))
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def sanitizer_report(self) -> str:
        text = "".join(self.stderr)
        return text if SANITIZER_REPORT.search(text) else ""
