"""Two real Kiwi kernels sharing a GPU of 12 MiB through the stand-in GPU (no GPU here), each
with a working set of 8 MiB: one fits, two do not. What the demo notebooks show in the panel:
each kernel's memory, moved to host memory while the other works and back for its own turn."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kernel_support import KernelUnderTest, entry, scheduler_status, start_kernels
from support import DaemonProcess, short_tmpdir, wait_for_status

MiB = 1024 * 1024

SETUP = """
from kiwi_jupyter.kernel.standin import StandInGPU
gpu = StandInGPU()
a, b = gpu.rand(2, 1024, 1024)  # one allocation of 8 MiB, as the demo's
expected = float((a @ b).sum())
"""

BURST = """
import time
start, rounds = time.monotonic(), 0
while time.monotonic() - start < {seconds}:
    c = a @ b
    rounds += 1
assert float(c.sum()) == expected, "the memory came back changed"
print(rounds > 0)
"""


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProcess]:
    # Mode on, a short quantum, and a grace nobody reaches: the stand-in hands back at once.
    directory = short_tmpdir()
    daemon = DaemonProcess(directory, "--tq", "1", "--grace", "60", "--gpu-memory", "12MiB")
    yield daemon.start()
    daemon.cleanup()


@pytest.fixture(scope="module")
def pair(daemon: DaemonProcess) -> Iterator[list[KernelUnderTest]]:
    # The kernels' own default gating (gpu cells only): the stand-in's arrays say they are GPU
    # memory. A modelled link of 32 MiB/s: a quarter second each way for a working set.
    kernels = start_kernels(daemon.directory, daemon.socket, 2, gate_cells=None,
                            KIWI_STANDIN_LINK="32MiB")
    for kernel in kernels:
        done = kernel.run(SETUP, timeout=60)
        assert done.ename is None, done.reply
    yield kernels
    for kernel in kernels:
        kernel.shutdown()


def test_each_kernel_declares_its_arrays_as_its_working_set(
        pair: list[KernelUnderTest], daemon: DaemonProcess) -> None:
    # The daemon hears a working set at most twice a second (working_sets.py): waited for.
    document = wait_for_status(daemon.socket, lambda d: all(
        (entry(d, k.kernel_id) or {}).get("working_set") == 8 * MiB for k in pair) and d,
        what="both working sets heard")
    for kernel in pair:
        mine = entry(document, kernel.kernel_id)
        assert mine["resident_bytes"] + mine["host_bytes"] == 8 * MiB


def test_the_second_kernels_arrays_moved_the_firsts_to_host_memory(
        pair: list[KernelUnderTest], daemon: DaemonProcess) -> None:
    first, second = pair
    document = wait_for_status(
        daemon.socket, lambda d: entry(d, first.kernel_id)["residency"] == "evicted" and d,
        what="the first kernel's memory in host memory")
    assert entry(document, first.kernel_id)["host_bytes"] == 8 * MiB
    assert entry(document, second.kernel_id)["residency"] == "resident"


def test_two_bursts_take_turns_and_their_memory_moves_each_way(
        pair: list[KernelUnderTest], daemon: DaemonProcess) -> None:
    asked = [kernel.submit(BURST.format(seconds=4)) for kernel in pair]
    done = [kernel.collect(msg_id, timeout=120) for kernel, msg_id in zip(pair, asked, strict=True)]
    for execution in done:
        assert execution.ename is None, execution.reply
        assert "True" in execution.stdout
    # Each gave the GPU back at a quantum's end with the other waiting, and said so.
    said = [e.stdout for e in done]
    assert any("this cell gave the GPU back" in out for out in said), said
    moves = [kernel.run("print(gpu.moves_out, gpu.moves_in)").stdout.split() for kernel in pair]
    assert all(int(out) >= 1 and int(back) >= 1 for out, back in moves), moves
    timeline = scheduler_status(daemon.socket)["gpus"][0]["recent_holders"]
    assert len(timeline) >= 3  # the GPU changed hands within the bursts, not only between them
