"""``%kiwi`` and its subcommands in a real kernel, against a real daemon."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from kernel_support import (
    HOLDERS_NOW,
    KernelUnderTest,
    entry,
    holders,
    kernel_env,
    run_as_nobody,
    scheduler_status,
)
from support import DaemonProcess, wait_for_status


@pytest.fixture
def restore_mode(kernel: KernelUnderTest) -> Iterator[None]:
    """Tests that change the kernel's mode put eager back."""
    yield
    kernel.run("%kiwi mode eager")


def test_status_renders_an_html_table_with_this_kernel_marked(kernel: KernelUnderTest) -> None:
    shown = kernel.run("%kiwi status").result
    html = shown["text/html"]
    assert "<table>" in html
    assert "Kiwi scheduler: mode on, TQ 0.2 s" in html
    marked = html.split('title="this kernel"')[1].split("</tr>")[0]
    assert f"kernel {kernel.kernel_id[:8]}" in marked  # a kernel with no notebook: its id


def test_status_is_the_default_subcommand(kernel: KernelUnderTest) -> None:
    assert "text/html" in kernel.run("%kiwi").result


def test_status_renders_text_in_a_terminal(module_daemon: DaemonProcess) -> None:
    terminal = subprocess.run(
        [sys.executable, "-m", "IPython", "--quick", "--no-banner", "--colors=nocolor",
         "--ext=kiwi_jupyter", "-c", "%kiwi status"],
        env=kernel_env(module_daemon.socket, IPYTHONDIR=str(module_daemon.directory / "ipy")),
        capture_output=True, text=True, timeout=60)
    assert "Kiwi scheduler: mode on, TQ 0.2 s" in terminal.stdout
    assert "<- this kernel" in terminal.stdout
    assert "<table>" not in terminal.stdout


def test_status_json_returns_the_status_document(kernel: KernelUnderTest) -> None:
    document = kernel.run("%kiwi status --json").value
    assert document["version"] == 1
    assert entry(document, kernel.kernel_id)["state"] == "idle"


def test_help_documents_every_subcommand(kernel: KernelUnderTest) -> None:
    reply = kernel.run("%kiwi?").reply
    page = reply["payload"][0]["data"]["text/plain"]
    for subcommand in ("status", "acquire", "release", "mode [eager|lazy|off]", "pool NAME",
                       "priority HIGH|NORMAL|LOW", "on | off | auto", "tq SECONDS"):
        assert subcommand in page


def test_help_is_a_subcommand_too(kernel: KernelUnderTest) -> None:
    shown = kernel.run("%kiwi help")
    assert shown.ename is None
    assert "%kiwi tq SECONDS" in shown.stdout and "This kernel uses" in shown.stdout


def test_help_names_the_socket_this_kernel_really_uses(
    kernel: KernelUnderTest, module_daemon: DaemonProcess
) -> None:
    page = kernel.run("%kiwi?").reply["payload"][0]["data"]["text/plain"]
    assert f"This kernel uses {module_daemon.socket} ($KIWI_SOCKET)." in page


def test_an_unknown_subcommand_is_a_usage_error(kernel: KernelUnderTest) -> None:
    failed = kernel.run("%kiwi frobnicate")
    assert failed.ename == "UsageError"
    assert "unknown subcommand" in failed.reply["evalue"]


def test_mode_shows_the_current_mode(kernel: KernelUnderTest) -> None:
    assert kernel.run("%kiwi mode").stdout == "kiwi: this kernel's mode is eager\n"


def test_eager_mode_holds_the_gpu_while_a_cell_runs(kernel: KernelUnderTest) -> None:
    assert kernel.run(HOLDERS_NOW).value == [kernel.kernel_id]


def test_a_cell_that_only_runs_kiwictl_does_not_take_the_gpu(kernel: KernelUnderTest) -> None:
    # Eager, every cell gated (gate_cells 'all'): kiwictl must not see its own notebook holding.
    kiwictl = os.path.join(os.path.dirname(sys.executable), "kiwictl")
    shown = kernel.run(f"!{kiwictl} status --json").stdout
    assert json.loads(shown)["gpus"][0]["holders"] == []


def test_off_mode_leaves_cells_unarbitrated(kernel: KernelUnderTest, restore_mode: None) -> None:
    assert kernel.run("%kiwi mode off").stdout == "kiwi: this kernel's mode is off\n"
    assert kernel.run(HOLDERS_NOW).value == []


def test_the_mode_can_be_set_with_config_too(kernel: KernelUnderTest) -> None:
    try:
        kernel.run("%config KiwiKernelConfig.mode = 'off'")
        assert kernel.run("%kiwi mode").stdout == "kiwi: this kernel's mode is off\n"
        assert kernel.run(HOLDERS_NOW).value == []
    finally:
        kernel.run("%config KiwiKernelConfig.mode = 'eager'")


def test_lazy_mode_without_the_shim_falls_back_to_eager_and_says_why(
        kernel: KernelUnderTest, restore_mode: None) -> None:
    switched = kernel.run("%kiwi mode lazy")
    assert "lazy mode needs the CUDA shim" in switched.stderr
    assert switched.stdout == "kiwi: this kernel's mode is eager\n"
    assert kernel.run(HOLDERS_NOW).value == [kernel.kernel_id]


def test_acquire_by_hand_holds_the_gpu_until_the_cell_ends(
        kernel: KernelUnderTest, module_daemon: DaemonProcess, restore_mode: None) -> None:
    kernel.run("%kiwi mode off")
    cell = kernel.run(f"%kiwi acquire\n{HOLDERS_NOW}")
    assert cell.stdout == "kiwi: this kernel holds the GPU until the end of the cell\n"
    assert cell.value == [kernel.kernel_id]
    assert holders(module_daemon.socket) == []


def test_release_by_hand_gives_the_gpu_back_before_the_cell_ends(
        kernel: KernelUnderTest) -> None:
    cell = kernel.run(f"%kiwi release\n{HOLDERS_NOW}")
    assert cell.stdout == "kiwi: gave the GPU back\n"
    assert cell.value == []


def test_pool_moves_the_kernel_to_any_pool_and_says_so_where_no_pools_are_configured(
        kernel: KernelUnderTest, module_daemon: DaemonProcess) -> None:
    try:
        assert kernel.run("%kiwi pool training").stdout == (
            "kiwi: this kernel is now in pool training (this node configures no pools: the "
            "scheduler takes any name, each a pool with weight 1 and no guarantee)\n")
        row = entry(scheduler_status(module_daemon.socket), kernel.kernel_id)
        assert row["pool"] == "training"
    finally:
        kernel.run("%kiwi pool default")


def test_priority_changes_the_kernels_priority(
        kernel: KernelUnderTest, module_daemon: DaemonProcess) -> None:
    try:
        assert kernel.run("%kiwi priority low").stdout == \
            "kiwi: this kernel's priority is now LOW\n"
        row = entry(scheduler_status(module_daemon.socket), kernel.kernel_id)
        assert row["priority"] == "LOW"
    finally:
        kernel.run("%kiwi priority NORMAL")


@pytest.mark.parametrize("mode", ["off", "auto", "on"])
def test_on_off_auto_switch_the_scheduler(
        kernel: KernelUnderTest, module_daemon: DaemonProcess, mode: str) -> None:
    assert kernel.run(f"%kiwi {mode}").stdout == f"kiwi: turned the scheduler {mode}\n"
    assert scheduler_status(module_daemon.socket)["mode"] == mode
    module_daemon.wait_log(rf"Received SCHED_{mode.upper()} from {kernel.kernel_id}")


def test_tq_sets_the_time_quantum(kernel: KernelUnderTest, module_daemon: DaemonProcess) -> None:
    try:
        assert kernel.run("%kiwi tq 0.5").stdout == \
            "kiwi: the scheduler's TQ is now 0.5 seconds\n"
        assert scheduler_status(module_daemon.socket)["tq"] == 0.5
    finally:
        kernel.run("%kiwi tq 0.2")


def test_tq_needs_a_positive_number(kernel: KernelUnderTest) -> None:
    assert kernel.run("%kiwi tq soon").ename == "UsageError"
    assert kernel.run("%kiwi tq 0").ename == "UsageError"


def test_tq_outside_the_one_range_is_a_usage_error(kernel: KernelUnderTest) -> None:
    for text in ("nan", "inf", "-inf", "1e400", "86401", "0.001"):
        assert kernel.run(f"%kiwi tq {text}").ename == "UsageError", text


# As `nobody` (run_as_nobody): the daemon refuses admin
# requests from anyone but root, its own user and its admin group.
ADMIN_AS_NOBODY = """
shell.run_cell("%kiwi on")
shell.run_cell("%kiwi tq 5")
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")
def test_admin_subcommands_report_a_refusal_in_one_line() -> None:
    shell = run_as_nobody('socket_mode: "0666"\n', ADMIN_AS_NOBODY, 60)
    on, tq = shell.stderr.splitlines()  # one line each, no traceback
    assert on.startswith("kiwi: not allowed to turn the scheduler on: ")
    assert tq.startswith("kiwi: not allowed to set the scheduler's TQ: ")
    assert all("admin group" in line for line in (on, tq))  # the daemon's reason, passed on


def test_unload_ext_leaves_no_hook_and_load_ext_restores_them(
        kernel: KernelUnderTest, module_daemon: DaemonProcess) -> None:
    kernel.run("%unload_ext kiwi_jupyter")
    leftovers = kernel.run(
        "_ip = get_ipython()\n"
        "def _kiwi(x): return type(getattr(x, '__self__', x)).__module__.startswith('kiwi')\n"
        "([e for e, cbs in _ip.events.callbacks.items() for cb in cbs if _kiwi(cb)],"
        " [t for t in _ip.ast_transformers if _kiwi(t)],"
        " 'kiwi' in _ip.magics_manager.magics['line'],"
        " [c for c in _ip.configurables if type(c).__name__ == 'KiwiKernelConfig'])").value
    assert leftovers == ([], [], False, [])
    wait_for_status(module_daemon.socket, lambda doc: entry(doc, kernel.kernel_id) is None,
                    what="the kernel to leave the scheduler")
    assert kernel.run("import time; time.sleep(0.05)").status == "ok"
    assert kernel.run("%kiwi").ename == "UsageError"  # the magic is gone

    kernel.run("%load_ext kiwi_jupyter")
    assert kernel.run(HOLDERS_NOW).value == [kernel.kernel_id]
