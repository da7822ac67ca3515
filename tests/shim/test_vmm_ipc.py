"""Legacy CUDA IPC of the memory the vmm evictor maps (issue 39, defect 9): torch.multiprocessing
shares a CUDA tensor with cuIpcGetMemHandle in one process and cuIpcOpenMemHandle in another. The
driver's legacy IPC cannot share VMM memory, so the shim exports it on demand through a handle
of its own (file descriptors of the physical handles, taken by the importer), pins it in place
and says so; a process running the shim opens it, one without is refused by the driver and the
exporter said so. Two real processes over the fake driver, whose exported handles share their
bytes between processes (tests/shim/fake_cuda.c).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_device import FakeCard
from support import scaled, wait_for
from test_fake_vmm import FakeProcess
from test_scheduling import other_client
from test_vmm_evictor import GiB, MiB, hold_with, vmm
from vmm_calls import INVALID_VALUE


def said(w, words: str) -> bool:
    return any(words in line for line in w.stderr)


def test_a_process_running_the_shim_opens_vmm_memory_another_shares(workload,
                                                                      card: FakeCard) -> None:
    exporter, importer = vmm(workload, card), vmm(workload, card)
    ptr = exporter.call(f"d.alloc({8 * MiB})")
    assert exporter.call(f"d.write({ptr + 100}, b'from the exporter')") == 0
    code, handle = exporter.call(f"d.ipc.get({ptr})")
    assert code == 0
    code, there = importer.call(f"d.ipc.open({handle!r})")
    assert code == 0
    assert importer.call(f"d.read({there + 100}, 17) == b'from the exporter'")
    assert importer.call(f"d.write({there + 8 * MiB - 5}, b'reply')") == 0
    assert exporter.call(f"d.read({ptr + 8 * MiB - 5}, 5) == b'reply'")  # one memory
    assert card.used() == 8 * MiB  # the exporter's, once
    assert importer.stats()["working_set"] == 0  # not the importer's memory
    stats = exporter.stats()
    assert (stats["working_set"], stats["evictable"]) == (8 * MiB, 0)  # pinned in place
    wait_for(lambda: said(exporter, "only processes running the Kiwi shim can open it"),
             what="the exporter to say so")


def test_a_small_allocation_opens_at_its_own_address_in_the_shared_slab(
        workload, card: FakeCard) -> None:
    exporter, importer = vmm(workload, card), vmm(workload, card)
    exporter.call(f"d.alloc({4096})")
    ptr = exporter.call(f"d.alloc({1000})")  # the second in the slab
    exporter.call(f"d.write({ptr}, b'small')")
    code, handle = exporter.call(f"d.ipc.get({ptr})")
    code, there = importer.call(f"d.ipc.open({handle!r})")
    assert code == 0 and there % (2 * MiB) == ptr % (2 * MiB)
    assert importer.call(f"d.read({there}, 5) == b'small'")


def test_one_handle_opened_twice_is_one_address_until_its_last_close(workload,
                                                                      card: FakeCard) -> None:
    exporter, importer = vmm(workload, card), vmm(workload, card)
    ptr = exporter.call(f"d.alloc({4 * MiB})")
    _, handle = exporter.call(f"d.ipc.get({ptr})")
    assert exporter.call(f"d.ipc.get({ptr})")[1] == handle  # exported once
    first = importer.call(f"d.ipc.open({handle!r})")
    assert importer.call(f"d.ipc.open({handle!r})") == first
    assert importer.call(f"d.ipc.close({first[1]})") == 0
    assert importer.call(f"len(d.read({first[1]}, 1))") == 1  # still open once
    importer.log.clear()
    assert importer.call(f"d.ipc.close({first[1]})") == 0
    assert len(importer.log.calls("cuMemUnmap")) == 1 and importer.log.calls("cuMemAddressFree")
    assert importer.call(f"d.ipc.close({first[1]})") == INVALID_VALUE  # the driver's: unknown


def test_shared_memory_stays_on_the_card_through_an_eviction(scheduler, workload,
                                                             card: FakeCard) -> None:
    exporter = vmm(workload, card, scheduler.socket)
    shared, moved = hold_with(exporter, scheduler, [8 * MiB, 16 * MiB])
    code, handle = exporter.call(f"d.ipc.get({shared})")
    assert code == 0
    importer = vmm(workload, card)
    there = importer.call(f"d.ipc.open({handle!r})")[1]
    with other_client(scheduler, "next", 8 * GiB) as next_holder:
        next_holder.acquire(timeout=scaled(30))
        assert card.used_by(exporter.process.pid) == 8 * MiB  # the shared one stayed
        assert importer.call(f"d.write({there}, b'while away')") == 0
    assert exporter.call(f"d.read({shared}, 10) == b'while away'")


def test_a_handle_of_evicted_memory_waits_for_the_restore(scheduler, workload,
                                                         card: FakeCard) -> None:
    exporter = vmm(workload, card, scheduler.socket)
    ptr, = hold_with(exporter, scheduler, [8 * MiB])
    with other_client(scheduler, "next", 8 * GiB) as next_holder:
        next_holder.acquire(timeout=scaled(30))
        asked = exporter.start(f"d.ipc.get({ptr})")
        wait_for(lambda: exporter.stats()["state"] == "waiting", what="the export to wait")
    assert asked.result()[0] == 0
    assert card.used_by(exporter.process.pid) == 8 * MiB


@pytest.fixture
def plain_process(fake_cuda: Path, card: FakeCard) -> Iterator[FakeProcess]:
    """A process over the fake driver without the shim."""
    process = FakeProcess(fake_cuda, card.env)
    yield process
    process.close()


def test_a_process_without_the_shim_is_refused_by_the_driver(workload, card: FakeCard,
                                                             plain_process) -> None:
    exporter = vmm(workload, card)
    ptr = exporter.call(f"d.alloc({4 * MiB})")
    _, handle = exporter.call(f"d.ipc.get({ptr})")
    assert plain_process.call(f"v.ipc.open({handle!r})")[0] == INVALID_VALUE
