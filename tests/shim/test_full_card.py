"""A full card never says no while an idle kernel's memory could move (issue 39 item 0).

The card is really full: the fake driver's card (``FAKE_CUDA_TOTAL``, shared through
``FAKE_CUDA_DEVICE``) is as large as the daemon is told (``--gpu-memory``, no reserve). Kernel A
(vmm) allocates and writes four 128 MiB chunks and goes idle; kernel B fills the rest of the card
with two. B's next allocation found no room on the card and failed with
CUDA_ERROR_OUT_OF_MEMORY, and B had not even registered. Now the shim reserves its addresses,
tells the daemon the working set that includes it, asks for the GPU (holding it already, gives
it back and asks again), and the allocation returns once the daemon has had A move out and the
restore on B's grant has mapped it. It fails only when the room cannot be had: a working set
larger than the card, a daemon that makes no room or refuses it (its words in the output), a
graph capture in the way.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_device import FakeCard
from scripted_daemon import ScriptedDaemon
from support import DaemonProcess, StatusEvents

MiB = 1 << 20
CHUNK = 128 * MiB
CARD = 6 * CHUNK  #: the card, and what the daemon plans with
OUT_OF_MEMORY = 2


@pytest.fixture
def card(tmp_path: Path) -> FakeCard:
    return FakeCard(tmp_path / "card")


@pytest.fixture
def daemon(start_daemon, tmp_path: Path) -> DaemonProcess:
    """Told the card's very size, with no reserve: a grant never goes out into memory that is
    not free on the card. A long quantum, grace and evict_timeout: only the kernels' own
    releases move the GPU, and a way out slowed by a loaded machine is waited for."""
    config = tmp_path / "kiwi.yaml"
    config.write_text("memory_reserve: 0\nevict_timeout: 120\n")
    return start_daemon("--gpus", "1", "--gpu-memory", f"{CARD // MiB}MiB", "--tq", "60",
                        "--grace", "60", "--config", str(config))


@pytest.fixture
def events(daemon: DaemonProcess) -> Iterator[StatusEvents]:
    with StatusEvents(daemon.socket, timeout=30) as watch:
        yield watch


def on_card(workload, card: FakeCard, socket: str, **env: str):
    """A vmm process on the full-size fake card."""
    return workload(KIWI_SOCKET=socket, KIWI_EVICT="vmm", FAKE_CUDA_TOTAL=str(CARD),
                    **card.env, **env)


def idle_with_four_chunks(workload, card: FakeCard, daemon: DaemonProcess):
    """Kernel A: four chunks written, given back, resident."""
    a = on_card(workload, card, daemon.socket, KIWI_DISPLAY_NAME="nbA.ipynb")
    pointers = [a.call(f"d.alloc({CHUNK})") for _ in range(4)]
    assert a.call("d.launch()") == 0
    for i, ptr in enumerate(pointers):
        assert a.call(f"d.write({ptr}, b'A chunk {i}')") == 0
    a.call("shim.release()")
    return a, pointers


def full_beside(workload, card: FakeCard, daemon: DaemonProcess):
    """Kernel B: two chunks, which fill what A left of the card."""
    b = on_card(workload, card, daemon.socket, KIWI_DISPLAY_NAME="nbB.ipynb")
    b.call(f"d.alloc({CHUNK})")
    b.call(f"d.alloc({CHUNK})")
    assert card.used() == CARD  # really full: A's four chunks and B's two
    return b


def client(document: dict[str, Any], w) -> dict[str, Any] | None:
    return next((c for c in document["clients"] if c["pid"] == w.process.pid), None)


def a_intact(a, pointers: list[int]) -> bool:
    return all(a.call(f"d.read({ptr}, 9) == b'A chunk {i}'", timeout=30)
               for i, ptr in enumerate(pointers))


def test_an_allocation_on_a_full_card_waits_for_an_idle_kernels_memory_to_move(
        daemon, events, workload, card) -> None:
    a, a_pointers = idle_with_four_chunks(workload, card, daemon)
    b = full_beside(workload, card, daemon)
    ptr = b.call(f"d.alloc({CHUNK})", timeout=30)  # was: MemoryError(2), and B unregistered
    # A moved out (asked while idle); B holds, its third chunk mapped at the address it got.
    document = events.wait_for(lambda d: client(d, a)["residency"] == "evicted" and d,
                               what="A in host memory")
    assert client(document, b)["state"] == "holding"
    assert (card.used_by(a.process.pid), card.used_by(b.process.pid)) == (0, 3 * CHUNK)
    assert b.call(f"d.write({ptr}, b'B third')") == 0
    assert b.call(f"d.read({ptr}, 7) == b'B third'")
    stats = b.stats()
    assert (stats["working_set"], stats["resident"], stats["grants"]) == (3 * CHUNK,
                                                                          3 * CHUNK, 1)
    b.call("shim.release()")
    assert a_intact(a, a_pointers)  # A's next GPU work: B moves out in turn, A comes back


def test_an_allocation_past_the_free_room_while_holding_gives_the_gpu_back_and_gets_it(
        daemon, events, workload, card) -> None:
    a, a_pointers = idle_with_four_chunks(workload, card, daemon)
    b = full_beside(workload, card, daemon)
    assert b.call("d.launch()") == 0  # B holds: both working sets fit the card, just
    events.wait_for(lambda d: client(d, b)["state"] == "holding", what="B holding")
    ptr = b.call(f"d.alloc({CHUNK})", timeout=30)
    # The daemon makes room only before a grant: B gave the GPU back and asked again at once.
    stats = b.stats()
    assert (stats["room_requeues"], stats["grants"], stats["state"]) == (1, 2, "holding")
    events.wait_for(lambda d: client(d, a)["residency"] == "evicted", what="A moved out")
    assert b.call(f"d.write({ptr}, b'B third')") == 0
    assert card.used_by(b.process.pid) == 3 * CHUNK
    b.call("shim.release()")
    assert a_intact(a, a_pointers)


def test_a_working_set_larger_than_the_card_fails_at_once_and_says_so(
        daemon, workload, card) -> None:
    b = on_card(workload, card, daemon.socket)
    b.call(f"d.alloc({4 * CHUNK})")
    assert b.call(f"d.alloc_result({3 * CHUNK})") == OUT_OF_MEMORY
    said = b.said("no eviction makes that room")
    assert len(said) == 1 and f"more than the {CARD} it may have" in said[0]
    assert b.stats()["state"] == "idle"  # nothing was asked of the daemon


def test_an_allocation_on_a_full_card_during_a_graph_capture_fails_at_once(
        daemon, workload, card) -> None:
    a, _ = idle_with_four_chunks(workload, card, daemon)
    b = on_card(workload, card, daemon.socket)
    b.call(f"d.alloc({2 * CHUNK})")
    assert b.call("d.begin_capture(0x66)") == 0
    assert b.call(f"d.alloc_result({CHUNK})") == OUT_OF_MEMORY  # the GPU cannot change hands
    assert b.said("during a graph capture")
    assert b.call("d.end_capture(0x66)") == 0
    assert card.used_by(a.process.pid) == 4 * CHUNK


@pytest.fixture
def scripted(tmp_path: Path) -> Iterator[ScriptedDaemon]:
    daemon = ScriptedDaemon(tmp_path / "scripted.sock")
    yield daemon
    daemon.close()


def test_an_allocation_waiting_for_room_fails_at_the_daemons_refusal_with_its_words(
        scripted, workload, card) -> None:
    why = "nbB needs 768.0 MiB on GPU 0 ... held by nbA (512.0 MiB, pinned allocations)"
    scripted.refuse_room = why
    b = on_card(workload, card, str(scripted.path), FAKE_CUDA_OTHERS_USED=str(4 * CHUNK))
    b.call(f"d.alloc({2 * CHUNK})")
    assert b.call(f"d.alloc_result({CHUNK})", timeout=30) == OUT_OF_MEMORY
    said = b.said("the card is full, and")
    assert len(said) == 1 and why in said[0]
    # The daemon heard the working set the wait was for.
    scripted.wait_for(lambda m: 3 * CHUNK in (m.get("working_set"), m.get("bytes")),
                      what="the working set with the allocation that waits")
    assert b.stats()["working_set"] == 2 * CHUNK  # the failed allocation is gone


def test_a_daemon_that_makes_no_room_fails_the_allocation_and_says_why(
        tmp_path: Path, workload, card) -> None:
    old = ScriptedDaemon(tmp_path / "old.sock", features=("position",))
    try:
        b = on_card(workload, card, str(old.path), FAKE_CUDA_OTHERS_USED=str(4 * CHUNK))
        b.call(f"d.alloc({2 * CHUNK})")
        assert b.call(f"d.alloc_result({CHUNK})", timeout=30) == OUT_OF_MEMORY
        assert b.said("predates the memory feature")
    finally:
        old.close()
