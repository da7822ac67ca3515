"""Fixtures for the kernel tests: a daemon and real kernels, shared within a module.

Kernel start-up is the slow part (about a second each on a small CI machine), so each module
starts its kernels once and its tests leave them as they found them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kernel_support import KernelUnderTest, one_kernel, running_daemon
from support import DaemonProcess, short_tmpdir


@pytest.fixture(scope="module")
def module_daemon() -> Iterator[DaemonProcess]:
    """``kiwi-scheduler --tq 0.2`` for one test module. The grace is long: a holder that
    overruns its quantum is asked to drop the GPU but never revoked during these tests, so a
    hand-over happens exactly when a cell ends."""
    yield from running_daemon(short_tmpdir(), "--tq", "0.2", "--grace", "60")


@pytest.fixture(scope="module")
def kernel(module_daemon: DaemonProcess) -> Iterator[KernelUnderTest]:
    """One Kiwi kernel for the module's tests (modules that need other kernels define theirs)."""
    yield from one_kernel(module_daemon)
