"""Connection deadlines and caps, and coalesced position events, without sockets."""

from __future__ import annotations

import logging

from test_session import ADMIN, connect, node, registered, replies, say

from nodeside import protocol as p
from nodeside.daemon.admission import Admission
from nodeside.daemon.lograte import RateLimitedLog
from nodeside.daemon.peer import Peer
from nodeside.daemon.positions import PositionNotices
from nodeside.daemon.session import Session
from nodeside.limits import ConnectionLimits

LIMITS = ConnectionLimits(hello_timeout=5.0, idle_timeout=60.0, per_uid=3, backlog=16)


def opened(rules, uid: int = 1000, at: float = 0.0) -> Session:
    return Session(rules, Peer(1, uid, uid, 3), at)


def test_a_connection_without_hello_expires_at_the_hello_deadline() -> None:
    rules, admission = node(), Admission(LIMITS, 100)
    silent, polite = opened(rules), opened(rules)
    admission.admit(silent, 0.0)
    admission.admit(polite, 0.0)
    say(polite, p.encode(p.HELLO, version=1), now=1.0)
    assert admission.expired(4.9) == []
    (gone,) = admission.expired(5.0)
    assert gone[0] is silent and "hello" in gone[1]
    assert admission.total == 1


def test_a_greeted_connection_that_never_registers_expires_when_idle() -> None:
    rules, admission = node(), Admission(LIMITS, 100)
    watcher, kernel = opened(rules), opened(rules)
    for session in (watcher, kernel):
        admission.admit(session, 0.0)
        say(session, p.encode(p.HELLO, version=1), now=1.0)
    say(kernel, p.encode(p.REGISTER, name="k"), now=1.0)
    admission.registered(kernel)
    say(watcher, p.encode(p.STATUS), now=50.0)  # a request keeps it alive
    assert admission.expired(100.0) == []
    (gone,) = admission.expired(110.0)
    assert gone[0] is watcher and "idle" in gone[1]
    assert admission.expired(10_000.0) == []  # the registered one never expires


def test_at_the_uid_cap_the_oldest_unregistered_connection_makes_room() -> None:
    rules, admission = node(), Admission(LIMITS, 100)
    first, second, third = (opened(rules) for _ in range(3))
    for session in (first, second, third):
        assert admission.admit(session, 0.0).accepted
    admission.registered(first)
    verdict = admission.admit(opened(rules), 1.0)
    assert verdict.accepted and verdict.evicted == [second]
    other_user = admission.admit(opened(rules, uid=2000), 1.0)
    assert other_user.accepted and not other_user.evicted


def test_at_the_uid_cap_with_every_connection_registered_the_newcomer_is_refused() -> None:
    rules, admission = node(), Admission(LIMITS, 100)
    for _ in range(3):
        session = opened(rules)
        admission.admit(session, 0.0)
        admission.registered(session)
    verdict = admission.admit(opened(rules), 1.0)
    assert not verdict.accepted and "per_uid" in verdict.reason


def test_at_the_daemon_cap_any_uid_s_oldest_unregistered_connection_makes_room() -> None:
    rules, admission = node(), Admission(LIMITS, 2)
    idle = opened(rules, uid=1)
    admission.admit(idle, 0.0)
    kernel = opened(rules, uid=2)
    admission.admit(kernel, 0.0)
    admission.registered(kernel)
    verdict = admission.admit(opened(rules, uid=3), 1.0)
    assert verdict.accepted and verdict.evicted == [idle] and admission.total == 2


def test_position_events_are_sent_once_per_change_and_only_to_who_asked() -> None:
    rules = node()
    notices = PositionNotices()
    holder = registered(rules, "holder")
    waiters = []
    for name, features in (("a", ["position"]), ("b", ["position"]), ("old", None)):
        session = connect(rules, features=features)
        say(session, p.encode(p.REGISTER, name=name))
        waiters.append(session)
    notices.listeners = 2
    say(holder, p.encode(p.ACQUIRE))
    for session in waiters:
        say(session, p.encode(p.ACQUIRE))
    sessions = {s.client_id: s for s in (holder, *waiters)}
    assert notices.collect(rules.scheduler, sessions, 0.0) == []  # nothing marked
    assert notices.mark([0])
    assert notices.collect(rules.scheduler, sessions, 0.0) == []  # positions told in replies
    say(holder, p.encode(p.RELEASE))  # "a" is granted, "b" moves from 2 to 1
    assert notices.mark([0]) and not notices.mark([0])  # one round arranged, not two
    events = notices.collect(rules.scheduler, sessions, 0.1)
    assert [(s.label, line) for s, line in events] == [
        ("b", p.encode(p.WAITING, position=1))]
    notices.mark([0])
    assert notices.collect(rules.scheduler, sessions, 0.2) == []  # unchanged: nothing


def test_no_listener_no_position_work() -> None:
    assert not PositionNotices().mark([0])


def test_repeated_warnings_are_one_line_then_a_count(caplog) -> None:
    clock = [0.0]
    warnings = RateLimitedLog(logging.getLogger("kiwi.test"), interval=10.0,
                              clock=lambda: clock[0])
    with caplog.at_level(logging.WARNING, "kiwi.test"):
        for _ in range(500):
            warnings.warning("k", "bad input from %s", "x")
        clock[0] = 11.0
        warnings.warning("k", "bad input from %s", "x")
    assert [r.getMessage() for r in caplog.records] == [
        "bad input from x", "bad input from x (and 499 more like it in the last 11 s)"]


def test_a_peer_repeating_a_bad_request_logs_one_line(caplog) -> None:
    rules = node()
    session = connect(rules)
    with caplog.at_level(logging.WARNING, "kiwi.daemon"):
        for seq in range(200):
            (reply,) = replies(say(session, p.encode(p.ACQUIRE, seq=seq)))
            assert reply["code"] == p.E_STATE
    assert len(caplog.records) == 1 and not caplog.records[0].exc_info
    assert str(ADMIN) in caplog.records[0].getMessage()
