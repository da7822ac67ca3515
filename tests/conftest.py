from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator

import pytest
from support import DaemonProcess, short_tmpdir


def _gpu_present() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetCount() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any(item.get_closest_marker("gpu") for item in items) and not _gpu_present():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU and its driver (NVML found none)")
        for item in items:
            if item.get_closest_marker("gpu"):
                item.add_marker(skip)


@pytest.fixture
def start_daemon() -> Iterator[Callable[..., DaemonProcess]]:
    """Start ``kiwi-scheduler`` processes with the given flags; all are killed afterwards."""
    started: list[DaemonProcess] = []

    def start(*args: str) -> DaemonProcess:
        daemon = DaemonProcess(short_tmpdir(), *args)
        started.append(daemon)
        return daemon.start()

    yield start
    for daemon in started:
        daemon.cleanup()


@pytest.fixture
def daemon(start_daemon: Callable[..., DaemonProcess]) -> DaemonProcess:
    """One daemon with a short TQ and grace, as most integration tests want."""
    return start_daemon("--tq", "0.2", "--grace", "1")


@pytest.fixture
def scratch() -> Iterator:
    directory = short_tmpdir()
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(autouse=True)
def private_runtime_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator:
    """Each test gets its own ``$XDG_RUNTIME_DIR``: an embedded scheduler publishes its socket
    there for kiwictl, and tests must neither see another's nor leave theirs in the home."""
    directory = short_tmpdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(directory))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)
