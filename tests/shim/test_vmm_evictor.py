"""The vmm evictor (KIWI_EVICT=vmm, issue 30) against the fake driver's model of the card and of
the virtual memory management API (tests/shim/fake_cuda.c), and the real daemon on a real
socket: allocations backed by physical handles the shim maps itself, an eviction that leaves the
card free by the fake driver's own count, addresses and contents that survive it, frees of
every kind, a restore that rolls back when the card has no room, and the evictor's selection.

Working sets here are tens of MiB: the fake keeps real bytes for VMM memory, and an eviction
copies them into host memory for real.
"""

from __future__ import annotations

import json
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_device import FakeCard
from support import scaled, wait_for, wait_for_status
from test_scheduling import after, client_of, other_client, state_of, working_set_in

MiB = 1 << 20
GiB = 1 << 30
#: cuMemPoolGetAttribute's counters.
RESERVED_MEM_CURRENT, RESERVED_MEM_HIGH, USED_MEM_CURRENT, USED_MEM_HIGH = 5, 6, 7, 8
PRIMARY = 0xC0FFEE  # the fake's primary context


def field(line: str, name: str) -> str:
    found = re.search(rf"\b{name}=(\S+)", line)
    assert found, f"no {name} in {line!r}"
    return found.group(1)


def sizes_of(lines: list[str]) -> list[int]:
    return [int(field(line, "size")) for line in lines]


def copied(lines: list[str]) -> int:
    return sum(int(field(line, "n")) for line in lines)


def vmm(workload, card: FakeCard, socket_path: str | None = None, **env: str):
    """A shimmed process under the vmm evictor on the shared card; without a daemon when no
    socket is given (its GPU work then runs unscheduled at once)."""
    daemon = ({"KIWI_SOCKET": socket_path} if socket_path
              else {"KIWI_SOCKET": "/nonexistent/kiwi.sock", "KIWI_FAIL_TIMEOUT": "0"})
    return workload(KIWI_EVICT="vmm", **daemon, **card.env, **env)


def hold_with(w, scheduler, sizes: list[int]) -> list[int]:
    """w allocates sizes, reports them (what they take on the card) and holds the GPU; returns
    the pointers."""
    pointers = [w.call(f"d.alloc({n})") for n in sizes]
    assert w.call("d.launch()") == 0
    taken = w.stats()["working_set"]
    wait_for_status(scheduler.socket, lambda doc: working_set_in(doc, w) == taken,
                    what="the working set report")
    return pointers


def evicted_by_next(scheduler, w, check=None) -> Any:
    """Another client that needs the whole GPU asks for it: w is dropped and must evict. check,
    called while the other holds, says what the card looks like then."""
    with other_client(scheduler, "next", 8 * GiB) as next_holder:
        next_holder.acquire(timeout=scaled(30))
        return check() if check else None


def holds(w, ptr: int, data: bytes) -> bool:
    """Whether the device memory at ptr holds data (read through the shim: a read waits for
    the GPU, and so for the restore)."""
    return bool(w.call(f"d.read({ptr}, {len(data)}) == {data!r}"))


def pattern(seed: int, n: int) -> bytes:
    return bytes((seed * 31 + i * 7) & 0xFF for i in range(n))


# ---- allocations ---------------------------------------------------------------------------

def test_an_allocation_is_reserved_addresses_backed_by_a_physical_handle(workload, card) -> None:
    w = vmm(workload, card)
    ptr = w.call(f"d.alloc({8 * MiB})")
    reserve, = w.log.calls("cuMemAddressReserve")
    assert int(field(reserve, "ptr"), 16) == ptr and int(field(reserve, "size")) == 8 * MiB
    assert sizes_of(w.log.calls("cuMemCreate")) == [8 * MiB]
    mapped, = w.log.calls("cuMemMap")
    assert int(field(mapped, "ptr"), 16) == ptr
    access, = w.log.calls("cuMemSetAccess")
    assert field(access, "flags") == "3" and field(access, "result") == "0"  # read-write
    assert not w.log.calls("cuMemAlloc_v2") and not w.log.calls("cuMemAllocManaged")
    assert card.used_by(w.process.pid) == 8 * MiB
    assert w.call(f"d.write({ptr + 5}, b'device')") == 0
    assert holds(w, ptr + 5, b"device")
    stats = w.stats()
    assert stats["evict"] == "vmm"
    assert (stats["working_set"], stats["evictable"], stats["resident"]) == (8 * MiB,) * 3


def test_a_large_allocation_is_cut_into_chunks_of_at_most_256_mib(workload, card) -> None:
    w = vmm(workload, card)
    w.call(f"d.alloc({256 * MiB})")
    assert sizes_of(w.log.calls("cuMemCreate")) == [256 * MiB]  # one handle up to 256 MiB
    w.log.clear()
    ptr = w.call(f"d.alloc({600 * MiB + 4096})")
    reserve, = w.log.calls("cuMemAddressReserve")
    assert int(field(reserve, "size")) == 602 * MiB  # whole granules
    chunks = sizes_of(w.log.calls("cuMemCreate"))
    assert sum(chunks) == 602 * MiB and len(chunks) == 3
    assert all(64 * MiB <= size <= 256 * MiB for size in chunks)
    starts = [int(field(line, "ptr"), 16) - ptr for line in w.log.calls("cuMemMap")]
    assert starts == [0, chunks[0], chunks[0] + chunks[1]]
    assert card.used_by(w.process.pid) == (256 + 602) * MiB


def test_small_allocations_share_a_slab(workload, card) -> None:
    w = vmm(workload, card)
    small = [w.call(f"d.alloc({n})") for n in (4096, 100_000, 1)]
    assert sizes_of(w.log.calls("cuMemCreate")) == [2 * MiB]  # one slab for all three
    assert all(p % 512 == 0 for p in small) and len(set(small)) == 3
    assert max(small) - min(small) < 2 * MiB
    for i, p in enumerate(small):
        assert w.call(f"d.write({p}, bytes([{i + 1}]))") == 0
    assert all(holds(w, p, bytes([i + 1])) for i, p in enumerate(small))
    w.call(f"d.alloc({1 * MiB})")  # from 1 MiB on, a region of its own
    assert sizes_of(w.log.calls("cuMemCreate")) == [2 * MiB, 2 * MiB]
    assert w.stats()["working_set"] == 4 * MiB  # what the card holds: a slab, and a region
    assert w.call(f"d.free({small[1]})") == 0  # its units go back to the slab
    again = w.call(f"d.alloc({50_000})")
    assert again == small[1] and len(w.log.calls("cuMemCreate")) == 2


def test_the_working_set_is_what_the_card_holds_not_the_bytes_asked_for(scheduler, workload,
                                                                         card) -> None:
    """Arrays of 1-2 MiB take a 2 MiB region each, small ones a slab: the daemon plans with
    what the card holds (issue 39, defect 8)."""
    w = vmm(workload, card, scheduler.socket)
    hold_with(w, scheduler, [MiB + MiB // 2, 3 * MiB + 5] + [4096] * 100)
    assert card.used_by(w.process.pid) == 2 * MiB + 4 * MiB + 2 * MiB
    assert client_of(scheduler, w)["working_set"] == 8 * MiB
    stats = w.stats()
    assert (stats["working_set"], stats["evictable"]) == (8 * MiB, 8 * MiB)


def test_the_memory_limit_counts_what_the_card_holds(workload, card) -> None:
    w = vmm(workload, card, KIWI_GPU_MEMORY_LIMIT=str(8 * MiB))
    for _ in range(4):  # 6 MiB asked for, 8 MiB taken
        w.call(f"d.alloc({MiB + MiB // 2})")
    assert w.call("d.mem_info()") == [0, 8 * MiB]
    assert w.call(f"d.alloc_result({MiB})") == 2  # CUDA_ERROR_OUT_OF_MEMORY


def test_pitched_and_stream_ordered_allocations_are_mapped_too(workload, card) -> None:
    w = vmm(workload, card)
    ptr, pitch = w.call("d.alloc_pitch(4000, 1000)")
    assert pitch == 4096
    asynchronous = w.call(f"d.alloc_async({3 * MiB})")
    assert not w.log.calls("cuMemAllocPitch_v2") and not w.log.calls("cuMemAllocAsync")
    assert sizes_of(w.log.calls("cuMemCreate")) == [4 * MiB, 4 * MiB]
    assert {ptr, asynchronous} == {int(field(line, "ptr"), 16)
                                   for line in w.log.calls("cuMemMap")}


def test_managed_memory_the_program_asks_for_stays_managed(workload, card) -> None:
    w = vmm(workload, card)
    w.call(f"d.alloc({2 * MiB})")
    w.log.clear()
    w.call(f"d.alloc_managed({4 * MiB})")
    assert w.log.calls("cuMemAllocManaged") and not w.log.calls("cuMemCreate")
    stats = w.stats()
    assert stats["evict"] == "vmm" and stats["evictable"] == 6 * MiB


def test_the_programs_own_vmm_handles_are_counted_and_not_evictable(workload, card) -> None:
    w = vmm(workload, card)
    w.call(f"d.alloc({4 * MiB})")
    w.call(f"d.alloc_vmm({2 * MiB})")
    stats = w.stats()
    assert (stats["working_set"], stats["evictable"], stats["resident"]) == (
        6 * MiB, 4 * MiB, 4 * MiB)
    assert card.used_by(w.process.pid) == 6 * MiB


# ---- eviction and restore -----------------------------------------------------------------

def test_an_evicted_process_leaves_the_card_free_by_the_drivers_own_count(
        scheduler, workload, card) -> None:
    w = vmm(workload, card, scheduler.socket)
    hold_with(w, scheduler, [24 * MiB, 24 * MiB])
    assert card.used_by(w.process.pid) == 48 * MiB
    on_card = evicted_by_next(scheduler, w, lambda: (card.used_by(w.process.pid), card.used()))
    assert on_card == (0, 0)
    names = w.log.names()
    evicting = after(names, "cuCtxSynchronize")
    assert evicting.count("cuMemUnmap") == 2 and evicting.count("cuMemRelease") == 2
    first_unmap = evicting.index("cuMemUnmap")
    assert evicting[:first_unmap].count("cuMemcpyDtoHAsync_v2") >= 1  # copied before unmapped
    stats = w.stats()
    assert (stats["evictions"], stats["bytes_evicted"], stats["evicted"]) == (1, 48 * MiB, True)
    assert (stats["resident"], stats["host"]) == (0, 48 * MiB)
    assert stats["working_set"] == 48 * MiB  # still the process's memory, in host memory now


def test_the_way_out_copies_on_two_streams_and_releases_each_chunk_after_its_copy(
        scheduler, workload, card) -> None:
    w = vmm(workload, card, scheduler.socket)
    hold_with(w, scheduler, [8 * MiB] * 4)
    w.log.clear()
    evicted_by_next(scheduler, w)
    copies = w.log.calls("cuMemcpyDtoHAsync_v2")
    assert len(copies) == 4 and len({field(line, "stream") for line in copies}) == 2
    lines = w.log.lines()
    for copy in copies:  # each chunk: its copy, an event on the copy's stream, then the unmap
        source = field(copy, "src")
        i = lines.index(copy)
        unmap = next(j for j, line in enumerate(lines)
                     if line.startswith("cuMemUnmap ") and field(line, "ptr") == source)
        recorded = [line for line in lines[i:unmap] if line.startswith("cuEventRecord ")]
        assert recorded and field(recorded[0], "stream") == field(copy, "stream")
        assert any(line.startswith("cuEventSynchronize ") for line in lines[i:unmap])


def test_addresses_and_contents_survive_eviction_cycles(scheduler, workload, card) -> None:
    w = vmm(workload, card, scheduler.socket)
    sizes = [24 * MiB, 3 * MiB, 4096, 700]
    pointers = hold_with(w, scheduler, sizes)
    for i, (ptr, size) in enumerate(zip(pointers, sizes, strict=True)):
        for offset in {0, size // 2, size - 64}:
            assert w.call(f"d.write({ptr + offset}, {pattern(i + offset, 64)!r})") == 0
    reserved = len(w.log.calls("cuMemAddressReserve"))
    for cycle in range(3):
        assert evicted_by_next(scheduler, w, lambda: card.used_by(w.process.pid)) == 0
        # The first read waits for the GPU, and so for the restore.
        for i, (ptr, size) in enumerate(zip(pointers, sizes, strict=True)):
            for offset in {0, size // 2, size - 64}:
                assert holds(w, ptr + offset, pattern(i + offset, 64)), (
                    f"cycle {cycle}: allocation {i} at offset {offset}")
        assert card.used_by(w.process.pid) == 24 * MiB + 4 * MiB + 2 * MiB  # 3 regions
    assert len(w.log.calls("cuMemAddressReserve")) == reserved  # never new addresses
    remapped = {int(field(line, "ptr"), 16) for line in w.log.calls("cuMemMap")}
    assert set(pointers[:2]) <= remapped
    stats = w.stats()
    assert (stats["evictions"], stats["restores"], stats["evicted"]) == (3, 4, False)


def test_a_restore_maps_and_copies_back_before_work_resumes(scheduler, workload, card) -> None:
    w = vmm(workload, card, scheduler.socket)
    ptr, = hold_with(w, scheduler, [16 * MiB])
    w.call(f"d.write({ptr}, b'kept')")
    with other_client(scheduler, "next", 8 * GiB) as next_holder:
        next_holder.acquire(timeout=scaled(30))
        w.log.clear()
        launch = w.start(f"d.launch_fill({ptr + 8 * MiB}, 4, 5)")
        wait_for(lambda: state_of(scheduler, w) == "waiting", what="the shim to queue")
        assert not w.log.calls("cuMemCreate")  # nothing comes back while the other holds
    assert launch.result() == 0
    names = w.log.names()
    restore = names[:names.index("cuLaunchKernel")]
    assert restore.index("cuMemCreate") < restore.index("cuMemMap") < restore.index(
        "cuMemSetAccess") < restore.index("cuMemcpyHtoDAsync_v2")
    assert "cuStreamSynchronize" in restore[restore.index("cuMemcpyHtoDAsync_v2"):]
    assert holds(w, ptr, b"kept")
    assert holds(w, ptr + 8 * MiB, b"\x05" * 4 + b"\x00")


def test_shadows_are_built_ahead_and_never_pinned_on_the_way_out(scheduler, workload,
                                                                   card) -> None:
    w = vmm(workload, card, scheduler.socket)
    hold_with(w, scheduler, [24 * MiB, 8 * MiB])
    wait_for(lambda: w.stats()["host_shadow_pinned"] == 32 * MiB,
             what="the shadows to be pinned in the background")
    staging = w.stats()["host_staging"]  # the ring, pinned first (test_vmm_shadows.py)
    assert sorted(sizes_of(w.log.calls("cuMemHostRegister_v2"))) == sorted(
        [staging, 24 * MiB, 8 * MiB])
    w.log.clear()
    evicted_by_next(scheduler, w)
    w.call("d.launch()")  # and back
    for pinning in ("cuMemHostRegister_v2", "cuMemAllocHost_v2", "cuMemHostUnregister",
                    "cuMemFreeHost"):
        assert not w.log.calls(pinning), pinning
    stats = w.stats()
    assert stats["host_shadow"] == stats["host_shadow_pinned"] == 32 * MiB  # kept for next time
    destinations = {field(line, "dst") for line in w.log.calls("cuMemcpyDtoHAsync_v2")}
    assert len(destinations) == 2


def test_shadows_fall_back_to_the_drivers_pinned_memory(workload, card) -> None:
    w = vmm(workload, card, FAKE_CUDA_NO_HOST_REGISTER="1")
    w.call(f"d.alloc({4 * MiB})")
    wait_for(lambda: w.stats()["host_shadow_pinned"] == 4 * MiB, what="a pinned shadow")
    assert sizes_of(w.log.calls("cuMemAllocHost_v2")) == [w.stats()["host_staging"], 4 * MiB]


def test_blocks_the_frameworks_cache_holds_free_are_released_without_a_copy(
        scheduler, workload, card) -> None:
    w = vmm(workload, card, scheduler.socket)
    ptr, = hold_with(w, scheduler, [64 * MiB])
    w.call(f"d.write({ptr}, b'head')")
    w.call(f"d.write({ptr + 60 * MiB}, b'tail')")
    w.call("shim.free_ranges_begin()")
    assert w.call(f"shim.set_free_ranges([({ptr + 16 * MiB}, {32 * MiB})])") == 32 * MiB
    w.log.clear()
    assert evicted_by_next(scheduler, w, lambda: card.used_by(w.process.pid)) == 0
    assert copied(w.log.calls("cuMemcpyDtoHAsync_v2")) == 32 * MiB
    stats = w.stats()
    assert (stats["bytes_evicted"], stats["bytes_skipped"], stats["bytes_discarded"]) == (
        32 * MiB, 32 * MiB, 32 * MiB)
    assert holds(w, ptr, b"head") and holds(w, ptr + 60 * MiB, b"tail")
    assert copied(w.log.calls("cuMemcpyHtoDAsync_v2")) == 32 * MiB


def test_slabs_move_only_what_is_allocated_in_them(scheduler, workload, card) -> None:
    w = vmm(workload, card, scheduler.socket)
    hold_with(w, scheduler, [4096, 1000])
    w.log.clear()
    evicted_by_next(scheduler, w)
    assert copied(w.log.calls("cuMemcpyDtoHAsync_v2")) == 4096 + 1000
    assert card.used_by(w.process.pid) == 0


def test_allocations_of_every_size_keep_their_bytes_through_churn_and_evictions(
        scheduler, workload, card) -> None:
    w = vmm(workload, card, scheduler.socket)
    assert w.call("d.launch()") == 0  # holds
    for round_ in range(3):
        assert w.call(f"churn({round_}, 150)") > 0
        assert evicted_by_next(scheduler, w, lambda: card.used_by(w.process.pid)) == 0
        assert w.call("unchanged()") == [], f"round {round_}"  # the first read restores
    w.call("free_all()")
    assert w.stats()["working_set"] == 0
    evicted_by_next(scheduler, w)  # and what was kept for reuse goes too
    assert card.used_by(w.process.pid) == 0


# ---- frees ---------------------------------------------------------------------------------

def test_a_free_waits_for_the_gpu_then_unmaps_and_releases(workload, card) -> None:
    w = vmm(workload, card)
    ptr = w.call(f"d.alloc({300 * MiB})")  # two chunks: never kept for reuse
    w.log.clear()
    assert w.call(f"d.free({ptr})") == 0
    names = w.log.names()
    assert names.index("cuCtxSynchronize") < names.index("cuMemUnmap")
    assert names.count("cuMemRelease") == 2 and "cuMemAddressFree" in names
    assert card.used_by(w.process.pid) == 0
    assert w.stats()["working_set"] == 0


def test_a_freed_region_is_kept_for_the_next_allocation_of_its_size_until_an_eviction(
        scheduler, workload, card) -> None:
    w = vmm(workload, card, scheduler.socket)
    first, = hold_with(w, scheduler, [24 * MiB])
    assert w.call(f"d.free({first})") == 0
    assert card.used_by(w.process.pid) == 24 * MiB  # kept mapped
    created = len(w.log.calls("cuMemCreate"))
    assert w.call(f"d.alloc({24 * MiB})") == first
    assert len(w.log.calls("cuMemCreate")) == created
    assert w.call(f"d.free({first})") == 0
    evicted_by_next(scheduler, w)
    assert card.used_by(w.process.pid) == 0 and w.stats()["bytes_evicted"] == 0


def test_a_free_while_evicted_drops_the_shadow_and_the_addresses(scheduler, workload,
                                                                   card) -> None:
    w = vmm(workload, card, scheduler.socket)
    kept, gone = hold_with(w, scheduler, [24 * MiB, 16 * MiB])
    w.call(f"d.write({kept}, b'kept')")
    with other_client(scheduler, "next", 8 * GiB) as next_holder:
        next_holder.acquire(timeout=scaled(30))
        assert w.stats()["host"] == 40 * MiB
        w.log.clear()
        assert w.call(f"d.free({gone})") == 0  # no GPU needed: it returns while another holds
        assert w.log.calls("cuMemAddressFree") and not w.log.calls("cuMemUnmap")
        assert w.stats()["host"] == 24 * MiB and card.used_by(w.process.pid) == 0
    assert holds(w, kept, b"kept")
    assert card.used_by(w.process.pid) == 24 * MiB


def test_a_stream_ordered_free_is_reclaimed_once_its_event_completes(workload, card,
                                                                      tmp_path: Path) -> None:
    done = tmp_path / "stream-done"
    w = vmm(workload, card, FAKE_CUDA_PENDING_STREAM="0x77", FAKE_CUDA_PENDING_UNTIL=str(done))
    ptr = w.call(f"d.alloc_async({300 * MiB}, stream=0x77)")
    pool = w.call("d.device_pool()")
    w.log.clear()
    assert w.call(f"d.free_async({ptr}, stream=0x77)") == 0  # returns at once
    recorded = w.log.calls("cuEventRecord")
    assert recorded and field(recorded[0], "stream") == "0x77"
    assert not w.log.calls("cuMemUnmap")
    assert card.used_by(w.process.pid) == 320 * MiB  # the stream may still use it (its class)
    assert w.call(f"d.pool_attribute({pool}, {USED_MEM_CURRENT})") == 0
    assert w.call(f"d.pool_attribute({pool}, {RESERVED_MEM_CURRENT})") == 300 * MiB
    w.call(f"d.alloc({4096})")
    assert not w.log.calls("cuMemUnmap")  # still not done
    done.touch()
    w.call(f"d.alloc({4096})")  # allocations reclaim what is done
    unmapped = {int(field(line, "ptr"), 16) for line in w.log.calls("cuMemUnmap")}
    assert ptr in unmapped
    assert card.used_by(w.process.pid) == 2 * MiB  # the slab of the two small ones
    assert w.call(f"d.pool_attribute({pool}, {RESERVED_MEM_CURRENT})") == 0
    assert w.call(f"d.pool_attribute({pool}, {RESERVED_MEM_HIGH})") == 300 * MiB


def test_the_pools_counters_are_the_shims(workload, card) -> None:
    w = vmm(workload, card)
    pool = w.call("d.device_pool()")
    a = w.call(f"d.alloc_async({4 * MiB})")
    w.call(f"d.alloc_async({8 * MiB})")
    assert w.call(f"d.pool_attribute({pool}, {USED_MEM_CURRENT})") == 12 * MiB
    assert w.call(f"d.free_async({a})") == 0
    assert w.call(f"d.pool_attribute({pool}, {USED_MEM_CURRENT})") == 8 * MiB
    assert w.call(f"d.pool_attribute({pool}, {USED_MEM_HIGH})") == 12 * MiB
    assert w.call(f"d.reset_pool_high({pool}, {USED_MEM_HIGH})") == 0
    assert w.call(f"d.pool_attribute({pool}, {USED_MEM_HIGH})") == 8 * MiB
    other = 0x9999  # a pool the program made itself
    w.call(f"d.alloc_from_pool({2 * MiB}, pool={other})")
    assert w.call(f"d.pool_attribute({other}, {USED_MEM_CURRENT})") == 2 * MiB
    assert w.call(f"d.pool_attribute({pool}, {USED_MEM_CURRENT})") == 8 * MiB


# ---- graph capture -------------------------------------------------------------------------

def test_a_free_during_graph_capture_waits_for_the_next_release(scheduler, workload,
                                                                card) -> None:
    w = vmm(workload, card, scheduler.socket)
    ptr, = hold_with(w, scheduler, [300 * MiB])
    w.call("shim.cell_begin()")
    assert w.call("d.begin_capture(0x66)") == 0
    w.log.clear()
    assert w.call(f"d.free({ptr})") == 0
    assert not w.log.calls("cuCtxSynchronize")  # it would invalidate the capture
    assert not w.log.calls("cuMemUnmap") and card.used_by(w.process.pid) == 300 * MiB
    assert w.call("d.end_capture(0x66)") == 0  # the capture is intact
    assert w.stats()["working_set"] == 300 * MiB  # still on the card, as the daemon is told
    w.call("shim.release()")
    wait_for(lambda: w.log.calls("cuMemUnmap"), what="the release to free it")
    names = w.log.names()
    assert names.index("cuCtxSynchronize") < names.index("cuMemUnmap")
    assert card.used_by(w.process.pid) == 0
    assert w.stats()["working_set"] == 0


def test_stream_ordered_memory_under_capture_is_the_drivers_and_not_evictable(
        workload, card) -> None:
    w = vmm(workload, card, FAKE_CUDA_CAPTURING_STREAM="0x66")
    w.call(f"d.alloc({4 * MiB})")
    captured = w.call(f"d.alloc_async({2 * MiB}, stream=0x66)")
    assert w.log.calls("cuMemAllocAsync") and len(w.log.calls("cuMemCreate")) == 1
    assert w.stats()["evictable"] == 4 * MiB
    mapped = w.call(f"d.alloc_async({2 * MiB}, stream=0x77)")
    w.log.clear()
    assert w.call(f"d.free_async({mapped}, stream=0x66)") == 0  # a captured free: kept
    assert not w.log.calls("cuEventRecord") and not w.log.calls("cuMemUnmap")
    assert w.call(f"d.free_async({captured}, stream=0x66)") == 0
    assert w.log.calls("cuMemFreeAsync")  # the driver's own, in the graph


# ---- a restore without room ----------------------------------------------------------------

def rolled_back_whole(lines: list[str]) -> list[int]:
    """For each restore that ran out of memory (a cuMemCreate refused with 2), how many chunks
    it had mapped; and each of those is unmapped again before any other chunk is mapped."""
    mapped: set[str] = set()
    counts = []
    rolling_back: set[str] = set()
    for line in lines:
        name = line.split(" ", 1)[0]
        if name == "cuMemMap" and field(line, "result") == "0":
            assert not rolling_back, f"mapped again before {rolling_back} were unmapped"
            mapped.add(field(line, "ptr"))
        elif name == "cuMemUnmap" and field(line, "result") == "0":
            mapped.discard(field(line, "ptr"))
            rolling_back.discard(field(line, "ptr"))
        elif name == "cuMemCreate" and field(line, "result") == "2":
            counts.append(len(mapped))
            rolling_back = set(mapped)
    assert not rolling_back
    return counts


def test_a_restore_without_room_rolls_back_and_tries_again_later(scheduler, workload,
                                                                 card) -> None:
    w = vmm(workload, card, scheduler.socket, FAKE_CUDA_TOTAL=str(256 * MiB))
    first, second = hold_with(w, scheduler, [32 * MiB, 32 * MiB])
    w.call(f"d.write({second + 31 * MiB}, b'intact')")
    other = workload(KIWI_SHIM="0", FAKE_CUDA_TOTAL=str(256 * MiB), **card.env)
    other.call("globals().__setitem__('v', __import__('vmm_calls').Calls(sys.argv[1]))")
    with other_client(scheduler, "next", 8 * GiB) as next_holder:
        next_holder.acquire(timeout=scaled(30))
        assert card.used_by(w.process.pid) == 0
        # Another process, not scheduled by Kiwi, takes most of the card meanwhile: room for
        # one of the two chunks, not both.
        taken = other.call(f"v.backed({200 * MiB}, {8 * MiB})")
        w.log.clear()
        launch = w.start("d.launch()")
        wait_for(lambda: state_of(scheduler, w) == "waiting", what="the shim to queue")
    wait_for(lambda: w.stats()["restore_failures"] >= 2, what="restores to fail, twice")
    assert not launch.done()
    other.call(f"v.unmap({taken}, {200 * MiB})")
    assert launch.result(timeout=30) == 0  # asked again after a while, and restored
    counts = rolled_back_whole(w.log.lines())
    assert len(counts) >= 2 and counts[0] == 1  # the first chunk fitted, and was taken off
    assert holds(w, second + 31 * MiB, b"intact")
    assert card.used_by(w.process.pid) == 64 * MiB and w.stats()["evicted"] is False


# ---- memory that stays where it is ---------------------------------------------------------

def test_a_retained_handle_keeps_its_memory_on_the_card(scheduler, workload, card) -> None:
    w = vmm(workload, card, scheduler.socket)
    exported, moved = hold_with(w, scheduler, [8 * MiB, 16 * MiB])
    assert w.call(f"d.retain({exported})") == 0  # an export, an NCCL registration
    stats = w.stats()
    assert (stats["working_set"], stats["evictable"]) == (24 * MiB, 16 * MiB)
    evicted_by_next(scheduler, w)
    assert card.used_by(w.process.pid) == 8 * MiB and w.stats()["host"] == 16 * MiB


def test_peers_the_program_enabled_get_access_to_every_mapping(scheduler, workload,
                                                               card) -> None:
    w = vmm(workload, card, scheduler.socket, FAKE_CUDA_DEVICES="2")
    ptr, = hold_with(w, scheduler, [8 * MiB])
    assert all(field(line, "count") == "1" for line in w.log.calls("cuMemSetAccess"))
    w.log.clear()
    assert w.call(f"d.set_context({0xC0DE01})") == 0  # device 1's context
    assert w.call(f"d.enable_peer({PRIMARY})") == 0  # may reach device 0's memory
    assert w.call(f"d.set_context({PRIMARY})") == 0
    granted, = w.log.calls("cuMemSetAccess")
    assert int(field(granted, "ptr"), 16) == ptr and field(granted, "count") == "2"
    evicted_by_next(scheduler, w)
    w.log.clear()
    assert w.call("d.launch()") == 0
    restored, = w.log.calls("cuMemSetAccess")
    assert field(restored, "count") == "2"


def test_memory_of_a_context_that_ends_leaves_the_card(workload, card) -> None:
    w = vmm(workload, card)
    assert w.call("d.set_context(0xABC)") == 0
    w.call(f"d.alloc({8 * MiB})")
    w.call(f"d.alloc({1000})")
    assert card.used_by(w.process.pid) == 10 * MiB
    assert w.call("d.destroy_context(0xABC)") == 0
    assert card.used_by(w.process.pid) == 0 and w.stats()["working_set"] == 0


# ---- selection -----------------------------------------------------------------------------

def test_auto_chooses_vmm_where_the_device_supports_it_and_the_daemon_says_so(
        scheduler, workload, card) -> None:
    w = workload(KIWI_SOCKET=scheduler.socket, KIWI_EVICT="auto", **card.env)
    w.call(f"d.alloc({4 * MiB})")
    assert w.stats()["evict"] == "vmm"
    assert w.log.calls("cuMemCreate") and not w.log.calls("cuMemAllocManaged")
    wait_for(lambda: client_of(scheduler, w) is not None, what="the registration")
    assert client_of(scheduler, w)["evict"] == "vmm"


def test_auto_chooses_managed_on_a_device_without_vmm(scheduler, workload) -> None:
    w = workload(KIWI_SOCKET=scheduler.socket, KIWI_EVICT="auto", FAKE_CUDA_NO_VMM="1")
    w.call(f"d.alloc({4 * MiB})")
    assert w.stats()["evict"] == "managed"
    assert w.log.calls("cuMemAllocManaged") and not w.log.calls("cuMemCreate")
    # The device was asked (auto on this same fake with VMM: the test above).
    asked = w.log.calls("cuDeviceGetAttribute")
    assert any(field(line, "attribute") == "102" and field(line, "value") == "0"
               for line in asked)


def test_vmm_asked_on_a_device_without_it_is_managed_and_says_why(workload) -> None:
    w = workload(KIWI_EVICT="vmm", FAKE_CUDA_NO_VMM="1", KIWI_SOCKET="/nonexistent/kiwi.sock",
                 KIWI_FAIL_TIMEOUT="0")
    w.call(f"d.alloc({4 * MiB})")
    assert w.stats()["evict"] == "managed"
    # stderr is read by a thread of the harness: the line comes when it comes.
    wait_for(lambda: any("virtual memory management" in line for line in w.stderr),
             what="the warning that the device lacks VMM")


def test_vmm_and_managed_are_each_chosen_by_name_where_vmm_is_supported(workload,
                                                                       card) -> None:
    chosen = {}
    for evict in ("vmm", "managed"):
        w = workload(KIWI_EVICT=evict, KIWI_SOCKET="/nonexistent/kiwi.sock",
                     KIWI_FAIL_TIMEOUT="0", **card.env)
        w.call(f"d.alloc({4 * MiB})")
        chosen[evict] = (w.stats()["evict"], len(w.log.calls("cuMemCreate")),
                         len(w.log.calls("cuMemAllocManaged")))
    assert chosen == {"vmm": ("vmm", 1, 0), "managed": ("managed", 0, 1)}


class OldDaemon:
    """A daemon from before the vmm evictor, scripted on a real socket: it refuses
    ``evict: vmm`` as the scheduler did (an invalid value) and takes ``managed``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.registers: list[dict[str, Any]] = []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(1)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        connection, _ = self.server.accept()
        lines = connection.makefile("r")
        for line in lines:
            msg = json.loads(line)
            if msg["op"] == "hello":
                reply = {"op": "welcome", "version": 1, "features": []}
            elif msg["op"] == "register":
                self.registers.append(msg)
                if msg.get("evict") == "vmm":
                    reply = {"op": "error", "seq": msg["seq"], "code": "invalid",
                             "message": "evict must be one of managed, checkpoint"}
                else:
                    reply = {"op": "registered", "seq": msg["seq"], "client": "c1", "gpu": 0,
                             "mode": "on", "tq": 30, "evict": "managed"}
            else:
                reply = {"op": "ok", "seq": msg.get("seq")}
            connection.sendall((json.dumps(reply) + "\n").encode())


@pytest.fixture
def old_daemon(tmp_path: Path) -> Iterator[OldDaemon]:
    daemon = OldDaemon(tmp_path / "old.sock")
    yield daemon
    daemon.server.close()


def test_a_daemon_that_predates_vmm_hears_managed_and_the_shim_still_pages_itself(
        old_daemon, workload, card) -> None:
    w = vmm(workload, card, str(old_daemon.path))
    w.call(f"d.alloc({4 * MiB})")
    wait_for(lambda: w.stats()["connected"], what="the registration")
    assert [r["evict"] for r in old_daemon.registers] == ["vmm", "managed"]
    assert w.stats()["evict"] == "vmm" and w.log.calls("cuMemCreate")


# ---- two processes, room for one -----------------------------------------------------------

def test_two_processes_alternating_with_room_for_one_leave_one_resident_at_a_time(
        start_daemon, workload, card) -> None:
    working_set = 48 * MiB
    # The daemon is told one working set fits and two do not (besides its 512 MiB reserve).
    daemon = start_daemon("--tq", "0.05", "--gpus", "1", "--gpu-memory",
                          str(working_set + 512 * MiB + working_set // 2), "--grace", "30")
    pair = [vmm(workload, card, daemon.socket, KIWI_CLIENT_NAME=name) for name in ("a", "b")]
    pointers = []
    for i, w in enumerate(pair):
        pointers.append(w.call(f"d.alloc({working_set})"))
        assert w.call(f"d.write({pointers[i]}, b'process {i}')") == 0
        wait_for_status(daemon.socket, lambda doc, w=w: working_set_in(doc, w) == working_set,
                        what="the report")
    for turn in range(1, 7):  # b holds now (it wrote last), and a was evicted for it
        now, idle = pair[turn % 2], pair[(turn + 1) % 2]
        assert now.call("d.launch()") == 0  # the other is dropped, and must evict first
        rows = (card.used_by(now.process.pid), card.used_by(idle.process.pid))
        assert rows == (working_set, 0), f"turn {turn}: {rows}"
        assert holds(now, pointers[turn % 2], f"process {turn % 2}".encode())
    assert all(p.stats()["evictions"] >= 3 for p in pair)
