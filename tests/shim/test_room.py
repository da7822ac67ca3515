"""When the daemon cannot make room (issue 40 N4a and Must-work 3): a wait it refuses with an
``error`` event of code ``room`` ends (the hold is idle again), the connection stays, and the
shim asks again later and later (client/room.c), says so once, and gives up after
``KIWI_ROOM_TIMEOUT``.

The shim's side runs against a daemon scripted on a real Unix socket (scripted_daemon.py), which
refuses every acquire while told to: what the shim sends, and when, is what is checked. The real
daemon's side (refusing, and logging a refusal once a minute) is tested in tests/nodeside.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from scripted_daemon import ScriptedDaemon
from support import scaled, wait_for

OUT_OF_MEMORY = 2
REFUSAL = ("nbB.ipynb needs 4.0 GiB on GPU 0, 2.0 GiB more than is free, and that room cannot "
           "be made: the memory is held by nbA.ipynb (6.0 GiB, pinned allocations)")


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[ScriptedDaemon]:
    scripted = ScriptedDaemon(tmp_path / "room.sock")
    scripted.refuse_room = REFUSAL
    yield scripted
    scripted.close()


def asked(daemon: ScriptedDaemon, n: int, timeout: float = 20.0) -> list[float]:
    """When the shim sent its acquires, once it has sent n of them."""
    daemon.wait_for(lambda _: len(daemon.timed("acquire")) >= n, timeout,
                    what=f"{n} acquires")
    return [at for at, _ in daemon.timed("acquire")]


def test_a_wait_refused_for_room_asks_again_later_and_later_on_the_same_connection(
        daemon, workload) -> None:
    w = workload(KIWI_SOCKET=str(daemon.path))
    launch = w.start("d.launch()")
    times = asked(daemon, 3)
    # Not a reconnect and a new registration per refusal (110,000 a minute, before): one
    # connection, and each ask waits twice as long as the one before (1 s, 2 s, ...).
    assert len(daemon.messages("hello")) == len(daemon.messages("register")) == 1
    assert times[1] - times[0] >= 0.95 and times[2] - times[1] >= 1.95
    assert not launch.done()
    # Between two asks: idle, and what it waits for (the kernel's waiting line shows it).
    stats = wait_for(lambda: (s := w.stats())["state"] == "idle" and s["room_refused"] and s,
                     interval=0.05, timeout=10, what="the stats to show the refusal")
    assert stats["room_refused"] == REFUSAL
    assert stats["room_refusals"] >= 3 and 0 <= stats["room_retry_in"] <= 4.0
    # Said once, whatever the number of refusals; the stats (and the kernel's waiting line,
    # updated in place) carry the rest.
    refused = w.said("cannot make room")
    assert len(refused) == 1 and REFUSAL in refused[0]
    daemon.refuse_room = None  # the room is there now: the next ask is granted
    assert launch.result(timeout=scaled(30)) == 0
    stats = w.stats()
    assert (stats["state"], stats["room_refused"], stats["room_last_refusal"]) == (
        "holding", None, None)


def test_the_backoff_outlasts_a_new_connection(daemon, workload) -> None:
    w = workload(KIWI_SOCKET=str(daemon.path))
    w.start("d.launch()")
    refused_at = asked(daemon, 2)[-1]
    wait_for(lambda: w.stats()["room_refusals"] == 2, interval=0.05,
             what="the second refusal read")  # refused twice: the next ask waits 2 s
    daemon.hang_up()
    daemon.wait_for(lambda _: len(daemon.messages("register")) == 2, what="a new registration")
    again = asked(daemon, 3)[-1]
    assert again - refused_at >= 1.95, "a new connection asked at once"


def test_a_wait_refused_past_its_room_timeout_fails_out_of_memory_and_says_why(
        daemon, workload) -> None:
    w = workload(KIWI_SOCKET=str(daemon.path), KIWI_ROOM_TIMEOUT="2")
    began = time.monotonic()
    assert w.call("d.launch()", timeout=30) == OUT_OF_MEMORY
    assert time.monotonic() - began >= 2.0
    gave_up = w.said("giving up on the GPU")
    assert len(gave_up) == 1 and REFUSAL in gave_up[0] and "KIWI_ROOM_TIMEOUT" in gave_up[0]
    # An eager acquire (a kernel's eager mode) gives up the same way, with the reason.
    error = w.call("repr(_err(lambda: shim.acquire(None)))", timeout=30)
    assert error.startswith("NoRoomError(") and REFUSAL in error, error
