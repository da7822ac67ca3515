"""Blocks the framework's cache holds free: an eviction discards them (or leaves them out)
instead of copying them, a restore skips them, and a hint that may be stale is never used."""

from __future__ import annotations

import re

from support import wait_for, wait_for_status
from test_scheduling import after, other_client, prefetch_devices, working_set_in

GiB = 1 << 30
MiB = 1 << 20


def prefetched(lines: list[str]) -> list[tuple[int, int]]:
    """(address, size) of each cuMemPrefetchAsync line."""
    return [(int(re.search(r"ptr=(0x[0-9a-f]+)", line).group(1), 16),
             int(re.search(r"size=(\d+)", line).group(1))) for line in lines]


def hold_with_free_blocks(w, scheduler) -> tuple[int, int]:
    """w allocates two 3 GiB segments a and b, holds the GPU, and says that [a + 1 GiB, a + 2
    GiB) and [b, b + 512 MiB) are free in its cache. The log starts afresh."""
    a, b = w.call(f"[d.alloc({3 * GiB}), d.alloc({3 * GiB})]")
    assert w.call("d.launch()") == 0
    wait_for_status(scheduler.socket, lambda doc: working_set_in(doc, w) == 6 * GiB,
                    what="the working set report")
    w.call("shim.free_ranges_begin()")
    believed = w.call(f"shim.set_free_ranges([({a + GiB}, {GiB}), ({b}, {512 * MiB})])")
    assert believed == GiB + 512 * MiB
    assert w.stats()["free_in_cache"] == GiB + 512 * MiB
    w.log.clear()
    return a, b


def live_pieces(a: int, b: int) -> set[tuple[int, int]]:
    return {(a, GiB), (a + 2 * GiB, GiB), (b + 512 * MiB, 3 * GiB - 512 * MiB)}


def evict(scheduler, w) -> list[str]:
    with other_client(scheduler, "next", 6 * GiB) as next_holder:
        next_holder.acquire(timeout=10)
        return w.log.names()


def test_an_eviction_discards_the_free_blocks_and_copies_only_the_live_ones(scheduler,
                                                                           workload) -> None:
    w = workload(KIWI_SOCKET=scheduler.socket, FAKE_CUDA_DISCARD="1")
    a, b = hold_with_free_blocks(w, scheduler)
    names = evict(scheduler, w)
    evicting = after(names, "cuCtxSynchronize")
    assert evicting[0] == "cuMemDiscardBatchAsync"
    discard = w.log.calls("cuMemDiscardBatchAsync")
    assert len(discard) == 1
    assert f"count=2 bytes={GiB + 512 * MiB} flags=0" in discard[0]
    ranges = re.search(r"ranges=(\S+)", discard[0]).group(1).split(",")
    assert set(ranges) == {f"{a + GiB:#x}+{GiB}", f"{b:#x}+{512 * MiB}"}
    prefetches = w.log.calls("cuMemPrefetchAsync")
    assert set(prefetched(prefetches)) == live_pieces(a, b)
    assert set(prefetch_devices(prefetches)) == {-1}
    stats = w.stats()
    assert (stats["bytes_evicted"], stats["bytes_skipped"], stats["bytes_discarded"]) == (
        4 * GiB + 512 * MiB, GiB + 512 * MiB, GiB + 512 * MiB)


def test_a_driver_that_cannot_discard_leaves_the_free_blocks_out_of_the_eviction(
        scheduler, workload) -> None:
    w = workload(KIWI_SOCKET=scheduler.socket)
    a, b = hold_with_free_blocks(w, scheduler)
    evict(scheduler, w)
    assert not w.log.calls("cuMemDiscardBatchAsync")
    assert set(prefetched(w.log.calls("cuMemPrefetchAsync"))) == live_pieces(a, b)
    stats = w.stats()
    assert (stats["bytes_evicted"], stats["bytes_skipped"], stats["bytes_discarded"]) == (
        4 * GiB + 512 * MiB, GiB + 512 * MiB, 0)


def test_where_the_driver_batches_the_live_pieces_go_in_one_prefetch(scheduler,
                                                                     workload) -> None:
    w = workload(KIWI_SOCKET=scheduler.socket, FAKE_CUDA_DISCARD="1",
                 FAKE_CUDA_PREFETCH_BATCH="1")
    hold_with_free_blocks(w, scheduler)
    names = evict(scheduler, w)
    assert after(names, "cuCtxSynchronize")[:2] == ["cuMemDiscardBatchAsync",
                                                    "cuMemPrefetchBatchAsync"]
    batch = w.log.calls("cuMemPrefetchBatchAsync")[0]
    assert f"count=3 bytes={4 * GiB + 512 * MiB} locations=1 device=-1" in batch


def test_a_restore_skips_the_discarded_blocks_and_forgets_them(scheduler, workload) -> None:
    w = workload(KIWI_SOCKET=scheduler.socket, FAKE_CUDA_DISCARD="1")
    a, b = hold_with_free_blocks(w, scheduler)
    with other_client(scheduler, "next", 6 * GiB) as next_holder:
        next_holder.acquire(timeout=10)
        w.log.clear()
        launch = w.start("d.launch()")
        wait_for(lambda: w.stats()["state"] == "waiting", what="the shim to queue again")
        next_holder.release()
        assert launch.result() == 0
    names = w.log.names()
    restore = w.log.calls("cuMemPrefetchAsync")
    assert names.index("cuLaunchKernel") > names.index("cuMemPrefetchAsync")
    assert set(prefetched(restore)) == live_pieces(a, b)
    assert set(prefetch_devices(restore)) == {0}
    stats = w.stats()
    assert stats["free_in_cache"] == 0  # the gate is open again: the hints are gone


def test_free_blocks_of_an_allocation_freed_and_made_again_are_not_discarded(
        scheduler, workload) -> None:
    """A stale hint: between the reading and the eviction an allocation went and another came
    (at an address the driver may have handed out again). Nothing is discarded or skipped."""
    w = workload(KIWI_SOCKET=scheduler.socket, FAKE_CUDA_DISCARD="1")
    a, b = hold_with_free_blocks(w, scheduler)
    assert w.call(f"d.free({a})") == 0
    c = w.call(f"d.alloc({3 * GiB})")
    assert w.stats()["free_in_cache"] == 0
    wait_for_status(scheduler.socket, lambda doc: working_set_in(doc, w) == 6 * GiB,
                    what="the working set report")
    w.log.clear()
    evict(scheduler, w)
    assert not w.log.calls("cuMemDiscardBatchAsync")
    assert set(prefetched(w.log.calls("cuMemPrefetchAsync"))) == {(b, 3 * GiB), (c, 3 * GiB)}
    stats = w.stats()
    assert (stats["bytes_evicted"], stats["bytes_skipped"]) == (6 * GiB, 0)


def test_gpu_work_after_the_cache_was_read_makes_its_free_blocks_unbelieved(
        scheduler, workload) -> None:
    """Another thread may take a block from the cache and write it between the reading and the
    release: a GPU call leaving the gate since free_ranges_begin voids the hints."""
    w = workload(KIWI_SOCKET=scheduler.socket, FAKE_CUDA_DISCARD="1")
    a, b = w.call(f"[d.alloc({3 * GiB}), d.alloc({3 * GiB})]")
    assert w.call("d.launch()") == 0
    wait_for_status(scheduler.socket, lambda doc: working_set_in(doc, w) == 6 * GiB,
                    what="the working set report")
    w.call("shim.free_ranges_begin()")
    assert w.call(f"d.memset({a + GiB})") == 0
    assert w.call(f"shim.set_free_ranges([({a + GiB}, {GiB})])") == GiB
    assert w.stats()["free_in_cache"] == 0
    w.log.clear()
    evict(scheduler, w)
    assert not w.log.calls("cuMemDiscardBatchAsync")
    assert w.stats()["bytes_evicted"] == 6 * GiB


def test_only_whole_blocks_inside_one_managed_allocation_are_believed(workload) -> None:
    w = workload()
    a = w.call(f"d.alloc({64 * MiB})")
    b = w.call(f"d.alloc({64 * MiB})")
    handle = w.call(f"d.alloc_vmm({64 * MiB})")
    w.call("shim.free_ranges_begin()")
    believed = w.call("shim.set_free_ranges(["
                      f"({a + 3 * MiB}, {10 * MiB}),"   # cut to the 2 MiB blocks inside: 8 MiB
                      f"({a + 60 * MiB}, {8 * MiB}),"   # runs past a's end into b
                      f"({b + MiB}, {2 * MiB}),"        # no whole 2 MiB block in it
                      f"({handle}, {4 * MiB}),"         # a VMM handle, not a managed address
                      f"({0x1000}, {4 * MiB})])")       # nobody's
    assert believed == 8 * MiB


def test_free_ranges_without_a_begin_are_refused(workload) -> None:
    w = workload()
    a = w.call(f"d.alloc({64 * MiB})")
    error = w.call(f"repr(_err(lambda: shim.set_free_ranges([({a}, {4 * MiB})])))")
    assert "ValueError" in error
    assert w.stats()["free_in_cache"] == 0


def test_the_kernel_tells_the_shim_the_free_blocks_of_a_snapshot(workload) -> None:
    """The kernel's glue (kiwi_jupyter.kernel.free_blocks) against the real shim: a snapshot's
    inactive blocks become free ranges the shim believes."""
    w = workload()
    a = w.call(f"d.alloc({1 * GiB})")
    snapshot = [{"address": a, "total_size": GiB, "segment_pool_id": (0, 0),
                 "is_expandable": False, "blocks": [
                     {"address": a, "size": 256 * MiB, "state": "active_allocated"},
                     {"address": a + 256 * MiB, "size": 512 * MiB, "state": "inactive"},
                     {"address": a + 768 * MiB, "size": 256 * MiB, "state": "active_allocated"}]}]
    believed = w.call(
        "__import__('kiwi_jupyter.kernel.free_blocks', fromlist=['FreeBlocks']).FreeBlocks("
        f"shim, sources=[lambda: __import__('kiwi_jupyter.kernel.free_blocks', "
        f"fromlist=['torch_free_blocks']).torch_free_blocks({snapshot!r})]).tell()")
    assert believed == 512 * MiB
    assert w.stats()["free_in_cache"] == 512 * MiB


def test_a_failure_reading_the_free_blocks_warns_once_and_turns_it_off(workload) -> None:
    w = workload()
    w.call(f"d.alloc({1 * GiB})")
    w.call("globals().update(blocks=__import__('kiwi_jupyter.kernel.free_blocks', "
           "fromlist=['FreeBlocks']).FreeBlocks(shim, sources=[lambda: 1 / 0]))")
    assert w.call("[blocks.tell(), blocks.tell(), blocks.off]") == [None, None, True]
    w.call("sys.stderr.write('end of the test\\n') and sys.stderr.flush()")
    wait_for(lambda: any("end of the test" in line for line in w.stderr), what="stderr")
    warnings = [line for line in w.stderr if "free blocks" in line]
    assert len(warnings) == 1 and "ZeroDivisionError" in warnings[0]
