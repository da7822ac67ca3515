"""The fake driver's model of the card's memory and of the virtual memory management API.

The vmm evictor (issue 30) will be proven against this model: that an evicted process leaves
the card free by the fake driver's own count, that addresses survive an eviction, that what the
driver refuses is refused. So the model itself is specified here: it must refuse what the real
driver refuses (cuda.h and the driver API's documentation; design notes in
../shared/design/gpu-memory-swap.md, section 4), and count what the real card counts.

Each test drives the fake (built under the sanitizer that KIWI_TEST_SANITIZE names, if any) in a
process of its own, through vmm_calls.py; ``v`` there is the driver.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from cuda_toolkits import entry_point_versions, toolkits
from fake_device import FakeCard
from fake_process import FakeProcess
from vmm_calls import (
    CU_MEM_ACCESS_FLAGS_PROT_NONE,
    CU_MEM_ACCESS_FLAGS_PROT_READ,
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    HOST_MEMORY_ALREADY_REGISTERED,
    HOST_MEMORY_NOT_REGISTERED,
    ILLEGAL_ADDRESS,
    INVALID_DEVICE,
    INVALID_VALUE,
    NOT_FOUND,
    NOT_SUPPORTED,
    OUT_OF_MEMORY,
    POINTER_ATTRIBUTES,
    GiB,
    MiB,
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CHUNK = 2 * MiB  # the fake's granularity, as a current GPU's
GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED = 110
HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED = 103


@pytest.fixture
def v(start_fake: Callable[..., FakeProcess]) -> FakeProcess:
    """One process over the fake, on a 1 GiB card."""
    return start_fake(FAKE_CUDA_TOTAL=str(GiB))


# ---- the device and its granularity ------------------------------------------------------

def test_the_device_supports_the_vmm_api(v: FakeProcess) -> None:
    assert v.call("v.vmm_supported()") is True
    assert v.call("v.granularity()") == CHUNK
    assert v.call("v.granularity(option=1)") == CHUNK  # recommended: the same


def test_a_device_told_not_to_support_it_says_so_and_refuses_its_calls(start_fake) -> None:
    fake = start_fake(FAKE_CUDA_NO_VMM="1")
    assert fake.call("v.vmm_supported()") is False
    assert fake.call(f"v.create_result({CHUNK})") == NOT_SUPPORTED
    assert fake.call(f"v.reserve_result({CHUNK})") == NOT_SUPPORTED
    assert fake.call("v.granularity_result()") == NOT_SUPPORTED


# ---- physical memory on the card ----------------------------------------------------------

def test_a_physical_handle_is_on_the_card_from_its_creation(v: FakeProcess) -> None:
    assert v.call("v.mem_info()") == [GiB, GiB]
    handle = v.call(f"v.create({64 * MiB})")
    assert v.call("v.mem_info()") == [GiB - 64 * MiB, GiB]
    assert v.call("v.physical_used()") == v.call("v.process_used()") == 64 * MiB
    assert v.call(f"v.release({handle})") == 0
    assert v.call("v.physical_used()") == 0 and v.call("v.free_bytes()") == GiB


def test_creating_past_the_cards_capacity_is_out_of_memory(start_fake) -> None:
    fake = start_fake(FAKE_CUDA_TOTAL=str(64 * MiB), FAKE_CUDA_OTHERS_USED=str(16 * MiB))
    assert fake.call(f"v.create_result({64 * MiB})") == OUT_OF_MEMORY
    handle = fake.call(f"v.create({48 * MiB})")  # all that the others leave
    assert fake.call(f"v.create_result({CHUNK})") == OUT_OF_MEMORY
    assert fake.call(f"v.release({handle})") == 0
    assert fake.call(f"v.create_result({CHUNK})") == 0


def test_sizes_that_are_not_whole_granules_are_refused(v: FakeProcess) -> None:
    assert v.call(f"v.create_result({CHUNK + 4096})") == INVALID_VALUE
    assert v.call("v.create_result(0)") == INVALID_VALUE
    assert v.call(f"v.reserve_result({CHUNK // 2})") == INVALID_VALUE
    va = v.call(f"v.reserve({4 * CHUNK})")
    handle = v.call(f"v.create({2 * CHUNK})")
    assert v.call(f"v.map({va}, {CHUNK + 4096}, {handle})") == INVALID_VALUE  # size
    assert v.call(f"v.map({va}, {CHUNK}, {handle}, offset=4096)") == INVALID_VALUE  # offset
    assert v.call(f"v.map({va + 4096}, {CHUNK}, {handle})") == INVALID_VALUE  # address
    assert v.call("v.physical_used()") == 2 * CHUNK  # nothing taken by the refusals


def test_a_creation_without_properties_on_another_device_or_with_flags_is_refused(
        v: FakeProcess) -> None:
    assert v.call(f"v.create_result({CHUNK}, prop=False)") == INVALID_VALUE
    assert v.call(f"v.create_result({CHUNK}, device=1)") == INVALID_DEVICE
    assert v.call(f"v.create_result({CHUNK}, flags=1)") == INVALID_VALUE
    assert v.call("v.physical_used()") == 0


def test_a_handle_keeps_the_properties_it_was_created_with(v: FakeProcess) -> None:
    handle = v.call(f"v.create({CHUNK}, handle_types=1)")  # a POSIX file descriptor asked for
    assert v.call(f"v.properties({handle})") == {
        "type": 1, "location_type": 1, "device": 0, "handle_types": 1}


def test_a_handle_released_twice_or_unknown_is_refused(v: FakeProcess) -> None:
    handle = v.call(f"v.create({CHUNK})")
    assert v.call(f"v.release({handle})") == 0
    assert v.call(f"v.release({handle})") == INVALID_VALUE
    assert v.call("v.release(12345)") == INVALID_VALUE


# ---- reservations and mappings ------------------------------------------------------------

def test_a_released_handle_stays_on_the_card_while_it_is_mapped(v: FakeProcess) -> None:
    va = v.call(f"v.reserve({2 * CHUNK})")
    handle = v.call(f"v.create({2 * CHUNK})")
    assert v.call(f"v.map({va}, {2 * CHUNK}, {handle})") == 0
    assert v.call(f"v.release({handle})") == 0
    assert v.call("v.physical_used()") == 2 * CHUNK  # the mapping holds it
    assert v.call(f"v.unmap({va}, {2 * CHUNK})") == 0
    assert v.call("v.physical_used()") == 0


def test_an_unmapped_handle_stays_on_the_card_until_it_is_released(v: FakeProcess) -> None:
    va = v.call(f"v.reserve({CHUNK})")
    handle = v.call(f"v.create({CHUNK})")
    assert v.call(f"v.map({va}, {CHUNK}, {handle})") == 0
    assert v.call(f"v.unmap({va}, {CHUNK})") == 0
    assert v.call("v.physical_used()") == CHUNK
    assert v.call(f"v.map({va}, {CHUNK}, {handle})") == 0  # it can be mapped again
    assert v.call(f"v.unmap({va}, {CHUNK})") == 0
    assert v.call(f"v.release({handle})") == 0
    assert v.call("v.physical_used()") == 0


def test_a_handle_mapped_at_two_addresses_shows_the_same_bytes_at_both(v: FakeProcess) -> None:
    va = v.call(f"v.reserve({2 * CHUNK})")
    handle = v.call(f"v.create({CHUNK})")
    assert v.call(f"v.map({va}, {CHUNK}, {handle})") == 0
    assert v.call(f"v.map({va + CHUNK}, {CHUNK}, {handle})") == 0
    assert v.call(f"v.release({handle})") == 0
    assert v.call(f"v.set_access({va}, {2 * CHUNK})") == 0
    v.call(f"v.write({va + 100}, b'alias')")
    assert v.call(f"v.read({va + CHUNK + 100}, 5) == b'alias'")
    assert v.call(f"v.unmap({va}, {CHUNK})") == 0
    assert v.call("v.physical_used()") == CHUNK  # still mapped once
    assert v.call(f"v.unmap({va + CHUNK}, {CHUNK})") == 0
    assert v.call("v.physical_used()") == 0


def test_a_part_of_a_handle_maps_at_its_offset(v: FakeProcess) -> None:
    va = v.call(f"v.reserve({3 * CHUNK})")
    handle = v.call(f"v.create({2 * CHUNK})")
    assert v.call(f"v.map({va}, {2 * CHUNK}, {handle})") == 0
    assert v.call(f"v.map({va + 2 * CHUNK}, {CHUNK}, {handle}, offset={CHUNK})") == 0
    assert v.call(f"v.map({va}, {CHUNK}, {handle}, offset={2 * CHUNK})") != 0  # past its end
    assert v.call(f"v.set_access({va}, {3 * CHUNK})") == 0
    v.call(f"v.write({va + CHUNK}, b'second half')")
    assert v.call(f"v.read({va + 2 * CHUNK}, 11) == b'second half'")


def test_a_map_over_another_map_is_refused(v: FakeProcess) -> None:
    va = v.call(f"v.reserve({4 * CHUNK})")
    first, second = v.call(f"v.create({2 * CHUNK})"), v.call(f"v.create({2 * CHUNK})")
    assert v.call(f"v.map({va}, {2 * CHUNK}, {first})") == 0
    assert v.call(f"v.map({va}, {2 * CHUNK}, {second})") == INVALID_VALUE
    assert v.call(f"v.map({va + CHUNK}, {2 * CHUNK}, {second})") == INVALID_VALUE  # overlaps
    assert v.call(f"v.map({va + 2 * CHUNK}, {2 * CHUNK}, {second})") == 0


def test_a_map_outside_one_reservation_is_refused(v: FakeProcess) -> None:
    first = v.call(f"v.reserve({2 * CHUNK})")
    handle = v.call(f"v.create({4 * CHUNK})")
    assert v.call(f"v.map({first}, {4 * CHUNK}, {handle})") == INVALID_VALUE  # runs past it
    assert v.call(f"v.map({first + 64 * CHUNK}, {CHUNK}, {handle})") == INVALID_VALUE
    second = v.call(f"v.reserve({2 * CHUNK}, hint={first + 2 * CHUNK})")
    assert second == first + 2 * CHUNK  # adjacent, yet another reservation
    assert v.call(f"v.map({first}, {4 * CHUNK}, {handle})") == INVALID_VALUE
    assert v.call(f"v.map({first}, {2 * CHUNK}, {handle})") == 0


def test_a_released_handle_cannot_be_mapped(v: FakeProcess) -> None:
    va = v.call(f"v.reserve({CHUNK})")
    handle = v.call(f"v.create({CHUNK})")
    assert v.call(f"v.release({handle})") == 0
    assert v.call(f"v.map({va}, {CHUNK}, {handle})") == INVALID_VALUE


def test_an_unmap_of_part_of_a_mapping_is_refused(v: FakeProcess) -> None:
    va = v.call(f"v.reserve({4 * CHUNK})")
    handle = v.call(f"v.create({4 * CHUNK})")
    assert v.call(f"v.map({va}, {4 * CHUNK}, {handle})") == 0
    assert v.call(f"v.unmap({va}, {2 * CHUNK})") == INVALID_VALUE  # its first half
    assert v.call(f"v.unmap({va + 2 * CHUNK}, {2 * CHUNK})") == INVALID_VALUE  # its second
    assert v.call(f"v.unmap({va}, {8 * CHUNK})") == INVALID_VALUE  # and beyond
    assert v.call(f"v.unmap({va}, {4 * CHUNK})") == 0


def test_an_unmap_may_take_several_whole_mappings_but_no_gap(v: FakeProcess) -> None:
    va = v.call(f"v.reserve({4 * CHUNK})")
    handles = [v.call(f"v.create({CHUNK})") for _ in range(3)]
    for i, handle in enumerate(handles):  # at 0, 1 and 3: a gap at 2
        assert v.call(f"v.map({va + (i + i // 2) * CHUNK}, {CHUNK}, {handle})") == 0
    assert v.call(f"v.unmap({va}, {4 * CHUNK})") == INVALID_VALUE
    assert v.call(f"v.unmap({va}, {2 * CHUNK})") == 0
    assert v.call(f"v.unmap({va + 2 * CHUNK}, {CHUNK})") == INVALID_VALUE  # the gap itself


def test_a_reservation_is_freed_whole_and_only_once_nothing_is_mapped_in_it(
        v: FakeProcess) -> None:
    va = v.call(f"v.reserve({2 * CHUNK})")
    handle = v.call(f"v.create({CHUNK})")
    assert v.call(f"v.map({va + CHUNK}, {CHUNK}, {handle})") == 0
    assert v.call(f"v.free_address({va}, {2 * CHUNK})") == INVALID_VALUE  # still mapped
    assert v.call(f"v.unmap({va + CHUNK}, {CHUNK})") == 0
    assert v.call(f"v.free_address({va}, {CHUNK})") == INVALID_VALUE  # not the whole of it
    assert v.call(f"v.free_address({va}, {2 * CHUNK})") == 0
    assert v.call(f"v.free_address({va}, {2 * CHUNK})") == INVALID_VALUE  # gone
    assert v.call(f"v.reserve({2 * CHUNK}, hint={va})") == va  # free again


def test_a_reservation_keeps_its_alignment(v: FakeProcess) -> None:
    v.call(f"v.reserve({CHUNK})")  # the next free address is no longer 1 GiB aligned
    va = v.call(f"v.reserve({CHUNK}, alignment={GiB})")
    assert va % GiB == 0
    assert v.call(f"v.reserve_result({CHUNK}, alignment={3 * CHUNK})") == INVALID_VALUE


# ---- access and bytes ---------------------------------------------------------------------

def test_mapped_memory_is_not_accessible_until_access_is_set(v: FakeProcess) -> None:
    va = v.call(f"v.reserve({CHUNK})")
    handle = v.call(f"v.create({CHUNK})")
    assert v.call(f"v.map({va}, {CHUNK}, {handle})") == 0
    assert v.call(f"v.get_access({va})") == [0, CU_MEM_ACCESS_FLAGS_PROT_NONE]
    assert v.call(f"v.write_result({va}, b'x')") == ILLEGAL_ADDRESS
    assert v.call(f"v.read_result({va}, 1)") == ILLEGAL_ADDRESS
    assert v.call(f"v.launch_fill({va}, 16, 7)") == ILLEGAL_ADDRESS
    assert v.call(f"v.memset32({va}, 7, 4)") == ILLEGAL_ADDRESS
    assert v.call(f"v.set_access({va}, {CHUNK})") == 0
    assert v.call(f"v.get_access({va + 5})") == [0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE]
    assert v.call(f"v.launch_fill({va}, 16, 7)") == 0
    assert v.call(f"v.read({va}, 17) == bytes([7] * 16 + [0])")


def test_read_only_access_lets_reads_through_and_stops_writes(v: FakeProcess) -> None:
    va = v.call(f"v.reserve({2 * CHUNK})")
    handle = v.call(f"v.create({2 * CHUNK})")
    assert v.call(f"v.map({va}, {2 * CHUNK}, {handle})") == 0
    assert v.call(f"v.set_access({va}, {2 * CHUNK})") == 0
    v.call(f"v.write({va}, b'kept')")
    assert v.call(f"v.set_access({va}, {2 * CHUNK}, flags={CU_MEM_ACCESS_FLAGS_PROT_READ})") == 0
    assert v.call(f"v.read({va}, 4) == b'kept'")
    assert v.call(f"v.write_result({va}, b'lost')") == ILLEGAL_ADDRESS
    assert v.call(f"v.launch_copy({va + CHUNK}, {va}, 4)") == ILLEGAL_ADDRESS  # writes too
    assert v.call(f"v.read({va}, 4) == b'kept'")


def test_access_is_set_on_whole_mappings_only(v: FakeProcess) -> None:
    va = v.call(f"v.reserve({4 * CHUNK})")
    handle = v.call(f"v.create({2 * CHUNK})")
    assert v.call(f"v.map({va}, {2 * CHUNK}, {handle})") == 0
    assert v.call(f"v.set_access({va}, {CHUNK})") == INVALID_VALUE  # half a mapping
    assert v.call(f"v.set_access({va}, {4 * CHUNK})") == INVALID_VALUE  # and unmapped space
    assert v.call(f"v.set_access({va}, {2 * CHUNK}, device=1)") == INVALID_DEVICE
    assert v.call(f"v.set_access({va}, {2 * CHUNK}, flags=2)") == INVALID_VALUE
    assert v.call(f"v.get_access({va + 2 * CHUNK})")[0] == INVALID_VALUE  # not mapped


def test_copies_to_or_from_addresses_that_are_not_mapped_fail(v: FakeProcess) -> None:
    va = v.call(f"v.reserve({2 * CHUNK})")
    assert v.call(f"v.write_result({va}, b'x')") == INVALID_VALUE  # reserved, never mapped
    handle = v.call(f"v.create({CHUNK})")
    assert v.call(f"v.map({va}, {CHUNK}, {handle})") == 0
    assert v.call(f"v.set_access({va}, {CHUNK})") == 0
    assert v.call(f"v.read_result({va + CHUNK - 2}, 4)") == INVALID_VALUE  # runs off the map
    assert v.call(f"v.launch_fill({va + CHUNK}, 1, 1)") == ILLEGAL_ADDRESS  # a kernel faults
    assert v.call(f"v.unmap({va}, {CHUNK})") == 0
    assert v.call(f"v.read_result({va}, 1)") == INVALID_VALUE


@pytest.mark.parametrize("write, read", [
    ("cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2"),
    ("cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2"),
    ("cuMemcpyHtoD_v2_ptds", "cuMemcpyDtoH_v2_ptds"),
    ("cuMemcpyHtoDAsync_v2_ptsz", "cuMemcpyDtoHAsync_v2_ptsz"),
    ("cuMemcpy", "cuMemcpyAsync"),
    ("cuMemcpyAsync_ptsz", "cuMemcpy_ptds"),
])
def test_copies_move_real_bytes_across_mappings(v: FakeProcess, write: str, read: str) -> None:
    va = v.call(f"v.backed({4 * CHUNK}, {CHUNK})")  # four handles, one after the other
    data = "bytes(range(256)) * 64"
    start = va + CHUNK - 8000  # the 16 KiB straddle the first two mappings
    v.call(f"v.write({start}, {data}, call={write!r})")
    assert v.call(f"v.read({start}, 16384, call={read!r}) == {data}")


def test_device_to_device_copies_and_memsets_move_real_bytes(v: FakeProcess) -> None:
    va = v.call(f"v.backed({4 * CHUNK}, {CHUNK})")
    assert v.call(f"v.memset32({va}, 0x01020304, 4)") == 0
    assert v.call(f"v.read({va}, 16) == bytes([4, 3, 2, 1]) * 4")
    assert v.call(f"v.memset8({va + CHUNK - 1}, 9, 2)") == 0
    assert v.call(f"v.copy_on_device({va + 3 * CHUNK}, {va + CHUNK - 1}, 2)") == 0
    assert v.call(f"v.launch_copy({va + 2 * CHUNK}, {va}, 4)") == 0
    assert v.call(f"v.read({va + 3 * CHUNK}, 2) == b'\\x09\\x09'")
    assert v.call(f"v.read({va + 2 * CHUNK}, 4) == bytes([4, 3, 2, 1])")
    assert v.call(f"v.memset32({va + 2}, 1, 1)") == INVALID_VALUE  # not 4-byte aligned


# ---- the eviction the vmm evictor makes ----------------------------------------------------

def test_an_evicted_range_leaves_the_card_and_comes_back_at_the_same_address(
        v: FakeProcess) -> None:
    """Copy each chunk out, unmap and release it: nothing is left on the card. Create and map
    again at the same addresses, set access, copy back: the same bytes, at the same pointer."""
    size = 8 * CHUNK
    va = v.call(f"v.backed({size}, {CHUNK})")
    data = f"__import__('random').Random(7).randbytes({size})"
    v.call(f"v.write({va}, {data})")
    shadow = v.call(f"v.alloc_host({size})")
    for offset in range(0, size, CHUNK):
        assert v.call(f"v.copy_to_host({shadow + offset}, {va + offset}, {CHUNK})") == 0
        assert v.call("v.synchronize(0)") == 0  # the copy is queued: done once its stream is
        assert v.call(f"v.unmap({va + offset}, {CHUNK})") == 0
    assert v.call("v.physical_used()") == 0 and v.call("v.free_bytes()") == GiB
    assert v.call(f"v.read_result({va}, 1)") == INVALID_VALUE  # the address is still reserved
    for offset in range(0, size, CHUNK):
        handle = v.call(f"v.create({CHUNK})")
        assert v.call(f"v.map({va + offset}, {CHUNK}, {handle})") == 0
        assert v.call(f"v.release({handle})") == 0
    assert v.call(f"v.read_result({va}, 1)") == ILLEGAL_ADDRESS  # access is set anew
    assert v.call(f"v.set_access({va}, {size})") == 0
    for offset in range(0, size, CHUNK):
        assert v.call(f"v.copy_from_host({va + offset}, {shadow + offset}, {CHUNK})") == 0
    assert v.call(f"v.read({va}, {size}) == {data}")
    assert v.call("v.physical_used()") == size
    assert v.call(f"v.free_host({shadow})") == 0


def test_a_restore_that_does_not_fit_can_roll_back_to_nothing(start_fake) -> None:
    """The card filled up while the range was out: its third chunk does not fit. Undoing the
    two mapped so far leaves the card to the newcomer and the range unmapped, and the same
    restore succeeds once the newcomer has gone."""
    fake = start_fake(FAKE_CUDA_TOTAL=str(8 * CHUNK))
    va = fake.call(f"v.backed({4 * CHUNK}, {CHUNK})")
    assert fake.call(f"v.unmap({va}, {4 * CHUNK})") == 0  # evicted
    newcomer = fake.call(f"v.create({6 * CHUNK})")

    def restore() -> list[int]:
        mapped = []
        for offset in range(0, 4 * CHUNK, CHUNK):
            if fake.call(f"v.create_result({CHUNK})") == OUT_OF_MEMORY:
                return mapped
            handle = fake.call("v.last_handle()")
            assert fake.call(f"v.map({va + offset}, {CHUNK}, {handle})") == 0
            assert fake.call(f"v.release({handle})") == 0
            mapped.append(offset)
        return mapped

    mapped = restore()
    assert mapped == [0, CHUNK]
    assert fake.call("v.free_bytes()") == 0
    for offset in mapped:  # the rollback
        assert fake.call(f"v.unmap({va + offset}, {CHUNK})") == 0
    assert fake.call("v.physical_used()") == 6 * CHUNK  # the newcomer's alone
    assert fake.call(f"v.read_result({va}, 1)") == INVALID_VALUE
    assert fake.call(f"v.release({newcomer})") == 0
    assert restore() == [0, CHUNK, 2 * CHUNK, 3 * CHUNK]


def test_retain_gives_the_mapped_handle_with_a_reference_of_its_own(v: FakeProcess) -> None:
    va = v.call(f"v.reserve({CHUNK})")
    handle = v.call(f"v.create({CHUNK})")
    assert v.call(f"v.map({va}, {CHUNK}, {handle})") == 0
    assert v.call(f"v.release({handle})") == 0
    assert v.call(f"v.retain({va + 4096})") == [0, handle]
    assert v.call(f"v.unmap({va}, {CHUNK})") == 0
    assert v.call("v.physical_used()") == CHUNK  # the retained reference holds it
    assert v.call(f"v.release({handle})") == 0
    assert v.call("v.physical_used()") == 0
    assert v.call(f"v.retain({va})")[0] == INVALID_VALUE  # nothing mapped there now


# ---- what the driver says of an address ----------------------------------------------------

VMM_FACTS = ["MEMORY_TYPE", "DEVICE_POINTER", "DEVICE_ORDINAL", "RANGE_START_ADDR",
             "RANGE_SIZE", "MAPPED", "IS_MANAGED", "IS_LEGACY_CUDA_IPC_CAPABLE"]


def test_mapped_vmm_memory_answers_with_its_reservation_and_its_mapping(v: FakeProcess) -> None:
    va = v.call(f"v.backed({4 * CHUNK}, {CHUNK})")  # four mappings of one handle each
    inside = va + CHUNK + 100
    assert v.call(f"v.pointer.attributes({inside}, {VMM_FACTS})") == [0, {
        "MEMORY_TYPE": 2, "DEVICE_POINTER": inside, "DEVICE_ORDINAL": 0,
        "RANGE_START_ADDR": va, "RANGE_SIZE": 4 * CHUNK,  # the reservation
        "MAPPED": True, "IS_MANAGED": False, "IS_LEGACY_CUDA_IPC_CAPABLE": False}]
    assert v.call(f"v.pointer.address_range({inside})") == [0, va + CHUNK, CHUNK]  # one mapping
    assert v.call(f"v.pointer.attribute({inside}, 'MAPPING_BASE_ADDR')") == [0, va + CHUNK]
    assert v.call(f"v.pointer.attribute({inside}, 'CONTEXT')") == [0, None]  # belongs to none
    assert v.call(f"v.pointer.attribute({inside}, 'ACCESS_FLAGS')") == [0, 3]


def test_vmm_memory_reserved_but_not_mapped_fails_every_query_but_its_range(
        v: FakeProcess) -> None:
    va = v.call(f"v.backed({2 * CHUNK}, {CHUNK})")
    assert v.call(f"v.unmap({va + CHUNK}, {CHUNK})") == 0  # evicted, as the vmm evictor does
    away = va + CHUNK + 8
    for name in ("DEVICE_POINTER", "CONTEXT", "MEMORY_TYPE", "DEVICE_ORDINAL", "BUFFER_ID"):
        assert v.call(f"v.pointer.attribute({away}, {name!r})") == [INVALID_VALUE, None], name
    assert v.call(f"v.pointer.attribute({away}, 'RANGE_START_ADDR')") == [0, va]
    assert v.call(f"v.pointer.attribute({away}, 'RANGE_SIZE')") == [0, 2 * CHUNK]
    assert v.call(f"v.pointer.attribute({away}, 'MAPPED')") == [0, False]
    assert v.call(f"v.pointer.address_range({away})")[0] == NOT_FOUND
    # The list form does not fail: what the address lacks comes back as the defaults.
    assert v.call(f"v.pointer.attributes({away}, {VMM_FACTS})") == [0, {
        "MEMORY_TYPE": 0, "DEVICE_POINTER": 0, "DEVICE_ORDINAL": -2, "RANGE_START_ADDR": va,
        "RANGE_SIZE": 2 * CHUNK, "MAPPED": False, "IS_MANAGED": False,
        "IS_LEGACY_CUDA_IPC_CAPABLE": False}]
    assert v.call(f"v.pointer.attribute({va}, 'MAPPED')") == [0, True]  # the other half


def test_a_vmm_mapping_gets_a_new_buffer_id_each_time_it_is_mapped(v: FakeProcess) -> None:
    va = v.call(f"v.backed({CHUNK})")
    first = v.call(f"v.pointer.attribute({va}, 'BUFFER_ID')")[1]
    assert v.call(f"v.unmap({va}, {CHUNK})") == 0
    handle = v.call(f"v.create({CHUNK})")
    assert v.call(f"v.map({va}, {CHUNK}, {handle})") == 0
    assert v.call(f"v.pointer.attribute({va}, 'BUFFER_ID')")[1] not in (first, 0)


def test_addresses_the_driver_never_made_fail_each_query(v: FakeProcess) -> None:
    nowhere = 0x1234000
    assert v.call(f"v.pointer.attribute({nowhere}, 'DEVICE_POINTER')") == [INVALID_VALUE, None]
    assert v.call(f"v.pointer.address_range({nowhere})")[0] == NOT_FOUND
    code, values = v.call(f"v.pointer.attributes({nowhere}, ['MEMORY_TYPE', 'DEVICE_ORDINAL'])")
    assert (code, values) == (0, {"MEMORY_TYPE": 0, "DEVICE_ORDINAL": -2})


def test_device_memory_answers_as_its_allocation(v: FakeProcess) -> None:
    plain = v.call(f"v.alloc({3 * MiB + 5})")
    assert v.call(f"v.pointer.attributes({plain + 7}, {VMM_FACTS})") == [0, {
        "MEMORY_TYPE": 2, "DEVICE_POINTER": plain + 7, "DEVICE_ORDINAL": 0,
        "RANGE_START_ADDR": plain, "RANGE_SIZE": 3 * MiB + 5, "MAPPED": True,
        "IS_MANAGED": False, "IS_LEGACY_CUDA_IPC_CAPABLE": True}]
    assert v.call(f"v.pointer.address_range({plain + 7})") == [0, plain, 3 * MiB + 5]
    assert v.call(f"v.pointer.attribute({plain}, 'CONTEXT')") == [0, 0xC0FFEE]
    assert v.call(f"v.pointer.attribute({plain}, 'HOST_POINTER')") == [INVALID_VALUE, None]
    managed = v.call(f"v.alloc_managed({MiB})")
    assert v.call(f"v.pointer.attribute({managed}, 'IS_MANAGED')") == [0, True]
    streamed = v.call(f"v.alloc_async({MiB}, pool=0x9001)")
    assert v.call(f"v.pointer.attribute({streamed}, 'CONTEXT')") == [0, None]  # no context
    assert v.call(f"v.pointer.attribute({streamed}, 'MEMPOOL_HANDLE')") == [0, 0x9001]
    ids = {v.call(f"v.pointer.attribute({p}, 'BUFFER_ID')")[1] for p in (plain, managed, streamed)}
    assert len(ids) == 3 and 0 not in ids


def test_a_dma_buf_needs_the_whole_range_mapped_and_page_aligned(v: FakeProcess) -> None:
    va = v.call(f"v.backed({2 * CHUNK}, {CHUNK})")
    assert v.call(f"v.pointer.dma_buf({va}, {2 * CHUNK})") == 0
    assert v.call(f"v.pointer.dma_buf({va + 100}, 4096)") == INVALID_VALUE
    assert v.call(f"v.unmap({va + CHUNK}, {CHUNK})") == 0
    assert v.call(f"v.pointer.dma_buf({va}, {2 * CHUNK})") == INVALID_VALUE
    assert v.call(f"v.pointer.dma_buf({va}, {CHUNK})") == 0


def test_sync_memops_is_kept_for_device_memory_and_refused_on_vmm_memory(v: FakeProcess) -> None:
    plain = v.call(f"v.alloc({MiB})")
    assert v.call(f"v.pointer.attribute({plain}, 'SYNC_MEMOPS')") == [0, False]
    assert v.call(f"v.pointer.sync_memops({plain + 64})") == 0
    assert v.call(f"v.pointer.attribute({plain}, 'SYNC_MEMOPS')") == [0, True]
    va = v.call(f"v.backed({CHUNK})")
    assert v.call(f"v.pointer.sync_memops({va})") == NOT_SUPPORTED
    assert v.call(f"v.pointer.sync_memops({0x1234000})") == INVALID_VALUE


def test_the_gpu_direct_rdma_flag_is_the_handles_and_needs_the_device(start_fake) -> None:
    fake = start_fake(FAKE_CUDA_TOTAL=str(GiB))
    assert fake.call(f"v.attribute({GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED})") == 1
    va = fake.call(f"v.reserve({2 * CHUNK})")
    flagged, plain = fake.call(f"v.create({CHUNK}, rdma=True)"), fake.call(f"v.create({CHUNK})")
    assert fake.call(f"v.map({va}, {CHUNK}, {flagged})") == 0
    assert fake.call(f"v.map({va + CHUNK}, {CHUNK}, {plain})") == 0
    assert fake.call(f"v.pointer.attribute({va}, 'IS_GPU_DIRECT_RDMA_CAPABLE')") == [0, 1]
    assert fake.call(f"v.pointer.attribute({va + CHUNK}, 'IS_GPU_DIRECT_RDMA_CAPABLE')") == [0, 0]
    without = start_fake(FAKE_CUDA_TOTAL=str(GiB), FAKE_CUDA_NO_GPU_DIRECT_RDMA="1")
    assert without.call(f"v.attribute({GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED})") == 0
    assert without.call(f"v.create_with({CHUNK}, rdma=True)") == NOT_SUPPORTED
    assert without.call(f"v.create_with({CHUNK})") == 0


# ---- the other allocations ----------------------------------------------------------------

def test_plain_and_managed_allocations_count_until_freed(v: FakeProcess) -> None:
    plain = v.call(f"v.alloc({100 * MiB})")
    managed = v.call(f"v.alloc_managed({50 * MiB})")
    assert v.call("v.free_bytes()") == GiB - 150 * MiB
    assert v.call(f"v.free({plain})") == 0
    assert v.call(f"v.free({managed})") == 0
    assert v.call("v.physical_used()") == 0


def test_a_free_of_vmm_memory_is_refused(v: FakeProcess) -> None:
    va = v.call(f"v.backed({CHUNK})")
    assert v.call(f"v.free({va})") == INVALID_VALUE
    assert v.call("v.physical_used()") == CHUNK


@pytest.mark.parametrize("per_thread", [False, True])
def test_stream_ordered_memory_stays_in_its_pool_until_a_synchronize(v: FakeProcess,
                                                                     per_thread: bool) -> None:
    ptr = v.call(f"v.alloc_async({8 * MiB}, per_thread={per_thread})")
    assert v.call("v.physical_used()") == 8 * MiB
    assert v.call(f"v.free_async({ptr}, per_thread={per_thread})") == 0
    assert v.call("v.physical_used()") == 8 * MiB  # the pool keeps it (release threshold 0)
    again = v.call(f"v.alloc_async({8 * MiB}, per_thread={per_thread})")
    assert v.call("v.physical_used()") == 8 * MiB  # handed out again from the pool
    assert v.call(f"v.free_async({again}, per_thread={per_thread})") == 0
    assert v.call("v.synchronize()") == 0
    assert v.call("v.physical_used()") == 0


def test_a_pool_trimmed_keeps_only_what_it_was_told(v: FakeProcess) -> None:
    ptr = v.call(f"v.alloc_async({8 * MiB}, pool=0x9001)")
    assert v.call(f"v.free_async({ptr})") == 0
    assert v.call(f"v.trim(0x9001, keep={2 * MiB})") == 0
    assert v.call("v.physical_used()") == 2 * MiB
    assert v.call("v.trim(0x9001)") == 0
    assert v.call("v.physical_used()") == 0


def test_pinned_host_memory_is_real_and_registrations_do_not_overlap(v: FakeProcess) -> None:
    host = v.call(f"v.alloc_host({MiB})")
    v.call(f"v.host_write({host + MiB - 3}, b'end')")
    assert v.call(f"v.host_read({host + MiB - 3}, 3) == b'end'")
    assert v.call(f"v.free_host({host})") == 0
    assert v.call(f"v.free_host({host})") == INVALID_VALUE
    pinned = v.call(f"v.alloc_host({MiB})")
    assert v.call(f"v.register({pinned}, {MiB})") == HOST_MEMORY_ALREADY_REGISTERED
    pages = v.call("ctypes.addressof(scratch := ctypes.create_string_buffer(1 << 20))")
    assert v.call(f"v.register({pages}, {MiB})") == 0
    assert v.call(f"v.register({pages + 4096}, 4096)") == HOST_MEMORY_ALREADY_REGISTERED
    assert v.call(f"v.unregister({pages})") == 0
    assert v.call(f"v.unregister({pages})") == HOST_MEMORY_NOT_REGISTERED


# ---- memory shared between processes -------------------------------------------------------

def test_a_handle_exported_as_a_file_descriptor_shows_the_same_bytes_in_the_importer(
        start_fake, tmp_path: Path) -> None:
    card = FakeCard(tmp_path / "card")
    exporter = start_fake(FAKE_CUDA_TOTAL=str(GiB), **card.env)
    importer = start_fake(FAKE_CUDA_TOTAL=str(GiB), **card.env)
    handle = exporter.call(f"v.create({CHUNK}, handle_types=1)")
    code, fd = exporter.call(f"v.export_fd({handle})")
    assert code == 0
    taken = importer.call(f"take_fd({exporter.pid}, {fd})")
    code, imported = importer.call(f"v.import_fd({taken})")
    assert code == 0
    va = importer.call(f"v.reserve({CHUNK})")
    assert importer.call(f"v.map({va}, {CHUNK}, {imported})") == 0
    assert importer.call(f"v.set_access({va}, {CHUNK})") == 0
    importer.call(f"v.write({va + 10}, b'shared')")
    there = exporter.call(f"v.reserve({CHUNK})")
    assert exporter.call(f"v.map({there}, {CHUNK}, {handle})") == 0
    assert exporter.call(f"v.set_access({there}, {CHUNK})") == 0
    assert exporter.call(f"v.read({there + 10}, 6) == b'shared'")
    assert card.used() == CHUNK  # one physical allocation, the exporter's
    assert card.used_by(importer.pid) == 0


def test_only_a_handle_created_exportable_exports(start_fake) -> None:
    fake = start_fake(FAKE_CUDA_TOTAL=str(GiB))
    plain = fake.call(f"v.create({CHUNK})")
    assert fake.call(f"v.export_fd({plain})")[0] == 800  # CUDA_ERROR_NOT_PERMITTED
    refusing = start_fake(FAKE_CUDA_TOTAL=str(GiB), FAKE_CUDA_NO_POSIX_FD_HANDLES="1")
    assert refusing.call(f"v.attribute({HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED})") == 0
    assert refusing.call(f"v.create_with({CHUNK}, handle_types=1)") == NOT_SUPPORTED


def test_legacy_ipc_opens_device_memory_in_another_process_only(start_fake) -> None:
    exporter, importer = start_fake(), start_fake()
    plain = exporter.call(f"v.alloc({MiB})")
    code, handle = exporter.call(f"v.ipc.get({plain})")
    assert code == 0
    assert exporter.call(f"v.ipc.open({handle!r})")[0] == INVALID_VALUE  # not in itself
    code, opened = importer.call(f"v.ipc.open({handle!r})")
    assert code == 0 and opened
    assert importer.call(f"v.ipc.close({opened})") == 0
    assert importer.call(f"v.ipc.open({'00' * 64!r})")[0] == INVALID_VALUE  # not the fake's
    va = exporter.call(f"v.backed({CHUNK})")
    assert exporter.call(f"v.ipc.get({va})")[0] == INVALID_VALUE  # VMM memory: never
    managed = exporter.call(f"v.alloc_managed({MiB})")
    assert exporter.call(f"v.ipc.get({managed})")[0] == INVALID_VALUE


# ---- one card, several processes ----------------------------------------------------------

def test_the_card_is_shared_by_the_processes_that_name_it(start_fake, tmp_path: Path) -> None:
    card = FakeCard(tmp_path / "card")
    a = start_fake(FAKE_CUDA_TOTAL=str(GiB), **card.env)
    b = start_fake(FAKE_CUDA_TOTAL=str(GiB), **card.env)
    handle = a.call(f"v.create({256 * MiB})")
    b.call(f"v.alloc({100 * MiB})")
    assert card.used() == 356 * MiB
    assert card.used_by(a.pid) == 256 * MiB and card.used_by(b.pid) == 100 * MiB
    assert b.call("v.free_bytes()") == GiB - 356 * MiB  # the other process's memory shows
    assert b.call(f"v.create_result({768 * MiB})") == OUT_OF_MEMORY
    assert a.call(f"v.release({handle})") == 0
    assert b.call(f"v.create_result({768 * MiB})") == 0


def test_a_process_that_exits_or_dies_leaves_the_card(start_fake, tmp_path: Path) -> None:
    card = FakeCard(tmp_path / "card")
    quits = start_fake(FAKE_CUDA_TOTAL=str(GiB), **card.env)
    dies = start_fake(FAKE_CUDA_TOTAL=str(GiB), **card.env)
    quits.call(f"v.create({128 * MiB})")
    dies.call(f"v.backed({256 * MiB})")
    assert card.used() == 384 * MiB
    quits.close()  # it exited: the fake driver gave its memory back on the way out
    assert card.used() == 256 * MiB
    os.kill(dies.pid, signal.SIGKILL)
    dies.process.wait()
    assert card.used_by(dies.pid) == 256 * MiB  # nobody has looked yet
    survivor = start_fake(FAKE_CUDA_TOTAL=str(GiB), **card.env)
    assert survivor.call(f"v.create_result({GiB})") == 0  # it looks: the dead one is reaped
    assert dies.pid not in card.processes()


def test_a_checkpoint_takes_the_process_off_the_card_and_its_restore_needs_room(
        start_fake, tmp_path: Path) -> None:
    card = FakeCard(tmp_path / "card")
    states = tmp_path / "states"
    states.mkdir()
    env = {"FAKE_CUDA_TOTAL": str(GiB), "FAKE_CUDA_CHECKPOINT_DIR": str(states), **card.env}
    holder, daemon, other = start_fake(**env), start_fake(**env), start_fake(**env)
    va = holder.call(f"v.backed({512 * MiB})")
    holder.call(f"v.write({va}, b'held')")
    daemon.call("(api := __import__('nodeside.evict.checkpoint', fromlist=['load'])"
                ".load(v.lib._name)) is not None")
    daemon.call(f"api.lock({holder.pid}, timeout=5)")
    daemon.call(f"api.checkpoint({holder.pid})")
    assert card.used() == 0
    assert card.processes()[holder.pid].checkpointed == 512 * MiB
    room = other.call(f"v.create({768 * MiB})")  # the card filled meanwhile
    with pytest.raises(AssertionError, match="CUDA error 2"):
        daemon.call(f"api.restore({holder.pid})")
    assert other.call(f"v.release({room})") == 0
    daemon.call(f"api.restore({holder.pid})")
    daemon.call(f"api.unlock({holder.pid})")
    assert card.used_by(holder.pid) == 512 * MiB
    assert holder.call(f"v.read({va}, 4) == b'held'")


# ---- threads, for the sanitizers ----------------------------------------------------------

def test_many_threads_evict_and_restore_at_once(start_fake) -> None:
    fake = start_fake(FAKE_CUDA_TOTAL=str(GiB))
    assert fake.call("v.cycles_on_threads(threads=4, rounds=20)", timeout=120) == []
    assert fake.call("v.physical_used()") == 0


# ---- the fake against NVIDIA's headers ------------------------------------------------------

FAKE_SOURCE = (HERE / "fake_cuda.c").read_text()
#: The fake's cuGetProcAddress table: ENTRY("base", version, per_thread, symbol).
ENTRIES = re.findall(r'ENTRY\("(\w+)", (\d+), ([01]),\s*(\w+)\)', FAKE_SOURCE)
VMM_BASES = {"cuMemGetAllocationGranularity", "cuMemAddressReserve", "cuMemAddressFree",
             "cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap", "cuMemSetAccess",
             "cuMemGetAccess", "cuMemGetAllocationPropertiesFromHandle",
             "cuMemRetainAllocationHandle", "cuDeviceGetAttribute", "cuMemHostRegister",
             "cuMemHostUnregister", "cuMemAllocHost", "cuEventRecord", "cuEventElapsedTime",
             "cuMemcpyDtoD", "cuMemsetD32", "cuMemsetD32Async", "cuPointerGetAttribute",
             "cuPointerGetAttributes", "cuPointerSetAttribute", "cuMemGetAddressRange",
             "cuMemGetHandleForAddressRange", "cuMemExportToShareableHandle",
             "cuMemImportFromShareableHandle", "cuIpcOpenMemHandle", "cuIpcCloseMemHandle"}
NO_HEADERS = pytest.param(None, marks=pytest.mark.skip(
    reason="no CUDA headers: the test extra installs nvidia-cuda-runtime-cu12 and "
           "nvidia-cuda-runtime"))


def each_toolkit() -> pytest.MarkDecorator:
    found = [pytest.param(t, id=t.label) for t in toolkits()]
    return pytest.mark.parametrize("toolkit", found or [NO_HEADERS])


def test_the_table_holds_the_vmm_entry_points() -> None:
    assert {base for base, _, _, _ in ENTRIES} >= VMM_BASES


@each_toolkit()
def test_each_entry_point_of_the_fake_is_one_the_driver_has(toolkit) -> None:
    """Each (base, version) of the fake's table is one cudaTypedefs.h declares, so that the
    fake answers cuGetProcAddress as the driver does."""
    versions = entry_point_versions(toolkit.include)
    unknown = [(base, int(version)) for base, version, per_thread, symbol in ENTRIES
               if int(version) <= toolkit.version and not symbol.endswith("_ptds")
               and int(version) not in versions.get(base, set())]
    assert not unknown, unknown


LAYOUT = r"""
#include <stddef.h>
#include <stdio.h>
#include <cuda.h>
int main(void)
{
    printf("%zu %zu %zu %zu %zu %zu %zu %zu %d %d %d %d\n", sizeof(CUmemAllocationProp),
           offsetof(CUmemAllocationProp, location), offsetof(CUmemAllocationProp, allocFlags),
           sizeof(CUmemAccessDesc), offsetof(CUmemAccessDesc, flags), sizeof(CUmemLocation),
           sizeof(CUmemGenericAllocationHandle), sizeof(CUdeviceptr),
           CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, CU_MEM_ALLOCATION_TYPE_PINNED,
           CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    return 0;
}
"""


@each_toolkit()
def test_the_fakes_structures_are_laid_out_as_cuda_h_lays_them(toolkit, tmp_path: Path) -> None:
    source, program = tmp_path / "layout.c", tmp_path / "layout"
    source.write_text(LAYOUT)
    subprocess.run(["gcc", f"-I{toolkit.include}", "-o", str(program), str(source)], check=True,
                   capture_output=True, text=True)
    printed = subprocess.run([str(program)], check=True, capture_output=True,
                             text=True).stdout.split()
    # struct allocation_prop, struct access_desc and the constants in fake_cuda.c
    assert [int(x) for x in printed] == [32, 8, 24, 12, 8, 8, 8, 8, 102, 1, 1, 3]


@each_toolkit()
def test_the_pointer_attributes_are_numbered_as_cuda_h_numbers_them(toolkit,
                                                                    tmp_path: Path) -> None:
    """vmm_calls.POINTER_ATTRIBUTES (the fake's enum pointer_attribute has the same numbers),
    and the other constants the pointer queries use."""
    names = [n for n in POINTER_ATTRIBUTES
             if n != "MEMORY_BLOCK_ID" or toolkit.version >= 12000]
    source, program = tmp_path / "numbers.c", tmp_path / "numbers"
    printed = "".join(f'    printf("%d\\n", (int)CU_POINTER_ATTRIBUTE_{n});\n' for n in names)
    source.write_text("#include <stdio.h>\n#include <cuda.h>\nint main(void)\n{\n" + printed
                      + '    printf("%d %d\\n", (int)CUDA_ERROR_NOT_FOUND, '
                        "(int)CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED);\n"
                      "    return 0;\n}\n")
    subprocess.run(["gcc", f"-I{toolkit.include}", "-o", str(program), str(source)], check=True,
                   capture_output=True, text=True)
    lines = subprocess.run([str(program)], check=True, capture_output=True,
                           text=True).stdout.split("\n")
    assert [int(x) for x in lines[:len(names)]] == [POINTER_ATTRIBUTES[n][0] for n in names]
    assert lines[len(names)].split() == [str(NOT_FOUND),
                                         str(GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED)]


# ---- through the shim, as an application's own VMM memory ----------------------------------

def test_vmm_memory_keeps_its_bytes_through_the_shim(workload, tmp_path: Path) -> None:
    """The shim passes the VMM API through today (its vmm evictor is not built yet), and its
    gated copies and launches reach real bytes; the card file counts the physical memory."""
    card = FakeCard(tmp_path / "card")
    w = workload(KIWI_SOCKET="/nonexistent/kiwi.sock", KIWI_FAIL_TIMEOUT="0", **card.env)
    va = w.call(f"__import__('vmm_calls').Calls(sys.argv[1]).backed({4 * CHUNK}, {CHUNK})")
    assert w.call(f"d.write({va + CHUNK - 2}, b'through')") == 0
    assert w.call(f"d.launch_fill({va + 3 * CHUNK}, 4, 9)") == 0
    assert w.call(f"d.read({va + CHUNK - 2}, 7) == b'through'")
    assert w.call(f"d.read({va + 3 * CHUNK}, 5) == bytes([9, 9, 9, 9, 0])")
    assert card.used_by(w.process.pid) == 4 * CHUNK
