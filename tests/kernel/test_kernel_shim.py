"""The Kiwi kernel with the CUDA shim preloaded, over the shim's fake libcuda (no GPU needed).

Skipped where the shim (kiwi_jupyter.shim, tests/shim/fake_cuda.c) is not in the tree.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kernel_support import Holder, KernelUnderTest, entry, holders, start_kernels, state_of
from support import DaemonProcess, client_state, short_tmpdir, wait_for_status

shim = pytest.importorskip("kiwi_jupyter.shim", reason="the CUDA shim is not in this tree")
FAKE_CUDA = Path(__file__).parents[1] / "shim" / "fake_cuda.c"
pytestmark = pytest.mark.skipif(not FAKE_CUDA.is_file() or shutil.which("gcc") is None,
                                reason="needs tests/shim/fake_cuda.c and gcc")

# Loads the fake driver the way a framework does, and one GPU call that the shim gates.
SETUP = ("import ctypes\n_cu = ctypes.CDLL('libcuda.so.1')\n_cu.cuInit(0)\n"
         "_launch = _cu.cuLaunchKernel\n"
         "_launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3\n")
LAUNCH = "_launch(None, 1, 1, 1, 1, 1, 1, 0, None, None, None)"

#: A cell that waited longer than this ends with a note saying how long
#: (KiwiKernelConfig.waited_note_after).
WAITED_NOTE_AFTER = 1.0


def shim_holds(daemon: DaemonProcess, kernel: KernelUnderTest, holder: Holder) -> None:
    """Once the cell runs past its launch (to the hold), the kernel's shim holds the GPU."""
    holder.started()
    assert holders(daemon.socket) == [kernel.kernel_id]


def wait_waiting(daemon: DaemonProcess, kernel: KernelUnderTest) -> None:
    wait_for_status(daemon.socket, lambda doc: client_state(doc, kernel.kernel_id) == "waiting",
                    what=f"{kernel.kernel_id} to wait in the queue")


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    """A long quantum: hand-overs here happen when a cell ends, not when a quantum does."""
    daemon = DaemonProcess(short_tmpdir(), "--tq", "5", "--grace", "60").start()
    yield daemon
    daemon.cleanup()


@pytest.fixture(scope="module")
def pair(daemon: DaemonProcess) -> Iterator[tuple[KernelUnderTest, KernelUnderTest]]:
    fake = daemon.directory / "fakecuda"
    fake.mkdir()
    subprocess.run(["gcc", "-std=c11", "-O1", "-fPIC", "-shared", "-fvisibility=hidden",
                    "-o", str(fake / "libcuda.so.1"), str(FAKE_CUDA), "-lpthread"],
                   check=True, timeout=120)
    shim.library_path()  # build it now if this tree has not yet
    a, b = start_kernels(daemon.directory, daemon.socket, 2, KIWI_SHIM="",
                         LD_LIBRARY_PATH=str(fake), FAKE_CUDA_LOG=str(fake / "calls.log"))
    for kernel in (a, b):
        assert kernel.run(SETUP).status == "ok"
    yield a, b
    a.shutdown()
    b.shutdown()


def test_the_kiwi_kernel_preloads_the_shim_where_a_driver_loads(
        pair: tuple[KernelUnderTest, KernelUnderTest]) -> None:
    a, _ = pair
    preload = a.run("import os; os.environ['LD_PRELOAD']").value
    assert Path(preload) == Path(shim.library_path(build=False))
    assert a.run("%kiwi mode").stdout == "kiwi: this kernel's mode is lazy\n"


def test_lazy_cells_wait_in_the_shim_with_the_waiting_line(
        pair: tuple[KernelUnderTest, KernelUnderTest], daemon: DaemonProcess) -> None:
    a, b = pair
    with Holder(daemon.directory) as hold:
        first = a.submit(f"import time; {LAUNCH}; {hold.code}; time.time()")
        shim_holds(daemon, a, hold)
        a_held = time.time()
        second = b.submit(f"import time; {LAUNCH}; time.time()")
        wait_waiting(daemon, b)
        b.wait_seen(second, "display_data")
        b_waiting = time.time()
        # A lower bound, not a race: B must wait over a second for its closing note.
        time.sleep(WAITED_NOTE_AFTER + 0.1)
        released = time.time()
    ended, waited = a.collect(first), b.collect(second)

    assert ended.value <= waited.value
    lines = [m["content"]["data"]["text/plain"]
             for m in waited.of_type("display_data", "update_display_data")]
    assert lines[0].startswith("kiwi: waiting for the GPU")
    assert f"held by kernel {a.kernel_id[:8]}" in lines[0]  # no notebook: its id
    assert lines[-1] == ""
    # B waited at least from when its line was up until A let go, and at most from when A held
    # until B's launch returned; the note rounds to a tenth.
    (note,) = re.findall(r"^kiwi: waited (\d+\.\d) s for the GPU$", waited.stdout, re.MULTILINE)
    assert released - b_waiting - 0.05 <= float(note) <= waited.value - a_held + 0.05
    assert holders(daemon.socket) == []


def test_eager_with_the_shim_interrupt_while_waiting_withdraws(
        pair: tuple[KernelUnderTest, KernelUnderTest], daemon: DaemonProcess) -> None:
    a, b = pair
    b.run("%kiwi mode eager")
    try:
        with Holder(daemon.directory) as hold:
            holding = a.submit(f"{LAUNCH}; {hold.code}")
            shim_holds(daemon, a, hold)
            waiting = b.submit("reached = True")
            wait_waiting(daemon, b)

            b.interrupt()

            assert b.collect(waiting).ename == "KeyboardInterrupt"
            assert state_of(daemon.socket, b.kernel_id) == "idle"
        assert a.collect(holding).status == "ok"
        assert b.run("'reached' in globals()").value is False
    finally:
        b.run("%kiwi mode lazy")


def test_pool_and_priority_are_the_shims_and_refused_in_one_line(
        pair: tuple[KernelUnderTest, KernelUnderTest]) -> None:
    _, b = pair
    refused = b.run("%kiwi pool training")
    assert len(refused.stderr.splitlines()) == 1
    assert "KIWI_POOL" in refused.stderr


def test_a_kiwi_shim_the_device_plugin_preloaded_is_not_joined_by_a_second(
        pair: tuple[KernelUnderTest, KernelUnderTest], daemon: DaemonProcess) -> None:
    # In a pod the device plugin preloads its own copy of the shim, at another path (and
    # maybe another version). The launcher must not add the package's shim beside it.
    plugin_copy = daemon.directory / "device-plugin" / "libkiwi.so"
    plugin_copy.parent.mkdir()
    shutil.copy(shim.library_path(build=False), plugin_copy)
    (kernel,) = start_kernels(daemon.directory, daemon.socket, KIWI_SHIM="",
                              LD_PRELOAD=str(plugin_copy),
                              LD_LIBRARY_PATH=str(daemon.directory / "fakecuda"))
    try:
        assert kernel.run("import os; os.environ['LD_PRELOAD']").value == str(plugin_copy)
        assert kernel.run("%kiwi mode").stdout == "kiwi: this kernel's mode is lazy\n"
    finally:
        kernel.shutdown()


def test_lazy_ctrl_c_ends_a_wait_inside_a_cuda_call(
        pair: tuple[KernelUnderTest, KernelUnderTest], daemon: DaemonProcess) -> None:
    """The wait is in C, inside the launch: Python's handler alone would raise only once A's
    cell had ended and the launch had run."""
    a, b = pair
    with Holder(daemon.directory) as hold:
        holding = a.submit(f"{LAUNCH}; {hold.code}")
        shim_holds(daemon, a, hold)
        waiting = b.submit(f"{LAUNCH}; reached = True")
        wait_waiting(daemon, b)

        b.interrupt()

        assert b.collect(waiting).ename == "KeyboardInterrupt"
        assert holders(daemon.socket) == [a.kernel_id]  # A's cell still holds: B did not wait
        assert b.run("'reached' in globals()").value is False
        a.interrupt()
        assert a.collect(holding).ename == "KeyboardInterrupt"


def test_a_shimmed_kernel_shows_as_its_notebook(
        pair: tuple[KernelUnderTest, KernelUnderTest], daemon: DaemonProcess) -> None:
    """Issue 31 item 6: with the shim loaded the kernel registers through the shim, which
    sends the notebook's path (KIWI_DISPLAY_NAME, set by the launcher) as the Python client
    does; the kernel id stays the key."""
    fake = daemon.directory / "fakecuda"  # built by the pair's fixture
    notebook = "/srv/notebooks/team/shimmed.ipynb"
    (kernel,) = start_kernels(daemon.directory, daemon.socket, KIWI_SHIM="",
                              LD_LIBRARY_PATH=str(fake), JPY_SESSION_NAME=notebook)
    try:
        assert kernel.run(SETUP).status == "ok"
        assert kernel.run(LAUNCH).status == "ok"
        row = wait_for_status(daemon.socket, lambda doc: entry(doc, kernel.kernel_id),
                              what="the shim registered")
        assert (row["kind"], row["display_name"]) == ("shim", notebook)
    finally:
        kernel.shutdown()


def test_a_cell_the_scheduler_cannot_make_room_for_says_why_then_fails_after_the_room_timeout(
        pair: tuple[KernelUnderTest, KernelUnderTest], daemon: DaemonProcess) -> None:
    """Issue 40 N4a: refused with `room`, the shim asks again with backoff on the same
    connection; the cell shows one waiting line saying why and when it asks again, updated in
    place, and fails after KIWI_ROOM_TIMEOUT with CUDA_ERROR_OUT_OF_MEMORY."""
    from shim.scripted_daemon import ScriptedDaemon

    why = "kernel needs 4.0 GiB on GPU 0 ... held by nbA.ipynb (6.0 GiB, pinned allocations)"
    scripted = ScriptedDaemon(daemon.directory / "refusing.sock")
    scripted.refuse_room = why
    (kernel,) = start_kernels(daemon.directory, str(scripted.path), KIWI_SHIM="",
                              LD_LIBRARY_PATH=str(daemon.directory / "fakecuda"),
                              KIWI_ROOM_TIMEOUT="4")
    try:
        assert kernel.run(SETUP).status == "ok"
        done = kernel.collect(kernel.submit(LAUNCH))
        assert done.value == 2  # CUDA_ERROR_OUT_OF_MEMORY, once KIWI_ROOM_TIMEOUT is over
        lines = [m["content"]["data"]["text/plain"]
                 for m in done.of_type("display_data", "update_display_data")]
        refused = [line for line in lines if line]
        assert refused and all(line.startswith("kiwi: waiting for room on the GPU (") and
                               why in line for line in refused), lines
        assert lines[-1] == ""  # blanked once the wait is over
        assert len(scripted.messages("register")) == 1
    finally:
        kernel.shutdown()
        scripted.close()
