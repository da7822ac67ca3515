"""Fixtures for the shim's tests: the built shim, a fake libcuda, shimmed workloads."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import shim_harness
from fake_device import FakeCard
from fake_process import FakeProcess
from run_builds import BuildOnce
from shim_harness import SANITIZER_OPTIONS, Workload, build_fake_cuda, requested_sanitizer
from support import DaemonProcess, StatusEvents

from kiwi_jupyter.shim import library_path
from kiwi_jupyter.shim.build import LIBRARY_NAME, compile_library


@pytest.fixture(scope="session")
def shim_library(build_once: BuildOnce) -> Path:
    """The shim as shipped; with KIWI_TEST_SANITIZE=address (AddressSanitizer and
    UndefinedBehaviorSanitizer) or thread (ThreadSanitizer), a build under those (``make test``
    runs these tests all three ways)."""
    wanted = shim_harness.requested_sanitizer()
    if wanted is None:
        return library_path()
    sanitize, runtime = wanted
    library = build_once("sanitized-shim", lambda directory: compile_library(
        directory / LIBRARY_NAME, sanitize=sanitize))
    shim_harness.SANITIZER_RUNTIME = runtime
    return library


@pytest.fixture(scope="session")
def fake_cuda(build_once: BuildOnce) -> Path:
    return build_once("fake-cuda", build_fake_cuda)


WorkloadFactory = Callable[..., Workload]


@pytest.fixture
def workload(shim_library: Path, fake_cuda: Path, tmp_path: Path) -> Iterator[WorkloadFactory]:
    """workload(**env) starts a shimmed process; each gets its own call log."""
    started: list[Workload] = []

    def start(**env: str) -> Workload:
        log = tmp_path / f"cuda-{len(started)}.log"
        w = Workload(shim_library, fake_cuda, log, {k: str(v) for k, v in env.items()})
        started.append(w)
        return w

    yield start
    for w in started:
        w.close()
    reports = [w.sanitizer_reports() for w in started]
    if any(reports):
        pytest.fail("a sanitizer found an error in the shim:\n" + "\n".join(filter(None, reports)))


@pytest.fixture
def card(tmp_path: Path) -> FakeCard:
    """One fake card shared by the processes given its env (FAKE_CUDA_DEVICE), with a row per
    process as NVML has."""
    return FakeCard(tmp_path / "card")


@pytest.fixture
def scheduler(start_daemon) -> DaemonProcess:
    """The real daemon: a short quantum, one logical 8 GiB GPU, and a long grace, so a holder
    that a test controls is never revoked behind its back."""
    return start_daemon("--tq", "0.05", "--gpus", "1", "--gpu-memory", "8GiB", "--grace", "30")


@pytest.fixture
def checkpoint_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the fake driver keeps each process's checkpoint state; the daemon, started after
    this fixture, inherits the variable."""
    directory = tmp_path / "checkpoint"
    directory.mkdir()
    monkeypatch.setenv("FAKE_CUDA_CHECKPOINT_DIR", str(directory))
    return directory


@pytest.fixture
def checkpointing(start_daemon, fake_cuda, checkpoint_dir):
    """A daemon that can checkpoint: the fake driver is its CUDA library."""
    def start(*args: str):
        return start_daemon("--tq", "0.05", "--gpus", "1", "--gpu-memory", "8GiB",
                            "--cuda-library", str(fake_cuda), *args)
    return start


@pytest.fixture(scope="session")
def model_fake(build_once: BuildOnce, fake_cuda: Path) -> tuple[Path, dict[str, str]]:
    """The fake driver, sanitized as KIWI_TEST_SANITIZE says, and what its processes need."""
    wanted = requested_sanitizer()
    if wanted is None:
        return fake_cuda, {}
    sanitize, runtime = wanted
    library = build_once("fake-cuda-sanitized",
                         lambda directory: build_fake_cuda(directory, sanitize))
    return library, {"LD_PRELOAD": runtime, **SANITIZER_OPTIONS}


@pytest.fixture
def start_fake(model_fake: tuple[Path, dict[str, str]]) -> Iterator[Callable[..., FakeProcess]]:
    """start_fake(**env) starts a process over the fake driver; each is closed afterwards, and
    a sanitizer's report in any of them fails the test."""
    library, sanitizer_env = model_fake
    started: list[FakeProcess] = []

    def start(**env: str) -> FakeProcess:
        process = FakeProcess(library, {**sanitizer_env, **{k: str(v) for k, v in env.items()}})
        started.append(process)
        return process

    yield start
    for process in started:
        process.close()
    reports = [p.sanitizer_report() for p in started]
    if any(reports):
        pytest.fail("a sanitizer found an error in the fake driver:\n" + "\n".join(reports))


@pytest.fixture
def watch() -> Iterator[Callable[[DaemonProcess], StatusEvents]]:
    """watch(daemon): a StatusEvents on it (its ``changed`` events, for waits on what the status
    document shows), closed after the test."""
    opened: list[StatusEvents] = []

    def open_on(daemon: DaemonProcess) -> StatusEvents:
        opened.append(StatusEvents(daemon.socket, timeout=30))
        return opened[-1]

    yield open_on
    for events in opened:
        events.close()
