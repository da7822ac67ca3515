"""The daemon killed and restarted under a live kernel: no kernel dies, no cell hangs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kernel_support import (
    HOLDERS_NOW,
    Execution,
    Holder,
    KernelUnderTest,
    entry,
    holders,
)
from support import DaemonProcess, wait_for_status


@pytest.fixture
def daemon_back(module_daemon: DaemonProcess, kernel: KernelUnderTest) -> Iterator[None]:
    """Whatever a test did to the daemon, the next one finds it running with the kernel."""
    yield
    if module_daemon.process is None or module_daemon.process.poll() is not None:
        module_daemon.start()
    registered(module_daemon, kernel)


@pytest.fixture
def fail_closed(kernel: KernelUnderTest) -> Iterator[None]:
    kernel.run("%config KiwiKernelConfig.failure_policy = 'fail_closed'")
    yield
    kernel.run("%config KiwiKernelConfig.failure_policy = 'fail_open'")
    kernel.run("%config KiwiKernelConfig.unreachable_timeout = 30.0")


def registered(daemon: DaemonProcess, kernel: KernelUnderTest) -> None:
    wait_for_status(daemon.socket, lambda doc: entry(doc, kernel.kernel_id) is not None,
                    timeout=15, what="the kernel to register with the daemon")


# Waits until the kernel's own client has noticed that the daemon went away (it takes the GPU
# as lost then), so the cell does not end before the kernel could know.
NOTICED_THE_LOSS = ("from kiwi_jupyter.kernel import extension as _ke; "
                    "_ke._loaded.link.client.drop_requested.wait(60)")


def displayed(cell: Execution) -> list[str]:
    """The text of every display and display update of a cell, in order."""
    return [m["content"]["data"]["text/plain"]
            for m in cell.of_type("display_data", "update_display_data")]


def waiting_for_the_scheduler(cell: Execution, daemon: DaemonProcess) -> list[str]:
    """The lines saying the cell waits for the scheduler. A daemon killed just before the cell
    may not be noticed yet: the cell asks for the GPU, and its GPU waiting line can come first."""
    return [line for line in displayed(cell)
            if line.startswith(f"kiwi: waiting for the scheduler at {daemon.socket}")]


def test_fail_open_runs_the_cell_with_one_warning_line(
        kernel: KernelUnderTest, module_daemon: DaemonProcess, daemon_back: None) -> None:
    module_daemon.kill()

    cell = kernel.run("1 + 1")

    assert cell.value == 2
    assert len(cell.stderr.splitlines()) == 1
    assert f"the Kiwi scheduler at {module_daemon.socket} is unreachable" in cell.stderr
    assert cell.stderr.rstrip().endswith("this cell runs without GPU arbitration (fail_open)")
    assert kernel.manager.is_alive()


def test_after_a_restart_the_kernel_registers_again_and_cells_are_arbitrated(
        kernel: KernelUnderTest, module_daemon: DaemonProcess, daemon_back: None) -> None:
    module_daemon.restart()
    registered(module_daemon, kernel)

    cell = kernel.run(HOLDERS_NOW)

    assert cell.value == [kernel.kernel_id]
    assert cell.stderr == ""


def test_a_cell_holding_the_gpu_when_the_daemon_dies_finishes_and_says_so(
        kernel: KernelUnderTest, module_daemon: DaemonProcess, daemon_back: None) -> None:
    with Holder(module_daemon.directory) as hold:
        running = kernel.submit(f"print('running', flush=True); {hold.code}; "
                                f"{NOTICED_THE_LOSS}; 'finished'")
        # The cell's own code, not the daemon's view: the kernel must have seen its grant.
        hold.started()
        assert holders(module_daemon.socket) == [kernel.kernel_id]

        module_daemon.kill()
    cell = kernel.collect(running)

    assert cell.value == "finished"
    assert cell.stdout == ("running\nkiwi: the connection to the scheduler was lost during "
                           "this cell, and the GPU with it\n")


def test_fail_closed_fails_the_cell_after_the_timeout_without_running_it(
        kernel: KernelUnderTest, module_daemon: DaemonProcess, fail_closed: None,
        daemon_back: None) -> None:
    kernel.run("%config KiwiKernelConfig.unreachable_timeout = 1.0")
    module_daemon.kill()

    cell = kernel.run("ran = True")

    assert cell.ename == "SchedulerUnavailable"
    assert "gave up after 1 s (fail_closed)" in cell.reply["evalue"]
    assert waiting_for_the_scheduler(cell, module_daemon)
    assert displayed(cell)[-1] == ""
    module_daemon.start()
    registered(module_daemon, kernel)
    assert kernel.run("'ran' in globals()").value is False


def test_fail_closed_shows_the_waiting_line_even_when_the_timeout_is_already_spent(
        kernel: KernelUnderTest, module_daemon: DaemonProcess, fail_closed: None,
        daemon_back: None) -> None:
    # What a loaded machine does to a short timeout: noticing the daemon is gone takes it all.
    kernel.run("%config KiwiKernelConfig.unreachable_timeout = 0.0")
    module_daemon.kill()

    cell = kernel.run("ran = True")

    assert cell.ename == "SchedulerUnavailable"
    lines = waiting_for_the_scheduler(cell, module_daemon)
    assert lines, "the cell failed without saying what it waited for"
    assert lines[0].endswith("the cell fails in 0 s")
    assert displayed(cell)[-1] == ""


def test_fail_closed_waits_for_a_restarting_daemon_then_runs_the_cell(
        kernel: KernelUnderTest, module_daemon: DaemonProcess, fail_closed: None,
        daemon_back: None) -> None:
    module_daemon.kill()
    waiting = kernel.submit(HOLDERS_NOW)
    kernel.wait_seen(waiting, "display_data")  # the waiting line

    module_daemon.start()
    cell = kernel.collect(waiting)

    assert cell.status == "ok"
    assert cell.value == [kernel.kernel_id]
