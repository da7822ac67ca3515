"""Questions about an address under the vmm evictor (issue 39, defects 1 and 11): what the
program is told of its memory is what the driver would say of the allocation it asked for, never
of the chunk or slab the shim put it in, and never "not mapped" because it is evicted.

Triton's launcher asks cuPointerGetAttribute(DEVICE_POINTER) for every tensor argument and gives
up on CUDA_ERROR_INVALID_VALUE; PyTorch's getDeviceFromPtr reads cuPointerGetAttributes's memory
type; NCCL, UCX and libfabric register cuMemGetAddressRange's range and key their caches by
BUFFER_ID. Each is asked here of a shimmed process over the fake driver, whose model answers as
the driver does (tests/shim/fake_cuda.c: an address reserved but not mapped fails).
"""

from __future__ import annotations

import pytest
from fake_device import FakeCard
from support import scaled, wait_for
from test_scheduling import other_client, state_of
from test_vmm_evictor import PRIMARY, GiB, MiB, hold_with, vmm
from vmm_calls import INVALID_VALUE

#: What torch.as_tensor of a CuPy array, or cudaPointerGetAttributes, asks in one call.
RUNTIME_ASKS = ["CONTEXT", "MEMORY_TYPE", "DEVICE_POINTER", "IS_MANAGED", "DEVICE_ORDINAL"]


def evicted(scheduler, w, sizes: list[int]):
    """w holds allocations of sizes, then another client takes the whole GPU: w's memory is
    evicted. Returns (pointers, the other client, holding)."""
    pointers = hold_with(w, scheduler, sizes)
    next_holder = other_client(scheduler, "next", 8 * GiB)
    next_holder.acquire(timeout=scaled(30))
    return pointers, next_holder


def test_a_query_on_evicted_memory_waits_for_the_restore_then_answers(
        scheduler, workload, card: FakeCard) -> None:
    """As Triton's launcher asks before a launch: the answer comes once the memory is back."""
    w = vmm(workload, card, scheduler.socket)
    (ptr,), next_holder = evicted(scheduler, w, [16 * MiB])
    with next_holder:
        assert card.used_by(w.process.pid) == 0
        asked = w.start(f"d.pointer.attribute({ptr + 4096}, 'DEVICE_POINTER')")
        wait_for(lambda: state_of(scheduler, w) == "waiting", what="the query to wait")
        assert not asked.done()
    assert asked.result() == [0, ptr + 4096]
    assert card.used_by(w.process.pid) == 16 * MiB  # restored before the answer


#: (query of ptr, what it answers once the memory is back)
QUERIES = {
    "attributes": (f"d.pointer.attributes({{ptr}}, {RUNTIME_ASKS!r})",
                   lambda ptr: [0, {"CONTEXT": PRIMARY, "MEMORY_TYPE": 2, "DEVICE_POINTER": ptr,
                                    "IS_MANAGED": False, "DEVICE_ORDINAL": 0}]),
    "address_range": ("d.pointer.address_range({ptr} + 100)",
                      lambda ptr: [0, ptr, 16 * MiB]),
    "mapped": ("d.pointer.attribute({ptr}, 'MAPPED')", lambda ptr: [0, True]),
    "sync_memops": ("d.pointer.sync_memops({ptr})", lambda ptr: 0),
}


@pytest.mark.parametrize("query", sorted(QUERIES))
def test_every_address_query_on_evicted_memory_answers_as_if_it_were_there(
        scheduler, workload, card: FakeCard, query: str) -> None:
    expression, expected = QUERIES[query]
    w = vmm(workload, card, scheduler.socket)
    (ptr,), next_holder = evicted(scheduler, w, [16 * MiB])
    with next_holder:
        asked = w.start(expression.format(ptr=ptr))
        wait_for(lambda: state_of(scheduler, w) == "waiting", what="the query to wait")
    assert asked.result() == expected(ptr)


def test_ranges_are_the_allocations_not_the_slabs_or_the_chunks(workload, card: FakeCard) -> None:
    w = vmm(workload, card)
    small = w.call(f"d.alloc({4096})")
    beside = w.call(f"d.alloc({1000})")  # in the same slab
    large = w.call(f"d.alloc({600 * MiB + 4096})")  # three chunks
    assert w.call(f"d.pointer.address_range({small + 100})") == [0, small, 4096]
    assert w.call(f"d.pointer.address_range({beside})") == [0, beside, 1000]
    assert w.call(f"d.pointer.address_range({large + 500 * MiB})") == [0, large, 600 * MiB + 4096]
    for name, value in (("RANGE_START_ADDR", small), ("RANGE_SIZE", 4096),
                        ("MAPPING_BASE_ADDR", small), ("MAPPING_SIZE", 4096)):
        assert w.call(f"d.pointer.attribute({small + 8}, {name!r})") == [0, value], name
    assert w.call(f"d.pointer.attribute({large + 300 * MiB}, 'RANGE_SIZE')") == [
        0, 600 * MiB + 4096]


def test_memory_the_program_allocated_answers_as_cuMemAlloc_memory_would(
        workload, card: FakeCard) -> None:
    w = vmm(workload, card)
    ptr = w.call(f"d.alloc({8 * MiB})")
    assert w.call(f"d.pointer.attributes({ptr + 1}, {RUNTIME_ASKS})") == [0, {
        "CONTEXT": PRIMARY, "MEMORY_TYPE": 2, "DEVICE_POINTER": ptr + 1, "IS_MANAGED": False,
        "DEVICE_ORDINAL": 0}]  # the driver says of the mapping: context none
    assert w.call(f"d.pointer.attribute({ptr}, 'IS_LEGACY_CUDA_IPC_CAPABLE')") == [0, True]
    assert w.call(f"d.pointer.attribute({ptr}, 'ALLOWED_HANDLE_TYPES')") == [0, 0]
    assert w.call(f"d.pointer.attribute({ptr}, 'HOST_POINTER')") == [INVALID_VALUE, None]
    assert w.call(f"d.pointer.attribute({ptr}, 'ACCESS_FLAGS')") == [0, 3]  # the driver's


def test_a_stream_ordered_allocation_has_its_pool_and_no_context(workload, card: FakeCard) -> None:
    w = vmm(workload, card)
    ptr = w.call(f"d.alloc_from_pool({2 * MiB}, pool=0x9999)")
    assert w.call(f"d.pointer.attribute({ptr}, 'MEMPOOL_HANDLE')") == [0, 0x9999]
    assert w.call(f"d.pointer.attribute({ptr}, 'CONTEXT')") == [0, None]
    assert w.call(f"d.pointer.attribute({ptr}, 'IS_LEGACY_CUDA_IPC_CAPABLE')") == [0, False]


def test_a_buffer_id_is_the_allocations_own_through_evictions(scheduler, workload,
                                                               card: FakeCard) -> None:
    """A registration cache keyed by BUFFER_ID must not see a new buffer at each restore (the
    driver gives each new mapping a new id), nor one id for two allocations of a slab."""
    w = vmm(workload, card, scheduler.socket)
    a, b = hold_with(w, scheduler, [4096, 4096])
    ids = [w.call(f"d.pointer.attribute({p}, 'BUFFER_ID')")[1] for p in (a, b)]
    assert ids[0] != ids[1]
    with other_client(scheduler, "next", 8 * GiB) as next_holder:
        next_holder.acquire(timeout=scaled(30))
    assert [w.call(f"d.pointer.attribute({p}, 'BUFFER_ID')")[1] for p in (a, b)] == ids
    w.call(f"d.free({a})")
    again = w.call(f"d.alloc({4096})")
    assert again == a and w.call(f"d.pointer.attribute({again}, 'BUFFER_ID')")[1] not in ids


def test_sync_memops_is_kept_where_the_driver_refuses_it_on_vmm_memory(
        workload, card: FakeCard) -> None:
    w = vmm(workload, card)
    ptr = w.call(f"d.alloc({4 * MiB})")
    assert w.call(f"d.pointer.sync_memops({ptr + 64})") == 0
    assert w.call(f"d.pointer.attribute({ptr}, 'SYNC_MEMOPS')") == [0, True]
    assert w.call(f"d.pointer.sync_memops({ptr}, on=False)") == 0
    assert w.call(f"d.pointer.attribute({ptr}, 'SYNC_MEMOPS')") == [0, False]


def test_addresses_the_shim_does_not_map_are_the_drivers(workload, card: FakeCard) -> None:
    w = vmm(workload, card)
    managed = w.call(f"d.alloc_managed({MiB})")
    assert w.call(f"d.pointer.attribute({managed}, 'IS_MANAGED')") == [0, True]
    assert w.call(f"d.pointer.attribute({0x1234000}, 'DEVICE_POINTER')") == [INVALID_VALUE, None]
    ptr = w.call(f"d.alloc({4096})")
    w.call(f"d.free({ptr})")
    assert w.call(f"d.pointer.address_range({ptr})") == [0, ptr, 2 * MiB]  # the slab, freed


def test_a_retained_handle_waits_for_the_restore_and_pins_the_memory(
        scheduler, workload, card: FakeCard) -> None:
    w = vmm(workload, card, scheduler.socket)
    (ptr,), next_holder = evicted(scheduler, w, [8 * MiB])
    with next_holder:
        retained = w.start(f"d.retain({ptr})")
        wait_for(lambda: state_of(scheduler, w) == "waiting", what="the retain to wait")
    assert retained.result() == 0
    assert w.stats()["evictable"] == 0


def test_a_dma_buf_of_evicted_memory_waits_for_the_restore_and_pins_it(
        scheduler, workload, card: FakeCard) -> None:
    """A GPUDirect RDMA registration: the dma-buf holds the physical memory, which must then
    stay where it is."""
    w = vmm(workload, card, scheduler.socket)
    (ptr, other), next_holder = evicted(scheduler, w, [8 * MiB, 8 * MiB])
    with next_holder:
        exported = w.start(f"d.pointer.dma_buf({ptr}, {4 * MiB})")
        wait_for(lambda: state_of(scheduler, w) == "waiting", what="the export to wait")
    assert exported.result() == 0
    assert w.stats()["evictable"] == 8 * MiB  # the other allocation only


@pytest.mark.parametrize("device_has_it", [True, False])
def test_memory_is_gpu_direct_rdma_capable_where_the_device_allows_it(
        workload, card: FakeCard, device_has_it: bool) -> None:
    """As cuMemAlloc memory is: a NIC can register it (the driver answers from the handle)."""
    w = vmm(workload, card, **({} if device_has_it else {"FAKE_CUDA_NO_GPU_DIRECT_RDMA": "1"}))
    for size in (4096, 8 * MiB):  # a slab and a region of its own
        ptr = w.call(f"d.alloc({size})")
        assert w.call(f"d.pointer.attribute({ptr}, 'IS_GPU_DIRECT_RDMA_CAPABLE')") == [
            0, int(device_has_it)]


@pytest.mark.parametrize("base, version", [
    ("cuPointerGetAttribute", 12000), ("cuPointerGetAttributes", 12000),
    ("cuPointerSetAttribute", 12000), ("cuMemGetAddressRange", 12000),
    ("cuMemGetHandleForAddressRange", 12000), ("cuIpcOpenMemHandle", 12000),
    ("cuIpcOpenMemHandle", 10000), ("cuIpcCloseMemHandle", 12000)])
def test_a_runtime_asking_the_driver_for_them_gets_the_shims(workload, base: str,
                                                            version: int) -> None:
    """The CUDA runtime fetches these by cuGetProcAddress (cudaPointerGetAttributes,
    cudaIpcOpenMemHandle): the answer must be the shim's."""
    w = workload()
    assert w.call(f"mapped_file(d.proc({base!r}, version={version}))") == "libkiwishim.so"
