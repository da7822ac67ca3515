"""Fixtures for the shim's tests: the built shim, a fake libcuda, shimmed workloads."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from shim_harness import Workload, build_fake_cuda
from support import DaemonProcess

from kiwi_jupyter.shim import library_path


@pytest.fixture(scope="session")
def shim_library() -> Path:
    return library_path()


@pytest.fixture(scope="session")
def fake_cuda(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fake_cuda(tmp_path_factory.mktemp("fakecuda"))


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


@pytest.fixture
def scheduler(start_daemon) -> DaemonProcess:
    """The real daemon: a short quantum, one logical 8 GiB GPU, and a long grace, so a holder
    that a test controls is never revoked behind its back."""
    return start_daemon("--tq", "0.05", "--gpus", "1", "--gpu-memory", "8GiB", "--grace", "30")
