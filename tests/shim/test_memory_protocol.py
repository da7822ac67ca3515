"""The shim's side of the memory protocol (the hello feature `memory`, issue 31,
/work/wt/MEMORY-PROTOCOL.md at the time of writing): where its memory is in `register` and
`working_set`, the daemon's `evict` answered while idle, `release` with `evicting` before the way
out, `evicted` at its end or for a restore that failed; and today's protocol, unchanged, to a
daemon that does not list the feature.

The daemon's side of it was not on main when these were written, so the daemon here is scripted
on a real Unix socket (scripted_daemon.py), answering as the protocol says; the rest is real:
the shim, the fake driver's card.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_device import FakeCard
from scripted_daemon import Message, ScriptedDaemon
from support import wait_for
from test_scheduling import client_of
from test_vmm_evictor import holds

MiB = 1 << 20


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[ScriptedDaemon]:
    scripted = ScriptedDaemon(tmp_path / "memory.sock")
    yield scripted
    scripted.close()


@pytest.fixture
def old_daemon(tmp_path: Path) -> Iterator[ScriptedDaemon]:
    scripted = ScriptedDaemon(tmp_path / "old.sock", features=("position",))
    yield scripted
    scripted.close()


def vmm(workload, card: FakeCard, daemon: ScriptedDaemon, **env: str):
    return workload(KIWI_SOCKET=str(daemon.path), KIWI_EVICT="vmm", **card.env, **env)


def tags(w, pointers: list[int]) -> None:
    for i, ptr in enumerate(pointers):
        assert w.call(f"d.write({ptr}, b'chunk {i}')") == 0


def release_all_but_heads(w, pointers: list[int], size: int) -> None:
    """Tells the shim that all but the first 2 MiB of each allocation is free in the
    framework's cache: an eviction releases those without a copy."""
    w.call("shim.free_ranges_begin()")
    assert w.call(f"shim.set_free_ranges({[(p + 2 * MiB, size - 2 * MiB) for p in pointers]})")


def test_hello_asks_for_memory_and_register_says_where_it_is_and_the_display_name(
        daemon, workload, card) -> None:
    w = vmm(workload, card, daemon, KIWI_DISPLAY_NAME="work/nbA.ipynb")
    w.call(f"d.alloc({8 * MiB})")
    assert "memory" in daemon.wait_op("hello")["features"]
    register = daemon.wait_op("register")
    assert register["display_name"] == "work/nbA.ipynb"
    assert (register["evict"], register["resident"], register["host"]) == ("vmm", 8 * MiB, 0)
    w.call(f"d.alloc({4 * MiB})")
    report = daemon.wait_op("working_set", bytes=12 * MiB)
    assert (report["resident"], report["host"]) == (12 * MiB, 0)


def test_a_daemon_that_comes_back_hears_where_the_memory_is_in_register(
        daemon, workload, card) -> None:
    w = vmm(workload, card, daemon)
    w.call(f"d.alloc({8 * MiB})")  # allocations are not gated: it never held the GPU
    daemon.send(op="evict", gpu=0, bytes=8 * MiB, **{"for": "nbA.ipynb"})
    daemon.wait_op("evicted")
    daemon.hang_up()
    again = daemon.wait_for(lambda m: m["op"] == "register" and m is not
                            daemon.messages("register")[0], what="a second register")
    assert (again["resident"], again["host"]) == (0, 8 * MiB) and again["shadow"] >= 8 * MiB


def test_a_daemon_without_the_feature_hears_todays_protocol(old_daemon, workload,
                                                            card) -> None:
    w = vmm(workload, card, old_daemon, KIWI_DISPLAY_NAME="nbB.ipynb")
    ptr = w.call(f"d.alloc({8 * MiB})")
    register = old_daemon.wait_op("register")
    assert register["display_name"] == "nbB.ipynb"  # today's protocol has it
    assert not {"resident", "host", "shadow"} & register.keys()
    assert w.call("d.launch()") == 0
    w.call(f"d.write({ptr}, b'kept')")
    old_daemon.send(op="drop", gpu=0, reason="quantum", evict=True, grace=30)
    release = old_daemon.wait_op("release")
    assert "evicting" not in release
    assert card.used_by(w.process.pid) == 0  # evicted before the release, as ever
    report = old_daemon.wait_op("working_set")
    assert set(report) == {"op", "seq", "bytes", "evictable"}
    assert holds(w, ptr, b"kept")
    assert not old_daemon.messages("evicted")


def test_working_set_reports_are_at_most_one_each_50_ms(daemon, workload, card) -> None:
    w = vmm(workload, card, daemon)
    w.call(f"d.alloc({2 * MiB})")
    daemon.wait_op("working_set", bytes=2 * MiB)
    started = time.monotonic()
    w.call(f"[d.alloc({2 * MiB}) for _ in range(30)]")
    ended = time.monotonic()
    final = daemon.wait_op("working_set", bytes=62 * MiB)  # the last figures do get through
    assert (final["resident"], final["host"]) == (62 * MiB, 0)
    during = [t for t, _ in daemon.timed("working_set") if t >= started]
    # Sent from the burst's start to at most one interval after its end (the one held back):
    # at most one per interval, however the daemon's reading of them bunches them up; and the
    # 30 changes were not 30 reports.
    assert len(during) <= math.ceil((ended + 0.05 - started) / 0.05) + 1
    assert len(during) < 30


def test_an_evict_event_moves_the_memory_out_reports_as_it_goes_and_says_evicted(
        daemon, workload, card) -> None:
    w = vmm(workload, card, daemon)
    size = 128 * MiB
    pointers = [w.call(f"d.alloc({size})") for _ in range(3)]
    assert w.call("d.launch()") == 0
    tags(w, pointers)
    w.call("shim.release()")  # idle now, its memory on the card
    daemon.wait_op("release")
    release_all_but_heads(w, pointers, size)
    daemon.send(op="evict", gpu=0, bytes=3 * size, **{"for": "nbA.ipynb"})
    evicted = daemon.wait_op("evicted")
    assert "failed" not in evicted
    assert (evicted["resident"], evicted["host"], evicted["moved"]) == (0, 6 * MiB, 6 * MiB)
    assert evicted["shadow"] >= evicted["host"]  # what is in host memory is in its shadows
    assert card.used_by(w.process.pid) == 0
    # At 256 MiB off the card, the progress; the comm thread drops it when the move's end comes
    # with it (a loaded machine woke it late): `evicted` says more.
    during = [m for m in daemon.messages("working_set") if m["host"] > 0]
    assert [(m["resident"], m["host"]) for m in during] in ([(size, 4 * MiB)], [])
    assert w.stats()["evicted"]
    for i, ptr in enumerate(pointers):  # the next GPU call asks, is granted and restores
        assert holds(w, ptr, f"chunk {i}".encode())
    back = daemon.wait_for(lambda m: m["op"] == "working_set" and m["resident"] == 3 * size,
                           what="the report after the restore")
    assert back["host"] == 0


def test_a_drop_that_needs_the_room_releases_before_the_way_out(daemon, workload, card,
                                                               tmp_path: Path) -> None:
    gate = tmp_path / "unmap-may-go"
    w = vmm(workload, card, daemon, FAKE_CUDA_UNMAP_GATE=str(gate))
    daemon.released_evict = True  # the room was needed: the way out, once, is the answer
    ptr = w.call(f"d.alloc({16 * MiB})")
    assert w.call("d.launch()") == 0
    w.call(f"d.write({ptr}, b'kept')")
    daemon.send(op="drop", gpu=0, reason="room", evict=True, grace=30)
    release = daemon.wait_op("release")
    assert release.get("evicting") is True
    # The hold ended with the memory still on the card (its way out waits at the first unmap):
    # the next holder's way in may begin meanwhile.
    assert card.used_by(w.process.pid) == 16 * MiB and not daemon.messages("evicted")
    gate.touch()
    evicted = daemon.wait_op("evicted")
    assert (evicted["resident"], evicted["host"], evicted["moved"]) == (0, 16 * MiB, 16 * MiB)
    assert card.used_by(w.process.pid) == 0
    assert w.stats()["evictions"] == 1 and len(daemon.messages("evicted")) == 1
    ops = [m["op"] for m in daemon.messages()]
    assert ops.index("release", ops.index("grant") if "grant" in ops else 0) < ops.index(
        "evicted")
    assert holds(w, ptr, b"kept")


def test_a_restore_without_room_says_evicted_failed_then_releases(daemon, workload,
                                                                  card) -> None:
    w = vmm(workload, card, daemon, FAKE_CUDA_TOTAL=str(128 * MiB))
    ptr = w.call(f"d.alloc({64 * MiB})")
    w.call(f"d.write({ptr}, b'kept')")
    w.call("shim.release()")  # idle now
    daemon.wait_op("release")
    daemon.send(op="evict", gpu=0, bytes=64 * MiB, **{"for": "other"})
    assert "failed" not in daemon.wait_op("evicted")
    other = workload(KIWI_SHIM="0", FAKE_CUDA_TOTAL=str(128 * MiB), **card.env)
    other.call("globals().__setitem__('v', __import__('vmm_calls').Calls(sys.argv[1]))")
    taken = other.call(f"v.backed({96 * MiB}, {32 * MiB})")
    reading = w.start(f"d.read({ptr}, 4) == b'kept'")
    failed = daemon.wait_for(lambda m: m["op"] == "evicted" and "failed" in m,
                             what="evicted with failed")
    assert failed["failed"] == "restore: out of memory"
    assert (failed["resident"], failed["host"]) == (0, 64 * MiB)
    # The grant is given back right after: the release is the next thing it says.
    daemon.wait_for(lambda m: m["op"] == "release" and m["seq"] > failed["seq"],
                    what="the release after it")
    messages = daemon.messages()
    after = messages[messages.index(failed):]
    assert [m["op"] for m in after][:2] == ["evicted", "release"]
    other.call(f"v.unmap({taken}, {96 * MiB})")
    assert reading.result(timeout=30) is True
    wait_for(lambda: card.used_by(w.process.pid) == 64 * MiB, what="the restore")


@pytest.mark.parametrize("given, shown", [
    ("work/nbA.ipynb", "work/nbA.ipynb"),
    ("tab\there\x85and \xff", "tab here and ?"),  # control characters, a byte not UTF-8
    ("ä/" * 200 + "train.ipynb", None),  # 611 bytes: keeps its end
], ids=["plain", "unfit", "long"])
def test_the_real_daemon_registers_the_shim_under_its_display_name(
        scheduler, workload, given: str, shown: str | None) -> None:
    """Issue 31 item 6: a shimmed kernel shows as its notebook, not as its kernel id; what the
    environment holds is made fit for the daemon, which refuses a register over 256 bytes or
    with a control character, and closes on a line that is not UTF-8."""
    raw = given.encode("utf-8", "surrogateescape").replace(b"\xc3\xbf", b"\xff")
    w = workload(KIWI_SOCKET=scheduler.socket, KIWI_CLIENT_NAME="kernel-abc",
                 KIWI_DISPLAY_NAME=raw.decode("utf-8", "surrogateescape"))
    w.call("d.launch()")
    client = wait_for(lambda: client_of(scheduler, w), what="the shim registered")
    assert client["name"] == "kernel-abc"
    if shown is not None:
        assert client["display_name"] == shown
    else:
        assert client["display_name"].startswith("\u2026") and client["display_name"].endswith(
            "/ä/train.ipynb")
        assert len(client["display_name"].encode()) <= 256


def test_the_answer_to_an_evicting_release_moves_nothing_more(daemon, workload, card) -> None:
    """`released` with `evict: true` answers a release with `evicting` when the room was needed;
    the way out already followed the release, so nothing is evicted or said again, even when
    there was nothing to move. And a holder asked to evict says it cannot."""
    w = vmm(workload, card, daemon)
    daemon.released_evict = True
    assert w.call("d.launch()") == 0  # holding, nothing allocated
    daemon.send(op="drop", gpu=0, reason="room", evict=True, grace=30)
    assert daemon.wait_op("release").get("evicting") is True
    first = daemon.wait_op("evicted")
    assert first["moved"] == 0
    assert w.call("d.launch()") == 0  # holding again: the released was read before the grant
    daemon.send(op="evict", gpu=0, bytes=MiB, **{"for": "nbA.ipynb"})
    refused = daemon.wait_for(lambda m: m["op"] == "evicted" and "failed" in m,
                              what="evicted with failed")
    assert refused["failed"].startswith("holding the GPU")
    assert [m for m in daemon.messages("evicted") if "failed" not in m] == [first]


def _figures_before(daemon: ScriptedDaemon, release: Message) -> Message:
    """The last of the shim's messages that said where its memory is (register, working_set,
    evicted) before ``release``: what the daemon knows of it when the hold ends."""
    sent = daemon.messages()
    told = [m for m in sent[:sent.index(release)] if "resident" in m]
    assert told, f"nothing said where the memory is before the release: {sent}"
    return told[-1]


def test_the_figures_of_a_restore_reach_the_daemon_before_the_next_release(
        daemon, workload, card, tmp_path: Path) -> None:
    # The daemon makes room for the next holder from what a release leaves on the card: a
    # report after the restore that the rate limit held back would come after the release,
    # and the daemon would count the memory as still in host memory (`evicted` said so).
    gate = tmp_path / "unmap-may-go"
    w = vmm(workload, card, daemon, FAKE_CUDA_UNMAP_GATE=str(gate))
    daemon.released_evict = True
    ptr = w.call(f"d.alloc({16 * MiB})")
    assert w.call("d.launch()") == 0
    daemon.send(op="drop", gpu=0, reason="room", evict=True, grace=30)
    daemon.wait_op("release")  # its way out waits at the first unmap
    back = w.start(f"d.write({ptr}, b'back')")  # waits at the gate, to ask once it is out
    # Its grant comes within the report interval of `evicted`, and the next quantum's end
    # right behind it.
    daemon.after_grant = {"op": "drop", "gpu": 0, "reason": "quantum", "evict": True,
                          "grace": 30}
    gate.touch()
    daemon.wait_for(lambda _: len(daemon.messages("release")) == 2, what="the second release")
    report = _figures_before(daemon, daemon.messages("release")[1])
    assert (report["resident"], report["host"]) == (16 * MiB, 0)
    assert back.result() == 0


def test_a_working_set_grown_while_holding_reaches_the_daemon_before_the_release(
        daemon, workload, card) -> None:
    w = vmm(workload, card, daemon)
    assert w.call("d.launch()") == 0
    w.call(f"d.alloc({2 * MiB})")
    daemon.wait_op("working_set", bytes=2 * MiB)
    w.call(f"[d.alloc({2 * MiB}) for _ in range(8)]")  # within the rate limit's interval
    daemon.send(op="drop", gpu=0, reason="quantum", evict=False, grace=30)
    report = _figures_before(daemon, daemon.wait_op("release"))
    assert (report["bytes"], report["resident"]) == (18 * MiB, 18 * MiB)
