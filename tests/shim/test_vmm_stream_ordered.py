"""Stream-ordered allocations under the vmm evictor (issue 39, defect 7): PyTorch's cudaMallocAsync
backend and CuPy's async pool allocate and free every tensor through the driver, and a training
loop runs ahead of the GPU, so when a tensor is freed its memory is still in use by work queued
before the free. The shim must not reserve, create, map and set access for every tensor (tens of
microseconds each on a GPU): an allocation takes back at once what its own stream freed, as the
driver's pool does, in size classes; other streams wait for the free's event. The fake driver's
FAKE_CUDA_PENDING_STREAM holds a stream's work back (the GPU behind) until a file exists.

What it costs per tensor is benchmarks/shim/stream_alloc.py's to measure.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_device import FakeCard
from test_vmm_evictor import (
    RESERVED_MEM_CURRENT,
    USED_MEM_CURRENT,
    MiB,
    evicted_by_next,
    hold_with,
    vmm,
)

VMM_CALLS = ("cuMemAddressReserve", "cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap",
             "cuMemRelease", "cuMemAddressFree")
#: A step's tensors: a slab's worth of small ones, regions of every size.
STEP = [512, 4096, 36_864, 300_000, MiB, 2_621_440, 6 * MiB, 24 * MiB]


@pytest.fixture
def behind(workload, card: FakeCard, tmp_path: Path):
    """A process under vmm whose stream 0x77 runs behind: nothing on it completes."""
    return vmm(workload, card, FAKE_CUDA_PENDING_STREAM="0x77",
               FAKE_CUDA_PENDING_UNTIL=str(tmp_path / "never"))


def vmm_calls(w) -> list[str]:
    return [name for name in w.log.names() if name in VMM_CALLS]


def test_an_allocation_takes_back_what_its_stream_freed_though_the_gpu_is_behind(
        behind, card: FakeCard) -> None:
    ptr = behind.call(f"d.alloc_async({24 * MiB})")
    assert behind.call(f"d.free_async({ptr})") == 0
    behind.log.clear()
    assert behind.call(f"d.alloc_async({24 * MiB})") == ptr  # its stream's work comes after
    assert vmm_calls(behind) == [] and not behind.log.calls("cuEventQuery")
    other = behind.call(f"d.alloc_async({24 * MiB}, stream=0x88)")
    assert other != ptr  # another stream's work may run before the free's: new memory


def test_a_training_loop_maps_nothing_after_its_first_step(behind, card: FakeCard) -> None:
    behind.call(f"training_steps(1, {STEP})")
    on_card = card.used_by(behind.process.pid)
    behind.log.clear()
    last = behind.call(f"training_steps(20, {STEP})")
    assert vmm_calls(behind) == []
    assert card.used_by(behind.process.pid) == on_card  # one step's worth, not twenty
    assert behind.call(f"d.read({last[5]}, 2) == bytes([19, 5])")


def test_sizes_that_change_from_step_to_step_reuse_their_class(behind, card: FakeCard) -> None:
    """Dynamic shapes: a tensor a little larger or smaller each step."""
    first = behind.call(f"d.alloc_async({100 * MiB + 4096})")
    behind.call(f"d.free_async({first})")
    behind.log.clear()
    assert behind.call(f"d.alloc_async({100 * MiB + 900_000})") == first
    assert vmm_calls(behind) == []
    small = behind.call(f"d.alloc_async({5000})")
    behind.call(f"d.free_async({small})")
    assert behind.call(f"d.alloc_async({4700})") == small  # ten units of 512 bytes
    assert behind.stats()["working_set"] == 104 * MiB + 2 * MiB  # the class, and a slab


def test_each_threads_default_stream_is_its_own(workload, card: FakeCard,
                                                 tmp_path: Path) -> None:
    """Stream 0 to a _ptsz entry point is the calling thread's per-thread stream: another
    thread's is another stream."""
    behind = vmm(workload, card, FAKE_CUDA_PENDING_STREAM=str(0x2),  # CU_STREAM_PER_THREAD
                 FAKE_CUDA_PENDING_UNTIL=str(tmp_path / "never"))
    mine = behind.call(f"d.alloc_async({8 * MiB}, stream=0, name='cuMemAllocAsync_ptsz')")
    assert behind.call(f"d.free_async({mine}, stream=0, name='cuMemFreeAsync_ptsz')") == 0
    theirs = behind.call("on_a_thread(\"d.alloc_async(8 << 20, stream=0, "
                         "name='cuMemAllocAsync_ptsz')\")")
    assert theirs != mine
    assert behind.call(f"d.alloc_async({8 * MiB}, stream=0, name='cuMemAllocAsync_ptsz')") == mine


def test_a_plain_allocation_never_takes_a_stream_ordered_free_still_pending(
        behind, card: FakeCard) -> None:
    ptr = behind.call(f"d.alloc_async({4 * MiB})")
    behind.call(f"d.free_async({ptr})")
    assert behind.call(f"d.alloc({4 * MiB})") != ptr  # usable by any stream at once


def test_the_pool_counts_reused_memory_once(workload, card: FakeCard) -> None:
    w = vmm(workload, card)
    pool = w.call("d.device_pool()")
    ptr = w.call(f"d.alloc_async({4 * MiB})")
    w.call(f"d.free_async({ptr})")
    assert w.call(f"d.alloc_async({4 * MiB})") == ptr
    assert w.call(f"d.pool_attribute({pool}, {USED_MEM_CURRENT})") == 4 * MiB
    assert w.call(f"d.pool_attribute({pool}, {RESERVED_MEM_CURRENT})") == 4 * MiB


def test_reused_memory_keeps_its_bytes_through_evictions(scheduler, workload,
                                                         card: FakeCard) -> None:
    w = vmm(workload, card, scheduler.socket)
    hold_with(w, scheduler, [MiB])
    for cycle in range(3):
        last = w.call(f"training_steps(3, {STEP})")
        kept = [w.call(f"d.alloc_async({size})") for size in STEP]  # the step's, taken back
        assert kept == last
        for i, ptr in enumerate(kept):
            assert w.call(f"d.write({ptr + 1}, bytes([{cycle}, {i}]))") == 0
        assert evicted_by_next(scheduler, w, lambda: card.used_by(w.process.pid)) == 0
        assert all(w.call(f"d.read({ptr + 1}, 2) == bytes([{cycle}, {i}])")
                   for i, ptr in enumerate(kept))
        for ptr in kept:
            w.call(f"d.free_async({ptr})")
