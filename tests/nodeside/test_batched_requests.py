"""Several requests in one write: the daemon answers each, in order, as if they came apart.

It sends the replies to such a batch in one write (one wake-up of the client instead of one per
reply); what the client reads must not change, and messages to other clients must not wait.
"""

from __future__ import annotations

import json
import socket

from support import DaemonProcess

from nodeside import protocol as p


class Wire:
    def __init__(self, daemon: DaemonProcess) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(5)
        self.sock.connect(daemon.socket)
        self.lines = self.sock.makefile("rb")

    def send(self, *messages: bytes) -> None:
        self.sock.sendall(b"".join(messages))

    def read(self) -> dict:
        line = self.lines.readline()
        assert line, "the daemon closed the connection"
        return json.loads(line)

    def closed(self) -> bool:
        try:
            return self.lines.readline() == b""
        except ConnectionResetError:
            return True


def greeted(daemon: DaemonProcess, name: str) -> Wire:
    wire = Wire(daemon)
    wire.send(p.encode(p.HELLO, version=p.VERSION), p.encode(p.REGISTER, name=name))
    assert [wire.read()["op"], wire.read()["op"]] == [p.WELCOME, p.REGISTERED]
    return wire


def test_a_batch_is_answered_in_order(daemon: DaemonProcess) -> None:
    wire = Wire(daemon)
    wire.send(p.encode(p.HELLO, version=p.VERSION, seq=1), p.encode(p.REGISTER, name="b", seq=2),
              p.encode(p.ACQUIRE, seq=3), p.encode(p.PING, seq=4), p.encode(p.RELEASE, seq=5))
    replies = [wire.read() for _ in range(5)]
    assert [(r["op"], r["seq"]) for r in replies] == [
        (p.WELCOME, 1), (p.REGISTERED, 2), (p.GRANT, 3), (p.PONG, 4), (p.RELEASED, 5)]


def test_release_and_ask_again_in_one_write_hands_over_and_queues(
        daemon: DaemonProcess) -> None:
    holder, waiter = greeted(daemon, "holder"), greeted(daemon, "waiter")
    holder.send(p.encode(p.ACQUIRE, seq=1))
    assert holder.read()["op"] == p.GRANT
    waiter.send(p.encode(p.ACQUIRE, seq=1))
    assert waiter.read()["op"] == p.WAITING

    holder.send(p.encode(p.RELEASE, seq=2), p.encode(p.ACQUIRE, seq=3))
    assert waiter.read()["op"] == p.GRANT
    assert [(r["op"], r["seq"]) for r in (holder.read(), holder.read())] == [
        (p.RELEASED, 2), (p.WAITING, 3)]


def test_a_fatal_error_in_a_batch_is_answered_before_the_connection_closes(
        daemon: DaemonProcess) -> None:
    wire = greeted(daemon, "b")
    wire.send(p.encode(p.PING, seq=1), b"not json\n", p.encode(p.PING, seq=2))
    assert (wire.read()["op"], wire.read()["code"]) == (p.PONG, p.E_MALFORMED)
    assert wire.closed()  # the ping after the broken line is never answered
