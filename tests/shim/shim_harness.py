"""Test-side helpers: build the fake libcuda, start shimmed workloads, read the fake's log."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from support import scaled

from kiwi_jupyter.shim.build import SANITIZERS, BuildError, sanitizer_runtime

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

#: The sanitizer's runtime, when the shim under test is a sanitized build (conftest,
#: ``KIWI_TEST_SANITIZE=address|thread``); None for the shim as shipped.
SANITIZER_RUNTIME: str | None = None
#: What a sanitizer writes to stderr when it finds an error, or the shim's own checks in a
#: sanitized build when they find one (KIWI_CHECKED: client/hold.c, a move the table forbids).
SANITIZER_REPORT = re.compile(r"ERROR: AddressSanitizer|runtime error:|WARNING: ThreadSanitizer"
                              r"|warning: BUG: ")
#: Every error fatal, and reported. Python's own allocations outlive it by design: leaks are
#: not what is looked for. A forked child starts a comm thread of its own, by design, which
#: ThreadSanitizer refuses unless told (die_after_fork).
SANITIZER_OPTIONS = {"ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1",
                     "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
                     "TSAN_OPTIONS": "halt_on_error=1:second_deadlock_stack=1:die_after_fork=0"}


def requested_sanitizer() -> tuple[str, str] | None:
    """The sanitizer KIWI_TEST_SANITIZE asks for (address or thread) and its runtime, to preload;
    None when it asks for none. Skips the test where that build is impossible here."""
    sanitize = os.environ.get("KIWI_TEST_SANITIZE")
    if not sanitize:
        return None
    if sanitize not in SANITIZERS:
        raise pytest.UsageError(f"KIWI_TEST_SANITIZE is one of {', '.join(SANITIZERS)}")
    try:
        return sanitize, sanitizer_runtime(sanitize)
    except BuildError as exc:
        pytest.skip(f"no {sanitize} sanitizer build: {exc}")


def preload(shim: Path) -> dict[str, str]:
    """The environment that preloads the shim under test: after the sanitizer's runtime, which
    must come first, when it is a sanitized build."""
    if SANITIZER_RUNTIME is None:
        return {"LD_PRELOAD": str(shim)}
    return {"LD_PRELOAD": f"{SANITIZER_RUNTIME}:{shim}", **SANITIZER_OPTIONS}


#: workload.py's unasked first line: it has started, with the shim loaded and attached.
READY_ID = 0
#: How long a quiet machine takes at most to start the workload's interpreter and load the
#: shim; kept apart from each call's own deadline (stretched by the load factor, like both).
STARTUP_TIMEOUT = 30.0


def build_fake_cuda(directory: Path, sanitize: str | None = None) -> Path:
    """Compile tests/shim/fake_cuda.c into directory/libcuda.so.1; ``sanitize``: under one of
    the shim's SANITIZERS (the fake's own tests check its memory model so)."""
    from kiwi_jupyter.shim.build import SANITIZE_FLAGS, SANITIZERS

    output = directory / "libcuda.so.1"
    flags = [*SANITIZERS[sanitize][0], *SANITIZE_FLAGS] if sanitize else []
    subprocess.run(
        ["gcc", "-std=c11", "-O1", "-fPIC", "-shared", "-fvisibility=hidden", "-Wall", "-Werror",
         *flags,
         # -Bsymbolic: like the real driver, it hands out its own functions, not the shim's
         "-Wl,-soname,libcuda.so.1", "-Wl,-Bsymbolic", "-o", str(output),
         str(HERE / "fake_cuda.c"), "-lpthread"],
        check=True, capture_output=True, text=True)
    (directory / "libcuda.so").symlink_to(output.name)  # what -lcuda links against
    return output


#: A program linked against libcuda.so.1, as CuPy's driver module is: no dlsym, no
#: cuGetProcAddress, only the dynamic linker's binding.
DIRECT_PROGRAM = r"""
#include <stdio.h>
typedef unsigned long long CUdeviceptr;
int cuMemAlloc_v2(CUdeviceptr *dptr, size_t size);
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shared, void *stream, void **params, void **extra);
int main(void)
{
    CUdeviceptr ptr = 0;
    int allocated = cuMemAlloc_v2(&ptr, 4096);
    int launched = cuLaunchKernel((void *)1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0);
    printf("%d %d\n", allocated, launched);
    return 0;
}
"""


def build_direct_program(directory: Path, fake_cuda: Path) -> Path:
    source = directory / "direct.c"
    source.write_text(DIRECT_PROGRAM)
    program = directory / "direct"
    subprocess.run(["gcc", "-o", str(program), str(source), f"-L{fake_cuda.parent}", "-lcuda",
                    f"-Wl,-rpath,{fake_cuda.parent}"], check=True, capture_output=True, text=True)
    return program


class CudaLog:
    """The fake libcuda's record of calls: one line per call, in order."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def lines(self) -> list[str]:
        try:
            return self.path.read_text().splitlines()
        except FileNotFoundError:
            return []

    def calls(self, name: str) -> list[str]:
        return [line for line in self.lines() if line.split(" ", 1)[0] == name]

    def names(self) -> list[str]:
        return [line.split(" ", 1)[0] for line in self.lines()]

    def clear(self) -> None:
        self.path.write_text("")


class Pending:
    def __init__(self, workload: Workload, request_id: int) -> None:
        self.workload = workload
        self.id = request_id

    def done(self) -> bool:
        return self.id in self.workload.replies

    def result(self, timeout: float = 10.0) -> Any:
        return self.workload.wait_reply(self.id, timeout)


class Workload:
    """A Python process with the shim preloaded, driving the fake libcuda (workload.py)."""

    def __init__(self, shim: Path, fake_cuda: Path, log: Path, env: dict[str, str]) -> None:
        self.log = CudaLog(log)
        environment = {k: v for k, v in os.environ.items() if not k.startswith("KIWI_")}
        environment.update({
            **preload(shim),
            "FAKE_CUDA_LOG": str(log),
            "PYTHONPATH": os.pathsep.join([str(HERE), str(REPO)]),
            "PYTHONUNBUFFERED": "1",
            "KIWI_IDLE_RELEASE": "0",
            # The fake driver has the checkpoint API, so auto would depend on the daemon's
            # driver; tests of the checkpoint evictor ask for it by name.
            "KIWI_EVICT": "managed",
        })
        environment.update(env)
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / "workload.py"), str(fake_cuda)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=environment)
        self.replies: dict[int, dict[str, Any]] = {}
        #: Told of each reply, and of the workload's stdout closing (it ended): waiters wake
        #: on those, not on a poll.
        self._arrived = threading.Condition()
        self._ended = False
        self._next_id = 0
        self.stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout
        for line in self.process.stdout:
            reply = json.loads(line)
            with self._arrived:
                self.replies[reply["id"]] = reply
                self._arrived.notify_all()
        with self._arrived:
            self._ended = True
            self._arrived.notify_all()

    def _wait_for_reply(self, request_id: int, timeout: float, what: str) -> None:
        """Until the reply to request_id came or the workload ended; fails after timeout (a
        quiet machine's figure, stretched by the load factor)."""
        with self._arrived:
            if not self._arrived.wait_for(lambda: request_id in self.replies or self._ended,
                                          timeout=scaled(timeout)):
                raise AssertionError(f"timed out after {scaled(timeout):.1f} s waiting for "
                                     f"{what}")

    def _read_stderr(self) -> None:
        assert self.process.stderr
        for line in self.process.stderr:
            with self._arrived:
                self.stderr.append(line)
                self._arrived.notify_all()

    def said(self, words: str, timeout: float = 10.0) -> list[str]:
        """The lines of its stderr with words in them, once there is one (stderr is read on a
        thread of its own: a line written before a reply may be read after it)."""
        def lines() -> list[str]:
            return [line for line in self.stderr if words in line]
        with self._arrived:
            if not self._arrived.wait_for(lambda: lines() or self._ended, scaled(timeout)):
                raise AssertionError(f"no line with {words!r} on the workload's stderr:\n"
                                     + "".join(self.stderr))
            return lines()

    def _send(self, expr: str, background: bool) -> int:
        self._next_id += 1
        assert self.process.stdin
        self.process.stdin.write(json.dumps(
            {"id": self._next_id, "expr": expr, "background": background}) + "\n")
        self.process.stdin.flush()
        return self._next_id

    def _died(self, when: str) -> AssertionError:
        code = self.process.wait(timeout=scaled(10))  # its stdout closed: it is ending
        return AssertionError(f"the workload died{' ' if when else ''}{when} ({code}):\n"
                              + "".join(self.stderr))

    def wait_started(self) -> None:
        """Wait for the workload to start: a first call's deadline must not include it."""
        self._wait_for_reply(READY_ID, STARTUP_TIMEOUT, "the workload to start")
        if READY_ID not in self.replies:
            raise self._died("at start")

    def wait_reply(self, request_id: int, timeout: float) -> Any:
        self.wait_started()
        self._wait_for_reply(request_id, timeout, f"the workload to answer request {request_id}")
        if request_id not in self.replies:
            raise self._died("")
        reply = self.replies[request_id]
        if "error" in reply:
            raise AssertionError(f"the workload raised {reply['error']}\n" + "".join(self.stderr))
        return reply["result"]

    def call(self, expr: str, timeout: float = 10.0) -> Any:
        return self.wait_reply(self._send(expr, False), timeout)

    def start(self, expr: str) -> Pending:
        """Evaluate expr on a thread of the workload's own; the Pending tells when it ends."""
        return Pending(self, self._send(expr, True))

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = self.call("shim.stats()")
        return result

    def sanitizer_reports(self) -> str:
        """What a sanitizer said in this workload's stderr, if anything."""
        text = "".join(self.stderr)
        return text if SANITIZER_REPORT.search(text) else ""

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin
            self.process.stdin.close()
            try:
                self.process.wait(scaled(5))
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
