"""The memory feature end to end (issue 31, "Tests"): the real daemon on a real Unix socket, told
how much memory its GPU has (``--gpu-memory``), and real shimmed processes under the vmm evictor
(issue 30) on one card of the fake driver (tests/shim/fake_cuda.c), which counts each process's
bytes on the card itself (tests/shim/fake_device.py reads that count as NVML would).

Two working sets that do not fit together take turns: each grant first has the daemon ask the
idle one to move its memory to host memory (the ``evict`` event), so after every switch the card
holds exactly one of them, and the other's bytes are in host memory, intact and at the same
addresses when its turn comes again. With room for both, nothing moves. The status document and
``kiwictl status`` show the figures the shims report.

Working sets are tens of MiB: the fake keeps real bytes for VMM memory and an eviction copies
them for real. The daemon plans with ``--gpu-memory`` less its reserve (``memory_reserve``,
512 MiB by default), so the capacities below are that reserve plus the room the test means.
Every wait is on an event: the workload's reply, or the daemon's ``changed`` events.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fake_device import FakeCard
from support import DaemonProcess, StatusEvents, scaled
from test_vmm_evictor import field

MiB = 1 << 20
RESERVE = 512 * MiB  #: the daemon's default memory_reserve, which the capacity leaves aside
#: Each process's working set: two allocations (two physical chunks each its own copy).
SIZES = (24 * MiB, 8 * MiB)
WORKING_SET = sum(SIZES)
ROUNDS = 3
ROOM_FOR_ONE = WORKING_SET + 4 * MiB


def daemon_with_room(start_daemon, room: int) -> DaemonProcess:
    """The real daemon with one GPU on which ``room`` bytes are free for working sets; a long
    quantum and grace, so only the shims' own releases move the GPU."""
    return start_daemon("--tq", "60", "--grace", "30", "--gpus", "1",
                        "--gpu-memory", f"{(RESERVE + room) // MiB}MiB")


@pytest.fixture
def room_for_one(start_daemon) -> DaemonProcess:
    """Room for one working set, and less than either allocation beside it: a grant never goes
    out while any of the other's memory is still on the card (no overlap to race with)."""
    return daemon_with_room(start_daemon, ROOM_FOR_ONE)


@pytest.fixture
def room_for_two(start_daemon) -> DaemonProcess:
    return daemon_with_room(start_daemon, 2 * WORKING_SET + WORKING_SET // 2)


class Kernel:
    """A shimmed process under the vmm evictor with one working set (allocations of ``sizes``)
    whose bytes it can check."""

    def __init__(self, workload, card: FakeCard, daemon: DaemonProcess, name: str,
                 sizes: tuple[int, ...] = SIZES, **env: str) -> None:
        self.name = name
        self.card = card
        self.sizes = sizes
        self.w = workload(KIWI_SOCKET=daemon.socket, KIWI_EVICT="vmm", KIWI_DISPLAY_NAME=name,
                          **card.env, **env)
        self.pid = self.w.process.pid
        self.pointers = [self.w.call(f"d.alloc({size})") for size in sizes]
        self.tag = 0
        self.written = False

    def pattern(self, i: int) -> bytes:
        """What allocation i holds at its start and at its end, round self.tag."""
        return f"{self.name} round {self.tag} allocation {i}".encode()

    def write(self) -> None:
        for i, (ptr, size) in enumerate(zip(self.pointers, self.sizes, strict=True)):
            data = self.pattern(i)
            assert self.w.call(f"d.write({ptr}, {data!r})") == 0
            assert self.w.call(f"d.write({ptr + size - len(data)}, {data!r})") == 0
        self.written = True

    def intact(self) -> bool:
        """Whether both ends of every allocation still hold what was last written, read at the
        addresses the allocations were given (a read is GPU work: it waits for the grant and
        for the restore)."""
        for i, (ptr, size) in enumerate(zip(self.pointers, self.sizes, strict=True)):
            data = self.pattern(i)
            n = len(data)
            if self.w.call(f"d.read({ptr}, {n}) == {data!r}") is not True or \
                    self.w.call(f"d.read({ptr + size - n}, {n}) == {data!r}") is not True:
                return False
        return True

    def turn(self) -> None:
        """Wait for the GPU (d.launch returns once granted and restored), check its bytes, write
        the next round's, release."""
        assert self.w.call("d.launch()", timeout=scaled(30)) == 0
        assert not self.written or self.intact(), f"{self.name}'s memory changed while away"
        self.tag += 1
        self.write()

    def release(self) -> None:
        self.w.call("shim.release()")

    def on_card(self) -> int:
        return self.card.used_by(self.pid)


def client(document: dict[str, Any], kernel: Kernel) -> dict[str, Any] | None:
    return next((c for c in document["clients"] if c["pid"] == kernel.pid), None)


def residency(document: dict[str, Any], kernel: Kernel) -> tuple[str, int, int] | None:
    c = client(document, kernel)
    return (c["residency"], c["resident_bytes"], c["host_bytes"]) if c else None


def registered(watch: StatusEvents, *kernels: Kernel) -> dict[str, Any]:
    """The document once every kernel registered and reported its whole working set."""
    return watch.wait_for(
        lambda d: all(residency(d, k) == ("resident", WORKING_SET, 0) for k in kernels) and d,
        what="the shims' reports")


def switched_to(watch: StatusEvents, holder: Kernel, away: Kernel) -> dict[str, Any]:
    """The document once holder holds with its memory back on the GPU and away's is in host
    memory (the daemon hears `evicted` and the restore's report after the grant went out)."""
    def settled(d: dict[str, Any]) -> dict[str, Any] | None:
        h = client(d, holder)
        ok = h is not None and h["state"] == "holding" and \
            residency(d, holder) == ("resident", WORKING_SET, 0) and \
            residency(d, away) == ("evicted", 0, WORKING_SET) and \
            client(d, away)["shadow_bytes"] >= WORKING_SET  # its host shadows hold it
        return d if ok else None
    return watch.wait_for(settled, what=f"{holder.name} resident, {away.name} in host memory")


def test_two_that_do_not_fit_together_alternate_with_one_resident_at_a_time(
        room_for_one, workload, card, watch) -> None:
    events = watch(room_for_one)
    a = Kernel(workload, card, room_for_one, "nbA.ipynb")
    b = Kernel(workload, card, room_for_one, "nbB.ipynb")
    # Allocations are not gated: both working sets are on the card now, and once the daemon has
    # heard both, a's first write (GPU work) needs the room: b (idle) moves out first; then b's,
    # and a moves out. (Heard first: a grant before b's report would find the room free.)
    registered(events, a, b)
    a.write()
    a.release()
    b.write()
    b.release()
    events.wait_for(lambda d: residency(d, a) == ("evicted", 0, WORKING_SET) and
                    residency(d, b) == ("resident", WORKING_SET, 0), what="a in host memory")
    assert (a.on_card(), b.on_card()) == (0, WORKING_SET)
    evictions = {a.name: 1, b.name: 1}
    for round_ in range(ROUNDS):
        for holder, away in ((a, b), (b, a)):
            holder.turn()
            # By the fake driver's own count: the holder's working set alone is on the card.
            assert (holder.on_card(), away.on_card()) == (WORKING_SET, 0), f"round {round_}"
            assert card.used() == WORKING_SET
            document = switched_to(events, holder, away)
            waiting = client(document, holder)["waiting_for"]
            assert waiting is None
            holder.release()
            evictions[away.name] += 1
    for k in (a, b):
        # The same addresses all along: reserved once, each restore mapped back into them.
        reserved = [int(field(line, "ptr"), 16) for line in k.w.log.calls("cuMemAddressReserve")]
        assert reserved == k.pointers
        maps = [int(field(line, "ptr"), 16) for line in k.w.log.calls("cuMemMap")]
        assert len(maps) > len(SIZES) and all(
            any(p <= ptr < p + size for p, size in zip(k.pointers, SIZES, strict=True))
            for ptr in maps)
        stats = k.w.stats()
        assert (stats["evict"], stats["drops"]) == ("vmm", 0)  # evicted while idle: evict events
        assert stats["evictions"] == evictions[k.name]
    b.turn()  # b held last: it still has its memory, a's is in host memory, both intact
    assert (a.on_card(), b.on_card()) == (0, WORKING_SET)
    b.release()
    a.turn()
    assert (a.on_card(), b.on_card()) == (WORKING_SET, 0)


def test_an_idle_resident_process_is_asked_to_evict_and_the_waiter_says_for_whom(
        room_for_one, workload, card, watch, tmp_path: Path) -> None:
    gate = tmp_path / "unmap-may-go"
    events = watch(room_for_one)
    a = Kernel(workload, card, room_for_one, "nbA.ipynb", FAKE_CUDA_UNMAP_GATE=str(gate))
    a.write()
    a.release()
    b = Kernel(workload, card, room_for_one, "nbB.ipynb")
    registered(events, a, b)
    a_id = client(events.status(), a)["id"]
    launch = b.w.start("d.launch()")
    # The daemon asked a (idle, least recently used, resident) to evict: its way out waits at
    # its first unmap, so b waits, and says for whom.
    document = events.wait_for(
        lambda d: client(d, b)["waiting_for"] and residency(d, a)[0] == "evicting" and d,
        what="b to wait for a's eviction")
    assert client(document, b)["state"] == "waiting"
    assert client(document, b)["waiting_for"] == {
        "client": a_id, "name": "nbA.ipynb", "bytes": WORKING_SET, "action": "evict"}
    assert not launch.done()
    assert a.on_card() == WORKING_SET  # nothing moved yet: the room is not there
    # Its stats answer while its way out holds the evictor's lock: the figures last counted.
    assert a.w.stats()["resident"] == WORKING_SET
    gate.touch()
    assert launch.result(timeout=scaled(30)) == 0
    assert (a.on_card(), b.on_card()) == (0, WORKING_SET)
    document = switched_to(events, b, a)
    assert client(document, b)["waiting_for"] is None
    stats = a.w.stats()
    # Asked while idle: an evict event, never a drop.
    assert (stats["evictions"], stats["drops"], stats["evicted"]) == (1, 0, True)
    b.release()
    assert a.intact()  # a's next GPU work: b is asked in turn, a's bytes come back
    assert (a.on_card(), b.on_card()) == (WORKING_SET, 0)


def test_with_room_for_both_nothing_is_evicted(room_for_two, workload, card, watch) -> None:
    events = watch(room_for_two)
    a = Kernel(workload, card, room_for_two, "nbA.ipynb")
    b = Kernel(workload, card, room_for_two, "nbB.ipynb")
    a.write()
    a.release()
    registered(events, a, b)
    for _ in range(ROUNDS):
        for k in (b, a):
            k.turn()
            assert (a.on_card(), b.on_card()) == (WORKING_SET, WORKING_SET)
            document = events.wait_for(
                lambda d, k=k: client(d, k)["state"] == "holding" and d,
                what=f"{k.name} holding")
            assert residency(document, a) == residency(document, b) == (
                "resident", WORKING_SET, 0)
            assert client(document, k)["waiting_for"] is None
            k.release()
    for k in (a, b):
        stats = k.w.stats()
        assert (stats["evictions"], stats["evicted"]) == (0, False)
    document = events.status()
    assert document["gpus"][0]["host_bytes"] == 0
    assert document["gpus"][0]["resident_bytes"] == 2 * WORKING_SET


def test_the_status_document_and_kiwictl_show_the_shims_figures(
        room_for_one, workload, card, watch) -> None:
    events = watch(room_for_one)
    a = Kernel(workload, card, room_for_one, "nbA.ipynb")
    a.write()
    a.release()
    b = Kernel(workload, card, room_for_one, "nbB.ipynb")
    document = registered(events, a, b)
    gpu = document["gpus"][0]
    assert (gpu["resident_bytes"], gpu["host_bytes"]) == (2 * WORKING_SET, 0)
    assert gpu["capacity"] == RESERVE + ROOM_FOR_ONE
    for k in (a, b):
        c = client(document, k)
        assert (c["memory_source"], c["display_name"]) == ("shim", k.name)
    b.turn()
    document = switched_to(events, b, a)
    gpu = document["gpus"][0]
    assert (gpu["resident_bytes"], gpu["host_bytes"]) == (WORKING_SET, WORKING_SET)
    assert client(document, a)["memory_source"] == "shim"
    shown = subprocess.run(
        [sys.executable, "-m", "nodeside.ctl", "--socket", room_for_one.socket, "status"],
        capture_output=True, text=True, timeout=scaled(30), check=True).stdout
    rows = {k.name: next(line for line in shown.splitlines() if line.startswith(k.name))
            for k in (a, b)}
    assert re.search(r"\bin host memory +0 B +32\.0 MiB +0 B$", rows[a.name]), shown
    assert re.search(r"\bon GPU +32\.0 MiB +0 B +0 B$", rows[b.name]), shown
    capacity = f"{(RESERVE + ROOM_FOR_ONE) / MiB:.1f} MiB"
    assert f"memory: 32.0 MiB of {capacity} on the GPU, 32.0 MiB" in shown, shown
