"""Two shim processes taking turns through the real daemon (mode auto, ``interactive.turns``).

The shim registers as able to pause. When a second process is granted beside the first, the
one whose cell has done less GPU work has the turn: the other hears ``pause``, its next launch
waits at the gate without asking for anything (the GPU is still its own) and its memory stays
put; at ``resume`` the launch goes through. Every wait is on an event (the shim's own stats or
the daemon's status), never a sleep.
"""

from __future__ import annotations

import pytest
from support import wait_for

from nodeside.client import Client

#: GPU seconds the trainer has held before the second cell comes.
TRAINED = 4.0


@pytest.fixture
def turns(start_daemon, scratch):
    """Mode auto under ``interactive``, turns of 0.5 s, a TQ of 30 s (no quantum ends during a
    test) and one 8 GiB GPU, so the two processes' memory fits side by side. A first quantum
    of 30 s keeps the step-aside rule (a heavy holder leaving for a light one once its first
    quantum is over, aside.py) out of these tests: here nobody leaves, they take turns."""
    config = scratch / "kiwi.yaml"
    config.write_text("mode: auto\npolicy: interactive\n"
                      "interactive:\n  turns: 0.5\n  first_quantum: 30\n")
    return start_daemon("--tq", "30", "--grace", "30", "--gpus", "1", "--gpu-memory", "8GiB",
                        "--config", str(config))


def entry(daemon, w) -> dict:
    with Client(daemon.socket, register=False) as admin:
        status = admin.status()
    return next(c for c in status["clients"] if c["pid"] == w.process.pid)


def test_a_second_cell_beside_a_busy_one_takes_the_turn_and_gives_it_back(turns, workload):
    first = workload(KIWI_SOCKET=turns.socket, KIWI_CLIENT_NAME="trainer")
    first.call("shim.cell_begin()")
    first.call("d.alloc(1 << 30)")
    assert first.call("d.launch()") == 0
    # The newcomer keeps the turn while its cell has done less than the trainer's: TRAINED
    # seconds, more than the checks below take on a loaded machine.
    wait_for(lambda: entry(turns, first)["gpu_seconds"] > TRAINED, timeout=TRAINED + 30,
             what="the trainer to work")

    second = workload(KIWI_SOCKET=turns.socket, KIWI_CLIENT_NAME="person")
    second.call("shim.cell_begin()")
    second.call("d.alloc(1 << 30)")
    assert second.call("d.launch()") == 0  # granted beside the trainer: it fits
    assert entry(turns, second)["state"] == "holding"
    # The newcomer has done nothing yet, so the trainer pauses and keeps its hold and memory.
    wait_for(lambda: first.stats()["paused"], what="the trainer to be paused")
    trainer = entry(turns, first)
    assert (trainer["state"], trainer["paused"]) == ("holding", True)
    assert not entry(turns, second)["paused"]

    first.log.clear()
    launch = first.start("d.launch()")
    wait_for(lambda: first.stats()["in_flight"] == 0 and first.stats()["paused"],
             what="the trainer's launch to wait at the gate")
    assert not launch.done()
    assert not first.log.calls("cuLaunchKernel")
    assert first.stats()["state"] == "holding"  # it asked for nothing: the GPU is its own

    second.call("shim.release()")  # the person's cell ends: the trainer's turn comes back
    assert launch.result() == 0
    assert first.log.calls("cuLaunchKernel")
    stats = first.stats()
    assert (stats["paused"], stats["pauses"], stats["evictions"]) == (False, 1, 0)
    assert not entry(turns, first)["paused"]


def test_equals_alternate_turn_by_turn(turns, workload):
    a = workload(KIWI_SOCKET=turns.socket, KIWI_CLIENT_NAME="a")
    b = workload(KIWI_SOCKET=turns.socket, KIWI_CLIENT_NAME="b")
    for w in (a, b):
        w.call("shim.cell_begin()")
        w.call("d.alloc(1 << 30)")
        assert w.call("d.launch()") == 0
    # Each is paused in its turn; both hold throughout and neither moves memory.
    wait_for(lambda: a.stats()["pauses"] >= 2 and b.stats()["pauses"] >= 2, timeout=30,
             what="both to have been paused twice")
    assert entry(turns, a)["state"] == entry(turns, b)["state"] == "holding"
    assert a.stats()["evictions"] == b.stats()["evictions"] == 0
