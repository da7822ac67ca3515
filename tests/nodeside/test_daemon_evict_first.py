"""``release`` with ``evict_first`` against the real daemon, in raw protocol lines.

This is what the CUDA shim speaks at a cell's end: the daemon answers with a ``drop`` carrying
the request's seq when the next holder needs the room, and hands the GPU over only at the
plain ``release`` that follows; otherwise it answers ``released`` and hands over at once.
"""

from __future__ import annotations

import json
import socket

import pytest
from support import DaemonProcess, wait_for

from nodeside import protocol as p

GiB = 1 << 30


class Line:
    """One client connection, driven line by line."""

    def __init__(self, daemon: DaemonProcess, name: str, working_set: int) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(5)
        self.sock.connect(daemon.socket)
        self.lines = self.sock.makefile("rb")
        self.seq = 0
        assert self.request(p.HELLO, version=p.VERSION)["op"] == p.WELCOME
        self.id = self.request(p.REGISTER, name=name, working_set=working_set)["client"]

    def request(self, op: str, **fields: object) -> dict:
        self.seq += 1
        self.sock.sendall(p.encode(op, seq=self.seq, **fields))
        return self.read()

    def read(self) -> dict:
        line = self.lines.readline()
        if not line:
            raise ConnectionResetError("closed")
        return json.loads(line)

    def state(self) -> str:
        status = self.request(p.STATUS)["status"]
        return next(c["state"] for c in status["clients"] if c["id"] == self.id)

    def close(self) -> None:
        self.lines.close()
        self.sock.close()


@pytest.fixture
def gpu8(start_daemon) -> DaemonProcess:
    """One 8 GiB GPU; a long quantum and grace, so only the test's requests move the GPU."""
    return start_daemon("--tq", "30", "--grace", "30", "--gpus", "1", "--gpu-memory", "8GiB")


def holder_and_waiter(daemon: DaemonProcess, held: int, wanted: int) -> tuple[Line, Line]:
    a, b = Line(daemon, "a", held), Line(daemon, "b", wanted)
    assert a.request(p.ACQUIRE)["op"] == p.GRANT
    assert b.request(p.ACQUIRE)["op"] == p.WAITING
    return a, b


def test_a_release_that_must_evict_first_is_answered_with_a_drop(gpu8) -> None:
    a, b = holder_and_waiter(gpu8, 6 * GiB, 6 * GiB)
    reply = a.request(p.RELEASE, evict_first=True)
    assert reply == {"op": p.DROP, "seq": a.seq, "gpu": 0, "reason": p.REASON_RELEASE,
                     "evict": True, "grace": 30.0}
    # The GPU has not changed hands: a still holds while it moves its memory out.
    assert (a.state(), b.state()) == ("holding", "waiting")
    released = a.request(p.RELEASE)
    assert (released["op"], released["seq"]) == (p.RELEASED, a.seq)
    assert b.read()["op"] == p.GRANT
    assert (a.state(), b.state()) == ("idle", "holding")


def test_a_release_whose_waiter_fits_beside_hands_over_at_once(gpu8) -> None:
    a, b = holder_and_waiter(gpu8, 3 * GiB, 3 * GiB)
    assert a.request(p.RELEASE, evict_first=True) == {"op": p.RELEASED, "seq": a.seq,
                                                      "evict": False}
    assert b.read()["op"] == p.GRANT


def test_a_release_with_nobody_waiting_hands_back_at_once(gpu8) -> None:
    a = Line(gpu8, "a", 6 * GiB)
    assert a.request(p.ACQUIRE)["op"] == p.GRANT
    assert a.request(p.RELEASE, evict_first=True)["op"] == p.RELEASED
    assert a.state() == "idle"


def test_a_client_gone_while_it_evicts_frees_the_gpu_at_once(gpu8) -> None:
    a, b = holder_and_waiter(gpu8, 6 * GiB, 6 * GiB)
    assert a.request(p.RELEASE, evict_first=True)["op"] == p.DROP
    a.close()
    assert b.read()["op"] == p.GRANT


def test_a_drain_past_its_grace_is_revoked(start_daemon) -> None:
    daemon = start_daemon("--tq", "30", "--grace", "0.3", "--gpus", "1", "--gpu-memory", "8GiB")
    a, b = holder_and_waiter(daemon, 6 * GiB, 6 * GiB)
    assert a.request(p.RELEASE, evict_first=True)["grace"] == pytest.approx(0.3)
    assert a.read() == {"op": p.REVOKED, "gpu": 0, "reason": p.REASON_GRACE}
    assert b.read()["op"] == p.GRANT
    wait_for(lambda: "ignored a drop request" in daemon.log())


def test_evict_first_must_be_a_boolean(gpu8) -> None:
    a = Line(gpu8, "a", GiB)
    reply = a.request(p.RELEASE, evict_first="yes")
    assert (reply["op"], reply["code"]) == (p.ERROR, p.E_MALFORMED)
