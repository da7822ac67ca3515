"""KIWI_EVICT_COPY: the managed evictor's way out by copy and discard instead of migration, and
its way back (off by default until a GPU run measures it; docs/shim.md)."""

from __future__ import annotations

import re

from support import wait_for_status
from test_scheduling import after, hold_with, other_client, prefetch_devices, regrant, state_in

GiB = 1 << 30


def evict(scheduler, w) -> None:
    with other_client(scheduler, "next", 6 * GiB) as next_holder:
        next_holder.acquire(timeout=10)


def field(line: str, name: str) -> str:
    return re.search(rf"{name}=(\S+)", line).group(1)


def test_an_eviction_copies_each_live_range_out_then_discards_them_on_one_stream(
        scheduler, workload) -> None:
    w = workload(KIWI_SOCKET=scheduler.socket, KIWI_EVICT_COPY="pinned", FAKE_CUDA_DISCARD="1")
    own_stream = hold_with(w, scheduler, 6 * GiB)
    evict(scheduler, w)
    evicting = after(w.log.names(), "cuCtxSynchronize")
    copies = [name for name in evicting if name == "cuMemcpyDtoHAsync_v2"]
    assert len(copies) == 2
    # Both copies are queued before the one discard: the discard never drops unread bytes.
    assert evicting.index("cuMemDiscardBatchAsync") > max(
        i for i, name in enumerate(evicting) if name == "cuMemcpyDtoHAsync_v2")
    assert not w.log.calls("cuMemPrefetchAsync")  # nothing migrates
    discard = w.log.calls("cuMemDiscardBatchAsync")
    assert len(discard) == 1 and f"count=2 bytes={6 * GiB}" in discard[0]
    assert all(field(line, "stream") == own_stream
               for line in w.log.calls("cuMemcpyDtoHAsync_v2") + discard)
    assert len(w.log.calls("cuMemAllocHost_v2")) == 2  # pinned: one host buffer per range
    stats = w.stats()
    assert (stats["evictions"], stats["bytes_evicted"], stats["evicted"]) == (1, 6 * GiB, True)


def test_a_restore_repopulates_on_the_gpu_then_copies_each_range_back_before_work_resumes(
        scheduler, workload) -> None:
    w = workload(KIWI_SOCKET=scheduler.socket, KIWI_EVICT_COPY="pinned", FAKE_CUDA_DISCARD="1")
    hold_with(w, scheduler, 6 * GiB)
    regrant(scheduler, w)
    names = w.log.names()
    restore = names[:names.index("cuLaunchKernel")]
    assert restore.count("cuMemPrefetchAsync") == 2
    assert prefetch_devices(w.log.calls("cuMemPrefetchAsync")) == [0, 0]
    back = w.log.calls("cuMemcpyHtoDAsync_v2")
    assert len(back) == 2
    first_copy = restore.index("cuMemcpyHtoDAsync_v2")
    assert first_copy > max(i for i, n in enumerate(restore) if n == "cuMemPrefetchAsync")
    assert "cuStreamSynchronize" in restore[first_copy:]
    assert not w.log.calls("cuMemFreeHost")  # the buffers stay, for the next eviction


def test_the_next_eviction_reuses_the_buffers_of_the_last_one(scheduler, workload) -> None:
    """Fresh host pages cost about what the copy does: a working set of the same shape is
    copied into the buffers it was copied into last time, none allocated or freed."""
    w = workload(KIWI_SOCKET=scheduler.socket, KIWI_EVICT_COPY="pinned", FAKE_CUDA_DISCARD="1")
    hold_with(w, scheduler, 6 * GiB)
    regrant(scheduler, w)
    first = {field(line, "src"): field(line, "dst")
             for line in w.log.calls("cuMemcpyHtoDAsync_v2")}  # buffer -> range
    w.log.clear()
    evict(scheduler, w)
    second = {field(line, "dst"): field(line, "src")
              for line in w.log.calls("cuMemcpyDtoHAsync_v2")}
    assert len(second) == 2 and second == first
    assert not w.log.calls("cuMemAllocHost_v2") and not w.log.calls("cuMemFreeHost")
    assert w.stats()["bytes_evicted"] == 12 * GiB  # both evictions, each in full


def test_buffers_the_next_eviction_has_no_range_for_are_freed(scheduler, workload) -> None:
    w = workload(KIWI_SOCKET=scheduler.socket, KIWI_EVICT_COPY="pinned", FAKE_CUDA_DISCARD="1")
    hold_with(w, scheduler, 6 * GiB)
    regrant(scheduler, w)
    buffers = {field(line, "dst"): field(line, "src")  # range -> buffer
               for line in w.log.calls("cuMemcpyHtoDAsync_v2")}
    # The working set changes shape: one range freed, one of another size allocated.
    gone, stays = sorted(buffers)
    assert w.call(f"d.free({int(gone, 16)})") == 0
    w.call(f"d.alloc({4 * GiB})")
    w.log.clear()
    evict(scheduler, w)
    copies = {field(line, "src"): field(line, "dst")
              for line in w.log.calls("cuMemcpyDtoHAsync_v2")}
    assert len(copies) == 2 and copies[stays] == buffers[stays]
    assert len(w.log.calls("cuMemAllocHost_v2")) == 1  # the new range's buffer
    assert [field(line, "host") for line in w.log.calls("cuMemFreeHost")] == [buffers[gone]]


def test_a_context_that_ends_takes_its_buffers_with_it(scheduler, workload) -> None:
    """Pinned buffers belong to the context they were allocated in: once it is destroyed the
    shim neither frees them again nor copies into them, even for a new context that the driver
    hands the same handle."""
    w = workload(KIWI_SOCKET=scheduler.socket, KIWI_EVICT_COPY="pinned", FAKE_CUDA_DISCARD="1")
    w.call("d.set_context(0xABC)")
    hold_with(w, scheduler, 6 * GiB)
    regrant(scheduler, w)
    assert len(w.log.calls("cuMemcpyHtoDAsync_v2")) == 2
    assert w.call("d.destroy_context(0xABC)") == 0
    w.call("d.set_context(0xABC)")  # a new context, the old handle
    hold_with(w, scheduler, 6 * GiB)  # the same shape as before
    evict(scheduler, w)
    assert len(w.log.calls("cuMemAllocHost_v2")) == 2  # fresh buffers, for the live context
    assert not w.log.calls("cuMemFreeHost")


def test_the_buffers_come_back_to_the_ranges_they_were_copied_from(scheduler, workload) -> None:
    w = workload(KIWI_SOCKET=scheduler.socket, KIWI_EVICT_COPY="pageable",
                 FAKE_CUDA_DISCARD="1")
    hold_with(w, scheduler, 6 * GiB)
    with other_client(scheduler, "next", 6 * GiB) as next_holder:
        next_holder.acquire(timeout=10)
        saved = {field(line, "src"): field(line, "dst")
                 for line in w.log.calls("cuMemcpyDtoHAsync_v2")}
        w.log.clear()
        launch = w.start("d.launch()")
        wait_for_status(scheduler.socket, lambda doc: state_in(doc, w) == "waiting",
                        what="the shim to queue again")
        next_holder.release()
        assert launch.result() == 0
    restored = {field(line, "dst"): field(line, "src")
                for line in w.log.calls("cuMemcpyHtoDAsync_v2")}
    assert len(saved) == 2 and restored == saved
    assert not w.log.calls("cuMemAllocHost_v2")  # pageable: nothing pinned


def test_a_driver_that_cannot_discard_gets_the_ranges_prefetched_and_is_not_asked_again(
        scheduler, workload) -> None:
    w = workload(KIWI_SOCKET=scheduler.socket, KIWI_EVICT_COPY="pinned")  # no FAKE_CUDA_DISCARD
    hold_with(w, scheduler, 6 * GiB)
    evict(scheduler, w)  # the copies were wasted: only the discard says it cannot
    assert prefetch_devices(w.log.calls("cuMemPrefetchAsync")) == [-1, -1]
    assert len(w.log.calls("cuMemFreeHost")) == 2  # the copies' buffers, after a synchronize
    assert w.stats()["bytes_evicted"] == 6 * GiB
    regrant(scheduler, w)
    assert not w.log.calls("cuMemcpyHtoDAsync_v2")  # nothing saved, nothing written back
    w.log.clear()
    evict(scheduler, w)
    assert not w.log.calls("cuMemcpyDtoHAsync_v2")  # the next eviction prefetches at once
    assert prefetch_devices(w.log.calls("cuMemPrefetchAsync")) == [-1, -1]


def test_a_host_that_cannot_pin_gets_pageable_buffers(scheduler, workload) -> None:
    w = workload(KIWI_SOCKET=scheduler.socket, KIWI_EVICT_COPY="pinned", FAKE_CUDA_DISCARD="1",
                 FAKE_CUDA_NO_PINNING="1")
    hold_with(w, scheduler, 6 * GiB)
    evict(scheduler, w)
    assert len(w.log.calls("cuMemcpyDtoHAsync_v2")) == 2
    assert len(w.log.calls("cuMemDiscardBatchAsync")) == 1
    assert w.stats()["bytes_evicted"] == 6 * GiB


def test_evict_copy_is_off_by_default_and_with_a_restore_by_fault(scheduler, workload) -> None:
    for env in ({}, {"KIWI_EVICT_COPY": "pinned", "KIWI_RESTORE": "fault"}):
        w = workload(KIWI_SOCKET=scheduler.socket, FAKE_CUDA_DISCARD="1", **env)
        hold_with(w, scheduler, 6 * GiB)
        evict(scheduler, w)
        assert not w.log.calls("cuMemcpyDtoHAsync_v2"), env
        assert prefetch_devices(w.log.calls("cuMemPrefetchAsync")) == [-1, -1], env
        w.close()
