"""The stand-in GPU (kiwi_jupyter/kernel/standin.py) on its own: arrays that behave as NumPy's,
memory that moves out and back whole, and what it counts."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from kiwi_jupyter.kernel.gpu_cells import may_use_gpu
from kiwi_jupyter.kernel.standin import StandInArray, StandInGPU

MiB = 1024 * 1024


@pytest.fixture
def gpu() -> StandInGPU:
    return StandInGPU(link="1GiB")  # fast: these tests are about what moves, not when


def test_outside_a_kiwi_kernel_nobody_manages_it(gpu: StandInGPU) -> None:
    assert gpu.managed is False


def test_its_arrays_compute_as_numpys_and_results_live_in_host_memory(gpu: StandInGPU) -> None:
    a = gpu.rand(64, 64)
    b = gpu.asarray(np.eye(64, dtype=np.float32))
    assert isinstance(a, StandInArray) and a.dtype == np.float32
    product = a @ b
    assert type(product) is np.ndarray
    assert np.array_equal(product, a.view(np.ndarray))
    assert float(a.sum()) == pytest.approx(float(a.view(np.ndarray).sum()))
    assert np.array_equal(gpu.zeros((2, 3)), np.zeros((2, 3)))


def test_it_counts_what_it_allocated_until_the_arrays_are_gone(gpu: StandInGPU) -> None:
    a = gpu.zeros((MiB // 4,))  # 1 MiB of float32
    view = a[: 16]
    assert gpu.figures().working_set == MiB
    del a
    gc.collect()
    assert gpu.figures().working_set == MiB  # the view still uses it
    del view
    gc.collect()
    assert gpu.figures().working_set == 0


def test_moving_out_frees_the_memory_there_and_moving_back_restores_it_whole(
        gpu: StandInGPU) -> None:
    a = gpu.rand(256, 256)
    before = a.view(np.ndarray).copy()
    gpu.evict_asked(a.nbytes, "the partner")
    figures = gpu.figures()
    assert (figures.resident, figures.host) == (0, a.nbytes)
    assert not a.view(np.ndarray).any()  # its pages are the system's again: they read zeros
    assert np.array_equal(a + 0, before)  # the operation brought it back first
    assert (gpu.figures().resident, gpu.figures().host) == (a.nbytes, 0)
    assert (gpu.moves_out, gpu.moves_in) == (1, 1)


def test_a_move_takes_the_time_its_link_gives_it() -> None:
    import time

    slow = StandInGPU(link="8MiB")
    kept = [slow.zeros((MiB // 4,)), slow.zeros((MiB // 4,))]  # 2 MiB: a quarter second
    started = time.monotonic()
    slow.evict_asked(2 * MiB, "x")
    # A lower bound only (the pacing sleeps until then); how long past it is the machine's.
    assert time.monotonic() - started >= 0.25 - 0.01
    assert slow.figures().host == sum(a.nbytes for a in kept)


def test_cells_that_use_it_may_use_the_gpu(gpu: StandInGPU) -> None:
    a = gpu.zeros((4,))
    assert may_use_gpu("a + 1", {"a": a}, ())
    assert may_use_gpu("b = gpu.rand(4)", {"gpu": gpu}, ())
    assert not may_use_gpu("x = 1", {"a": a}, ())


def test_a_link_speed_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        StandInGPU(link=0)
