"""Allocations become managed memory; every one is counted; the limit holds."""

from __future__ import annotations

import re

import pytest

GiB = 1 << 30
MiB = 1 << 20
OUT_OF_MEMORY = 2


def managed_sizes(w) -> list[int]:
    return [int(re.search(r"size=(\d+)", line).group(1))
            for line in w.log.calls("cuMemAllocManaged")]


def test_device_allocations_of_every_kind_become_managed_memory(workload) -> None:
    w = workload()
    w.call("d.alloc(1 * 1024 * 1024)")
    w.call("d.alloc_async(2 * 1024 * 1024)")
    w.call("d.alloc_from_pool(3 * 1024 * 1024)")
    assert managed_sizes(w) == [1 * MiB, 2 * MiB, 3 * MiB]
    assert all("flags=1" in line for line in w.log.calls("cuMemAllocManaged"))
    assert not {"cuMemAlloc_v2", "cuMemAllocAsync", "cuMemAllocFromPoolAsync"} & set(w.log.names())


def test_a_pitched_allocation_gets_aligned_rows_of_managed_memory(workload) -> None:
    w = workload()
    ptr, pitch = w.call("d.alloc_pitch(1000, 3, 4)")
    assert pitch == 1024 and pitch % 512 == 0
    assert managed_sizes(w) == [1024 * 3]
    assert ptr


def test_the_working_set_counts_allocations_until_they_are_freed(workload) -> None:
    w = workload()
    a = w.call("d.alloc(100 * 1024 * 1024)")
    w.call("d.alloc(50 * 1024 * 1024)")
    stats = w.stats()
    assert (stats["working_set"], stats["evictable"], stats["allocations"]) == (150 * MiB,
                                                                                 150 * MiB, 2)
    assert w.call(f"d.free({a})") == 0
    stats = w.stats()
    assert (stats["working_set"], stats["allocations"]) == (50 * MiB, 1)


def test_vmm_allocations_count_but_are_not_evictable(workload) -> None:
    w = workload()
    handle = w.call("d.alloc_vmm(64 * 1024 * 1024)")
    w.call("d.alloc(16 * 1024 * 1024)")
    stats = w.stats()
    assert (stats["working_set"], stats["evictable"]) == (80 * MiB, 16 * MiB)
    assert w.call(f"d.release_vmm({handle})") == 0
    assert w.stats()["working_set"] == 16 * MiB


def test_a_stream_ordered_free_waits_for_its_stream_then_frees(workload) -> None:
    w = workload()
    ptr = w.call("d.alloc_async(1024)")
    assert w.call(f"d.free_async({ptr}, 0x77)") == 0
    names = w.log.names()
    assert names[-2:] == ["cuStreamSynchronize", "cuMemFree_v2"]
    assert w.log.calls("cuStreamSynchronize")[-1].endswith("stream=0x77")
    assert "cuMemFreeAsync" not in names
    assert w.stats()["working_set"] == 0


def test_allocations_past_the_limit_fail_out_of_memory(workload) -> None:
    w = workload(KIWI_GPU_MEMORY_LIMIT="1GiB")
    w.call("d.alloc(768 * 1024 * 1024)")
    assert w.call("d.alloc_result(512 * 1024 * 1024)") == OUT_OF_MEMORY
    assert managed_sizes(w) == [768 * MiB]
    assert w.call("d.alloc_result(256 * 1024 * 1024)") == 0


def test_without_a_limit_a_process_may_allocate_the_whole_gpu_but_no_more(workload) -> None:
    w = workload(FAKE_CUDA_TOTAL=str(4 * GiB))
    assert w.call("d.alloc_result(4 * 1024 ** 3)") == 0
    assert w.call("d.alloc_result(1)") == OUT_OF_MEMORY


def test_mem_get_info_reports_the_limit_less_what_this_process_holds(workload) -> None:
    w = workload(KIWI_GPU_MEMORY_LIMIT="2GiB", FAKE_CUDA_TOTAL=str(16 * GiB))
    w.call("d.alloc(512 * 1024 * 1024)")
    assert w.call("d.mem_info()") == [2 * GiB - 512 * MiB, 2 * GiB]


def test_mem_get_info_reports_the_whole_gpu_without_a_limit(workload) -> None:
    w = workload(FAKE_CUDA_TOTAL=str(16 * GiB))
    assert w.call("d.mem_info()") == [16 * GiB, 16 * GiB]


def test_a_limit_larger_than_the_gpu_is_the_gpu(workload) -> None:
    w = workload(KIWI_GPU_MEMORY_LIMIT="64GiB", FAKE_CUDA_TOTAL=str(16 * GiB))
    assert w.call("d.mem_info()")[1] == 16 * GiB


def test_an_allocation_on_a_stream_under_graph_capture_goes_to_the_driver(workload) -> None:
    w = workload(FAKE_CUDA_CAPTURING_STREAM="0x66")
    w.call("d.alloc_async(4096, stream=0x66)")
    w.call("d.alloc_from_pool(4096, stream=0x66)")
    assert w.log.calls("cuMemAllocAsync") and w.log.calls("cuMemAllocFromPoolAsync")
    assert not w.log.calls("cuMemAllocManaged")
    assert w.stats()["working_set"] == 0


def test_where_managed_memory_is_refused_during_capture_device_memory_is_counted(workload) -> None:
    w = workload(FAKE_CUDA_MANAGED_ERROR="900")  # CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
    ptr = w.call("d.alloc(8 * 1024 * 1024)")
    assert w.log.calls("cuMemAlloc_v2")
    stats = w.stats()
    assert (stats["working_set"], stats["evictable"]) == (8 * MiB, 0)
    assert w.call(f"d.free({ptr})") == 0
    assert w.stats()["working_set"] == 0


def test_other_managed_allocation_errors_reach_the_caller(workload) -> None:
    w = workload(FAKE_CUDA_MANAGED_ERROR="2")
    assert w.call("d.alloc_result(1024)") == OUT_OF_MEMORY
    assert not w.log.calls("cuMemAlloc_v2")
    assert w.stats()["working_set"] == 0


def test_a_failed_free_keeps_the_allocation_counted(workload) -> None:
    w = workload(FAKE_CUDA_FREE_ERROR="1")
    ptr = w.call("d.alloc_async(1024)")
    assert w.call(f"d.free_async({ptr}, 0x77)") == 1
    assert w.call(f"d.free({ptr})") == 1
    stats = w.stats()
    assert (stats["working_set"], stats["allocations"]) == (1024, 1)


def test_a_per_thread_stream_free_waits_for_the_per_thread_stream(workload) -> None:
    """Stream 0 given to a _ptsz entry point is the calling thread's stream, not the legacy
    default stream that synchronizes with every other."""
    w = workload()
    ptr = w.call("d.alloc_async(1024)")
    assert w.call(f"d.free_async({ptr}, 0, name='cuMemFreeAsync_ptsz')") == 0
    assert w.log.calls("cuStreamSynchronize")[-1].endswith("stream=0x2")
    assert w.log.names()[-1] == "cuMemFree_v2"


def test_destroying_a_context_forgets_its_allocations(workload) -> None:
    w = workload()
    w.call("d.set_context(0xABC)")
    w.call("d.alloc(1 * 1024 * 1024)")
    w.call("d.set_context(0)")  # back to the primary context
    w.call("d.alloc(2 * 1024 * 1024)")
    assert w.call("d.destroy_context(0xABC)") == 0
    stats = w.stats()
    assert (stats["working_set"], stats["allocations"]) == (2 * MiB, 1)


@pytest.mark.parametrize("name", ["cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"])
def test_releasing_the_last_reference_to_the_primary_context_forgets_its_allocations(
        workload, name: str) -> None:
    w = workload()
    w.call("d.retain_primary()")
    w.call("d.retain_primary()")
    w.call("d.alloc(1 * 1024 * 1024)")
    assert w.call(f"d.end_primary({name!r})") == 0
    assert w.stats()["working_set"] == 1 * MiB  # one reference left: the context lives
    assert w.call(f"d.end_primary({name!r})") == 0
    assert (w.stats()["working_set"], w.stats()["allocations"]) == (0, 0)


@pytest.mark.parametrize("name", ["cuDevicePrimaryCtxReset_v2", "cuDevicePrimaryCtxReset"])
def test_resetting_the_primary_context_forgets_its_allocations(workload, name: str) -> None:
    w = workload()
    w.call("d.retain_primary()")
    w.call("d.alloc(1 * 1024 * 1024)")
    assert w.call(f"d.end_primary({name!r})") == 0
    assert w.stats()["working_set"] == 0


@pytest.mark.parametrize("via", ["dlsym", "proc_v2"])
def test_device_total_memory_agrees_with_mem_get_info(workload, via: str) -> None:
    w = workload(KIWI_GPU_MEMORY_LIMIT="2GiB", FAKE_CUDA_TOTAL=str(16 * GiB))
    assert w.call(f"d.device_total(via={via!r})") == 2 * GiB
    assert w.call("d.mem_info()")[1] == 2 * GiB


def test_free_memory_leaves_out_what_no_eviction_frees(workload) -> None:
    """Other processes' contexts and unconverted memory stay on the card whoever holds it: free
    memory, and what may be allocated, stop short of it, so that frameworks trim their caches
    before managed memory would oversubscribe the card."""
    w = workload(FAKE_CUDA_TOTAL=str(16 * GiB), FAKE_CUDA_OTHERS_USED=str(10 * GiB),
                 KIWI_SOCKET="/nonexistent/kiwi.sock", KIWI_FAIL_TIMEOUT="0")
    assert w.call("d.launch()") == 0  # no daemon, failing open: the GPU is this process's
    w.call("d.alloc(1024 ** 3)")
    assert w.call("d.mem_info()") == [5 * GiB, 16 * GiB]
    assert w.call(f"d.alloc_result({6 * GiB})") == OUT_OF_MEMORY
    assert w.call(f"d.alloc_result({4 * GiB})") == 0


def test_stream_ordered_allocations_come_from_a_managed_pool_where_the_driver_has_one(
        workload) -> None:
    """CUDA 13: a managed pool per device keeps cudaMallocAsync's allocations and frees
    stream-ordered, and pageable. No stream is synchronized for a free."""
    w = workload(FAKE_CUDA_MANAGED_POOLS="1")
    ptr = w.call("d.alloc_async(2 * 1024 * 1024)")
    w.call("d.alloc_from_pool(3 * 1024 * 1024, pool=0x99)")
    created = w.log.calls("cuMemPoolCreate")
    assert len(created) == 1 and "type=2 location=1:0" in created[0]  # managed, on device 0
    pool = re.search(r"pool=(\S+)", created[0]).group(1)
    allocations = w.log.calls("cuMemAllocFromPoolAsync")
    assert [line.split("pool=")[1].split()[0] for line in allocations] == [pool, pool]
    assert not w.log.calls("cuMemAllocManaged")
    stats = w.stats()
    assert (stats["working_set"], stats["evictable"]) == (5 * MiB, 5 * MiB)
    assert w.call(f"d.free_async({ptr}, 0x77)") == 0
    assert w.log.calls("cuMemFreeAsync")[-1].endswith("stream=0x77")
    assert not w.log.calls("cuStreamSynchronize")
    assert w.stats()["working_set"] == 3 * MiB


@pytest.mark.parametrize("name", ["cuDeviceGetMemPool", "cuDeviceGetDefaultMemPool"])
def test_the_devices_pool_is_the_managed_pool_so_its_attributes_are_true(workload,
                                                                          name: str) -> None:
    w = workload(FAKE_CUDA_MANAGED_POOLS="1")
    w.call("d.alloc_async(1024)")
    pool = re.search(r"pool=(\S+)", w.log.calls("cuMemPoolCreate")[0]).group(1)
    assert hex(w.call(f"d.device_pool({name!r})")) == pool


def test_without_managed_pools_stream_ordered_allocations_become_managed(workload) -> None:
    w = workload()
    w.call("d.alloc_async(1024)")
    assert "refused" in w.log.calls("cuMemPoolCreate")[0]
    assert managed_sizes(w) == [1024]
    assert w.call("d.device_pool()") == 0xDEF  # the driver's own


def test_an_allocation_refused_for_want_of_room_asks_the_driver_again(workload) -> None:
    """What was pinned may have gone (another holder beside this one left): before refusing,
    the shim measures again."""
    w = workload(FAKE_CUDA_TOTAL=str(16 * GiB), FAKE_CUDA_OTHERS_USED=str(10 * GiB),
                 KIWI_SOCKET="/nonexistent/kiwi.sock", KIWI_FAIL_TIMEOUT="0")
    assert w.call("d.launch()") == 0
    assert w.call("d.mem_info()") == [6 * GiB, 16 * GiB]
    w.call("os.environ.__setitem__('FAKE_CUDA_OTHERS_USED', '0')")
    assert w.call(f"d.alloc_result({8 * GiB})") == 0
