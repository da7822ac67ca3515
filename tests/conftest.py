from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator

import pytest
from run_builds import BuildOnce, builder
from support import DaemonProcess, scaled, short_tmpdir


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
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # On several workers the tests marked slow go first, each otherwise in its place: a
        # test of minutes that comes up last keeps one worker busy after the other has run out
        # of tests (the pure core's child run, 3 minutes under load, ended a run alone).
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    stretch_the_timeout(config, items)


def stretch_the_timeout(config: pytest.Config, items: list[pytest.Item]) -> None:
    """pyproject's per-test timeout (pytest-timeout) is a quiet machine's figure: stretched by
    the load factor, as every deadline in the tests is (a test's way-out under ThreadSanitizer
    beside a busy sibling worker outlasted a fixed 120 s). A --timeout or PYTEST_TIMEOUT given
    for the run, and a test's own timeout mark, stand as they are."""
    quiet = config.getini("timeout")
    if not quiet or config.getoption("timeout", None) is not None or \
            os.environ.get("PYTEST_TIMEOUT"):
        return
    limit = pytest.mark.timeout(scaled(float(quiet)))
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(limit)


@pytest.fixture(scope="session")
def build_once(tmp_path_factory: pytest.TempPathFactory) -> BuildOnce:
    """build_once(name, build): a test artefact built once a run (run_builds.py)."""
    own = tmp_path_factory.getbasetemp()
    # A worker's base is <the run's base>/<worker id>: the run's base is shared by its workers.
    return builder(own.parent if os.environ.get("PYTEST_XDIST_WORKER") else own)


#: The daemons a test started, for its failure report.
STARTED_DAEMONS = pytest.StashKey[list[DaemonProcess]]()
#: The lines of each daemon's log a failure report shows (its end: what led to the failure).
LOG_LINES_ON_FAILURE = 150


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """A failed test's report ends with the log of each daemon it started: a run on CI, on a
    clean clone, is read off its output alone, and a deadline missed there says nothing of
    what the daemon decided meanwhile."""
    report = yield
    if report.failed and report.when in ("setup", "call"):
        for daemon in item.stash.get(STARTED_DAEMONS, []):
            lines = daemon.log().splitlines()[-LOG_LINES_ON_FAILURE:]
            report.sections.append((f"daemon log ({daemon.socket}), its last lines",
                                    "\n".join(lines)))
    return report


@pytest.fixture
def start_daemon(request: pytest.FixtureRequest) -> Iterator[Callable[..., DaemonProcess]]:
    """Start ``kiwi-scheduler`` processes with the given flags; all are killed afterwards."""
    started: list[DaemonProcess] = []
    request.node.stash[STARTED_DAEMONS] = started

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
