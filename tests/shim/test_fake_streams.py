"""The fake driver's streams, events and link (tests/shim/fake_streams.c), as the shim's tests
need them to catch what a GPU would: work queued on a stream is done later, by the stream, and
only a synchronization or an event says when; a copy to pageable memory waits for its stream
and is made in the call; copies take the link's time, one direction queueing, the two
overlapping; pinning takes time and holds the driver; and the calls graph capture forbids
invalidate a capture as the driver's rules say.

Each test drives the fake in a process of its own (conftest.py's ``start_fake``). Timing is
read from the fake's own log (the engines' reservations), never from a clock in the test.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from pathlib import Path

from fake_process import FakeProcess
from vmm_calls import ILLEGAL_ADDRESS, GiB, MiB

PENDING = 0x77  # FAKE_CUDA_PENDING_STREAM: no work done until the file exists
NOT_READY = 600
CAPTURE_UNSUPPORTED, CAPTURE_INVALIDATED = 900, 901
GLOBAL, THREAD_LOCAL, RELAXED = 0, 1, 2


def held(start_fake: Callable[..., FakeProcess], tmp_path: Path, **env: str
         ) -> tuple[FakeProcess, Path, Path]:
    """A process whose stream 0x77 does nothing until the file returned is made; and its log."""
    log, gate = tmp_path / "cuda.log", tmp_path / "go"
    fake = start_fake(FAKE_CUDA_TOTAL=str(GiB), FAKE_CUDA_PENDING_STREAM=hex(PENDING),
                      FAKE_CUDA_PENDING_UNTIL=str(gate), FAKE_CUDA_LOG=str(log), **env)
    return fake, gate, log


def lines(log: Path, name: str) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.split(" ", 1)[0] == name]


def numbers(line: str) -> dict[str, int]:
    return {key: int(value) for key, value in re.findall(r"(\w+)=(-?\d+)\b", line)}


def test_an_asynchronous_copy_is_done_by_its_stream_not_by_the_call(start_fake,
                                                                     tmp_path: Path) -> None:
    fake, gate, _ = held(start_fake, tmp_path)
    va = fake.call(f"v.backed({2 * MiB})")
    fake.call(f"v.write({va}, b'on the card')")
    host = fake.call(f"v.alloc_host({2 * MiB})")  # pinned: the copy is queued
    event = fake.call("v.event()")
    assert fake.call(f"v.copy_on('cuMemcpyDtoHAsync_v2', {host}, {va}, 11, {PENDING})") == 0
    assert fake.call(f"v.record_event({event}, {PENDING})") == 0
    assert fake.call(f"v.host_read({host}, 11) == bytes(11)")  # not done yet
    assert fake.call(f"v.query({event})") == NOT_READY
    gate.touch()
    assert fake.call(f"v.synchronize({PENDING})") == 0
    assert fake.call(f"v.host_read({host}, 11) == b'on the card'")
    assert fake.call(f"v.query({event})") == 0


def test_a_copy_to_pageable_memory_waits_for_its_stream_and_is_made_in_the_call(
        start_fake, tmp_path: Path) -> None:
    fake, gate, log = held(start_fake, tmp_path)
    va = fake.call(f"v.backed({2 * MiB})")
    pageable = fake.call(f"v.host_pages({2 * MiB})")
    assert fake.call(f"v.memset_async({va}, 7, 16, {PENDING})") == 0  # queued, held
    opener = threading.Timer(0.2, gate.touch)  # the copy must wait for it, however late
    opener.start()
    try:
        assert fake.call(
            f"v.copy_on('cuMemcpyDtoHAsync_v2', {pageable}, {va}, 16, {PENDING})") == 0
    finally:
        opener.join()
    assert fake.call(f"list(v.host_read({pageable}, 16))") == [7] * 16  # done on return
    copy, = lines(log, "cuMemcpyDtoHAsync_v2")
    assert "pageable=1" in copy


def test_an_event_and_a_wait_on_it_order_two_streams(start_fake, tmp_path: Path) -> None:
    fake, gate, _ = held(start_fake, tmp_path)
    va = fake.call(f"v.backed({2 * MiB})")
    host = fake.call(f"v.alloc_host({2 * MiB})")
    event = fake.call("v.event()")
    assert fake.call(f"v.memset_async({va}, 9, 8, {PENDING})") == 0
    assert fake.call(f"v.record_event({event}, {PENDING})") == 0
    assert fake.call(f"v.wait_event(0x88, {event})") == 0
    assert fake.call(f"v.copy_on('cuMemcpyDtoHAsync_v2', {host}, {va}, 8, 0x88)") == 0
    gate.touch()
    assert fake.call("v.synchronize(0x88)") == 0
    assert fake.call(f"list(v.host_read({host}, 8))") == [9] * 8  # after the memset


def test_memory_unmapped_under_a_queued_copy_is_a_fault_every_synchronization_reports(
        start_fake, tmp_path: Path) -> None:
    fake, gate, log = held(start_fake, tmp_path)
    va = fake.call(f"v.backed({2 * MiB})")
    host = fake.call(f"v.alloc_host({2 * MiB})")
    assert fake.call(f"v.copy_on('cuMemcpyDtoHAsync_v2', {host}, {va}, {MiB}, {PENDING})") == 0
    assert fake.call(f"v.unmap({va}, {2 * MiB})") == 0  # before the copy's turn
    gate.touch()
    assert fake.call(f"v.synchronize({PENDING})") == ILLEGAL_ADDRESS
    assert fake.call("v.context_synchronize()") == ILLEGAL_ADDRESS  # sticky
    assert lines(log, "fault")


def test_copies_of_one_direction_queue_and_the_two_directions_overlap(start_fake,
                                                                     tmp_path: Path) -> None:
    log = tmp_path / "cuda.log"
    fake = start_fake(FAKE_CUDA_TOTAL=str(GiB), FAKE_CUDA_LINK_GBPS="0.2", FAKE_CUDA_LOG=str(log))
    va = fake.call(f"v.backed({16 * MiB})")
    host = fake.call(f"v.alloc_host({16 * MiB})")
    out = [f"v.copy_on('cuMemcpyDtoHAsync_v2', {host + i * 4 * MiB}, {va}, {4 * MiB}, {stream})"
           for i, stream in enumerate((0x81, 0x82))]
    back = f"v.copy_on('cuMemcpyHtoDAsync_v2', {va + 8 * MiB}, {host + 8 * MiB}, {4 * MiB}, 0x83)"
    assert [fake.call(expr) for expr in (*out, back)] == [0, 0, 0]
    assert fake.call("v.context_synchronize()") == 0
    links = [numbers(line) | {"to_host": "to-host" in line} for line in lines(log, "link")]
    assert len(links) == 3
    need = 4 * MiB * 10**9 // (2 * 10**8)  # ns at 0.2 GB/s
    for reserved in links:
        assert abs(reserved["end"] - reserved["start"] - need) <= 1
    first, second = sorted((r for r in links if r["to_host"]), key=lambda r: r["start"])
    assert second["start"] == max(second["asked"], first["end"])  # queued behind the first
    inward, = (r for r in links if not r["to_host"])
    assert inward["start"] == inward["asked"]  # its own engine: it waited for nothing


def test_pageable_copies_are_slower_than_pinned_ones(start_fake, tmp_path: Path) -> None:
    log = tmp_path / "cuda.log"
    fake = start_fake(FAKE_CUDA_TOTAL=str(GiB), FAKE_CUDA_LINK_GBPS="1", FAKE_CUDA_LOG=str(log))
    va = fake.call(f"v.backed({2 * MiB})")
    host = fake.call(f"v.alloc_host({2 * MiB})")
    assert fake.call(f"v.copy_on('cuMemcpyDtoHAsync_v2', {host}, {va}, {MiB}, 0x81)") == 0
    # Its stream's worker takes the link when it gets to run: done before the pageable copy
    # asks, so the log's first line is the pinned copy's.
    assert fake.call("v.context_synchronize()") == 0
    fake.call(f"len(v.read({va}, {MiB}, call='cuMemcpyDtoHAsync_v2'))")  # pageable
    pinned, pageable = (r["end"] - r["start"] for r in map(numbers, lines(log, "link")))
    assert pageable == 5 * pinned  # a fifth of the link, by default


def test_pinning_holds_the_driver_and_copies_wait_for_it(start_fake, tmp_path: Path) -> None:
    log = tmp_path / "cuda.log"
    fake = start_fake(FAKE_CUDA_TOTAL=str(GiB), FAKE_CUDA_PIN_GBPS="0.1", FAKE_CUDA_LOG=str(log))
    va = fake.call(f"v.backed({2 * MiB})")
    host = fake.call(f"v.alloc_host({2 * MiB})")
    assert fake.call(f"v.copy_while_pinning({str(log)!r}, {host}, {va}, {MiB}, {32 * MiB})",
                     timeout=60) == 0
    names = [line.split(" ", 1)[0] for line in log.read_text().splitlines()]
    began = names.index("pinning", names.index("cuMemAllocHost_v2") + 1)
    # The copy asked while the driver pinned: it went through once the pinning was over.
    assert began < names.index("pinned", began) < names.index("cuMemcpyDtoHAsync_v2")


def test_pinning_from_another_thread_during_a_global_capture_invalidates_it(
        start_fake) -> None:
    fake = start_fake(FAKE_CUDA_TOTAL=str(GiB))
    shadow = fake.call(f"v.host_pages({2 * MiB})")
    assert fake.call(f"v.begin_capture(0x66, {GLOBAL})") == 0
    assert fake.call(f"v.on_thread('register', {shadow}, {2 * MiB})") == CAPTURE_UNSUPPORTED
    assert fake.call("v.end_capture(0x66)") == CAPTURE_INVALIDATED


def test_captures_that_are_not_global_or_threads_that_are_relaxed_let_pinning_be(
        start_fake) -> None:
    fake = start_fake(FAKE_CUDA_TOTAL=str(GiB))
    shadow = fake.call(f"v.host_pages({4 * MiB})")
    assert fake.call(f"v.begin_capture(0x66, {THREAD_LOCAL})") == 0
    assert fake.call(f"v.on_thread('register', {shadow}, {2 * MiB})") == 0
    assert fake.call(f"v.register({shadow} + {2 * MiB}, {2 * MiB})") == CAPTURE_UNSUPPORTED
    assert fake.call("v.end_capture(0x66)") == CAPTURE_INVALIDATED  # its own thread's call
    assert fake.call(f"v.begin_capture(0x66, {GLOBAL})") == 0
    assert fake.call(f"v.on_thread('unregister', {shadow}, mode={RELAXED})") == 0
    assert fake.call("v.end_capture(0x66)") == 0
