"""Watchers of the status document hear ``changed`` instead of polling it (hello feature
``changes``): which requests change the document, how rounds are coalesced, and the events on a
real daemon's socket, where peers that did not ask hear nothing new."""

from __future__ import annotations

import json
import socket

import pytest
from support import DaemonProcess
from test_session import connect, node, registered, replies, say

from nodeside import protocol as p
from nodeside.client import Client
from nodeside.daemon.changes import ChangeNotices


def test_a_daemon_serves_the_changes_feature_to_who_asks() -> None:
    session = connect(node(), hello=False)
    (welcome,) = replies(say(session, p.encode(p.HELLO, version=1,
                                               features=["changes", "position"])))
    assert welcome["features"] == ["changes", "position"]
    assert p.FEATURE_CHANGES in session.features


def test_requests_that_move_what_people_see_are_marked_as_changes() -> None:
    rules = node()
    session = connect(rules)
    assert not say(session, p.encode(p.STATUS))[0].changed
    assert not say(session, p.encode(p.PING))[0].changed
    assert say(session, p.encode(p.REGISTER, name="k"))[0].changed
    assert say(session, p.encode(p.ACQUIRE))[0].changed
    assert say(session, p.encode(p.WORKING_SET, bytes=1 << 20))[0].changed
    assert say(session, p.encode(p.RELEASE))[0].changed
    assert say(session, p.encode(p.SET_TQ, tq=2.0))[0].changed
    assert not say(session, p.encode(p.SET_TQ, tq=-1))[0].changed  # refused: nothing moved


def test_change_rounds_go_out_at_once_after_a_quiet_spell_then_at_most_every_interval() -> None:
    rules = node()
    notices = ChangeNotices(interval=0.1)
    watcher = connect(rules, features=["changes"])
    notices.listeners.add(watcher)
    assert notices.mark(5.0) == 5.0           # the first change: on the next turn
    assert notices.mark(5.0) is None          # a round is arranged: no second one
    assert notices.collect(5.0) == [watcher]
    assert notices.mark(5.02) == pytest.approx(5.1)  # a burst: one round an interval later
    assert notices.mark(5.05) is None
    assert notices.collect(5.1) == [watcher]
    assert notices.mark(9.0) == 9.0           # quiet again: at once


def test_no_watcher_no_change_work() -> None:
    assert ChangeNotices().mark(0.0) is None


def test_a_handoff_marks_a_change_once_for_the_whole_request() -> None:
    rules = node()
    holder, waiter = registered(rules, "holder"), registered(rules, "waiter")
    say(holder, p.encode(p.ACQUIRE))
    say(waiter, p.encode(p.ACQUIRE))
    (outcome,) = say(holder, p.encode(p.RELEASE))
    assert outcome.changed and outcome.handoff


# -- over a real socket -------------------------------------------------------------------


class Watcher:
    """A hand-driven connection that says hello with the given features."""

    def __init__(self, daemon: DaemonProcess, features: list[str] | None) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(daemon.socket)
        self.lines = self.sock.makefile("rb")
        self.sock.sendall(p.encode(p.HELLO, version=p.VERSION, features=features))
        self.welcome = self.read()
        assert self.welcome["op"] == p.WELCOME

    def read(self) -> dict:
        line = self.lines.readline()
        if not line:
            raise ConnectionResetError("closed")
        return json.loads(line)

    def close(self) -> None:
        self.lines.close()
        self.sock.close()


@pytest.fixture
def calm(start_daemon) -> DaemonProcess:
    """A long quantum: the document changes only when a test changes it."""
    return start_daemon("--tq", "30", "--grace", "30")


def test_a_watcher_hears_changed_when_a_client_takes_and_gives_back_the_gpu(
        calm: DaemonProcess) -> None:
    watcher = Watcher(calm, ["changes"])
    try:
        assert watcher.welcome["features"] == ["changes"]
        with Client(calm.socket, name="k") as client:  # registering is a change already
            assert watcher.read() == {"op": "changed"}
            client.acquire(timeout=10)
            assert watcher.read() == {"op": "changed"}
            client.release()
            assert watcher.read() == {"op": "changed"}
        assert watcher.read() == {"op": "changed"}  # the client left
    finally:
        watcher.close()


def test_a_peer_that_did_not_ask_hears_no_changed_events(calm: DaemonProcess) -> None:
    watcher, old = Watcher(calm, ["changes"]), Watcher(calm, None)
    try:
        assert "features" not in old.welcome
        with Client(calm.socket, name="k") as client:
            client.acquire(timeout=10)
            assert watcher.read()["op"] == p.CHANGED
            client.release()
            assert watcher.read()["op"] == p.CHANGED
        old.sock.sendall(p.encode(p.PING, seq=1))
        assert old.read() == {"op": "pong", "seq": 1}  # nothing came before it
    finally:
        watcher.close()
        old.close()
