"""The daemon's connection rules without a socket: a Session fed bytes and the time.

The table test runs every sequence of three requests from an alphabet of legal and illegal
ones against a small model of the rules (hello first and once, register once, what needs a
registration), so every illegal order is tried, not the few someone thought of.
"""

from __future__ import annotations

import itertools
import json
import logging
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodeside import limits
from nodeside import protocol as p
from nodeside.config import SchedulerConfig, from_mapping
from nodeside.daemon.peer import Peer
from nodeside.daemon.requests import Requests
from nodeside.daemon.session import Outcome, Session
from nodeside.model import Registration
from nodeside.scheduler.core import GpuSpec, Grant, Pause, Released, Scheduler

ADMIN = os.getuid()
NOBODY = 65534


def node(gpus: int = 1, uuids: bool = False) -> Requests:
    specs = [GpuSpec(i, "logical GPU", f"GPU-{i:04d}" if uuids else None, None)
             for i in range(gpus)]
    return Requests(Scheduler(SchedulerConfig(tq=1.0), specs, 0.0), admin_gid=None)


def connect(rules: Requests, uid: int = ADMIN, hello: bool = True,
            features: list[str] | None = None) -> Session:
    session = Session(rules, Peer(4242, uid, uid, 7), 0.0)
    if hello:
        (reply,) = replies(say(session, p.encode(p.HELLO, version=1, features=features)))
        assert reply["op"] == p.WELCOME
    return session


def say(session: Session, *lines: bytes, now: float = 0.0) -> list[Outcome]:
    session.feed(b"".join(lines))
    outcomes = []
    while (outcome := session.step(now)) is not None:
        outcomes.append(outcome)
    return outcomes


def replies(outcomes: list[Outcome]) -> list[dict]:
    return [json.loads(item) for o in outcomes for item in o.out if isinstance(item, bytes)]


def registered(rules: Requests, name: str = "k", **fields: object) -> Session:
    session = connect(rules)
    (reply,) = replies(say(session, p.encode(p.REGISTER, name=name, **fields)))
    assert reply["op"] == p.REGISTERED, reply
    return session


# -- every short sequence, legal and illegal, against a model of the rules ----------------------

ALPHABET: dict[str, bytes] = {
    "hello": p.encode(p.HELLO, version=1),
    "hello_v2": p.encode(p.HELLO, version=2),
    "register": p.encode(p.REGISTER, name="k"),
    "register_long": p.encode(p.REGISTER, name="k" * 300),
    "acquire": p.encode(p.ACQUIRE),
    "release": p.encode(p.RELEASE),
    "requeue": p.encode(p.RELEASE, requeue=True),
    "working_set": p.encode(p.WORKING_SET, bytes=10),
    "status": p.encode(p.STATUS),
    "ping": p.encode(p.PING),
    "set_mode": p.encode(p.SET_MODE, mode="on"),
    "set_tq_nan": b'{"op":"set_tq","tq":NaN}',
    "set_tq_big": p.encode(p.SET_TQ, tq=10**9),
    "garbage": b"{oops",
    "teleport": p.encode("teleport"),
}
NEEDS_REGISTRATION = {"acquire", "release", "requeue", "working_set"}
SUCCESS = {"hello": p.WELCOME, "register": p.REGISTERED, "acquire": p.GRANT,
           "release": p.RELEASED, "requeue": p.GRANT, "working_set": p.OK,
           "status": p.STATUS_REPLY, "ping": p.PONG, "set_mode": p.OK}


def expected(name: str, greeted: bool, registered: bool) -> tuple[str, bool, bool]:
    """(reply op or error code, greeted after, registered after) for one request."""
    if name == "garbage" or name == "set_tq_nan":
        return p.E_MALFORMED, greeted, registered
    if name == "teleport":
        return p.E_UNKNOWN_OP, greeted, registered
    if name == "hello_v2":
        return p.E_VERSION, greeted, registered
    if not greeted:
        return (p.WELCOME, True, registered) if name == "hello" else \
            (p.E_VERSION, greeted, registered)
    if name == "hello":
        return p.E_MALFORMED, greeted, registered
    if name in ("register", "register_long") and registered:
        return p.E_STATE, greeted, registered
    if name == "register_long" or name == "set_tq_big":
        return p.E_LIMIT, greeted, registered
    if name in NEEDS_REGISTRATION and not registered:
        return p.E_STATE, greeted, registered
    return SUCCESS[name], greeted, registered or name == "register"


@pytest.mark.parametrize("first", sorted(ALPHABET))
def test_every_sequence_of_three_requests_is_answered_as_the_rules_say(first: str) -> None:
    for rest in itertools.product(sorted(ALPHABET), repeat=2):
        sequence = (first, *rest)
        session = Session(node(), Peer(1, ADMIN, ADMIN, 3), 0.0)
        greeted = registered_ = over = False
        for seq, name in enumerate(sequence, start=1):
            line = ALPHABET[name]
            if line.startswith(b'{"op"') and line.endswith(b"}\n"):
                line = line[:-2] + f',"seq":{seq}}}\n'.encode()
            outcomes = say(session, line if line.endswith(b"\n") else line + b"\n")
            if over:
                assert outcomes == [], f"{sequence}: answered after a fatal error"
                continue
            (outcome,) = outcomes
            (reply,) = replies([outcome])
            want, greeted, registered_ = expected(name, greeted, registered_)
            got = reply["code"] if reply["op"] == p.ERROR else reply["op"]
            assert got == want, f"{sequence}: {name} answered {reply}"
            assert outcome.close == (reply["op"] == p.ERROR and reply["code"] in p.FATAL_ERRORS)
            over = outcome.close
            if name not in ("garbage", "set_tq_nan"):  # no seq can be read from those
                assert reply.get("seq") == seq, f"{sequence}: {name} lost its seq"
        assert session.greeted == greeted and (session.client_id is not None) == registered_


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from(sorted(ALPHABET))), max_size=16))
def test_sessions_sharing_a_node_get_one_reply_per_request_until_a_fatal_one(steps) -> None:
    rules = node()
    sessions = [Session(rules, Peer(i, ADMIN, ADMIN, i), 0.0) for i in range(3)]
    over = [False] * 3
    for now, (who, name) in enumerate(steps):
        outcomes = say(sessions[who], ALPHABET[name].rstrip(b"\n") + b"\n", now=now * 0.1)
        if over[who]:
            assert outcomes == []
            continue
        (outcome,) = outcomes
        own = [item for item in outcome.out if isinstance(item, bytes)]
        assert len(own) == 1  # one reply; events for others travel as actions
        over[who] = outcome.close
        # The scheduler's clients are exactly the sessions' registrations.
        assert set(rules.scheduler.clients) == {s.client_id for s in sessions if s.client_id}


# -- bounds ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("fields, where", [
    ({"name": "n" * 257}, "name"),
    ({"name": "ok", "display_name": "d" * 257}, "display_name"),
    ({"name": "ok", "pool": "p" * 257}, "pool"),
    ({"name": "ok", "labels": {"k" * 257: "v"}}, "labels key"),
    ({"name": "ok", "labels": {"k": "v" * 257}}, "labels.k"),
    ({"name": "ok", "labels": {f"k{i}": "v" for i in range(65)}}, "more than 64 labels"),
    ({"name": "bell\x07"}, "control characters"),
    ({"name": "ok", "working_set": 2**51}, "working_set"),
    ({"name": "ok", "working_set": -1}, "working_set"),
])
def test_oversized_or_bad_registration_is_refused_with_limit_and_the_session_stays(
        fields, where) -> None:
    rules = node()
    session = connect(rules)
    (reply,) = replies(say(session, p.encode(p.REGISTER, seq=1, **fields)))
    assert (reply["op"], reply["code"], reply["seq"]) == (p.ERROR, p.E_LIMIT, 1)
    assert where in reply["message"]
    assert not rules.scheduler.clients
    assert replies(say(session, p.encode(p.PING, seq=2))) == [{"op": "pong", "seq": 2}]


def test_name_of_exactly_the_bound_is_accepted_in_any_script() -> None:
    session = registered(node(), name="é" * 128)  # 256 UTF-8 bytes
    assert session.label == "é" * 128


@pytest.mark.parametrize("line", [
    b'{"op":"set_tq","tq":NaN}', b'{"op":"set_tq","tq":Infinity}',
    b'{"op":"set_tq","tq":-Infinity}', b'{"op":"set_tq","tq":1e999}',
    b'{"op":"working_set","bytes":' + b"9" * 40 + b"}",
])
def test_numbers_json_cannot_hold_are_malformed(line: bytes) -> None:
    session = registered(node())
    (outcome,) = say(session, line + b"\n")
    assert replies([outcome])[0]["code"] == p.E_MALFORMED and outcome.close


@pytest.mark.parametrize("message", [
    p.encode(p.SET_TQ, seq=1, tq=0), p.encode(p.SET_TQ, seq=1, tq=-1),
    p.encode(p.SET_TQ, seq=1, tq=0.001), p.encode(p.SET_TQ, seq=1, tq=86_401),
    p.encode(p.SET_TQ, seq=1, tq=2**62),
    p.encode(p.WORKING_SET, seq=1, bytes=-5), p.encode(p.WORKING_SET, seq=1, bytes=2**60),
    p.encode(p.WORKING_SET, seq=1, bytes=5, evictable=-1),
])
def test_numbers_out_of_range_are_refused_with_limit_and_change_nothing(message: bytes) -> None:
    rules = node()
    session = registered(rules)
    (reply,) = replies(say(session, message))
    assert (reply["code"], reply["seq"]) == (p.E_LIMIT, 1)
    assert rules.scheduler.tq == 1.0
    assert rules.scheduler.clients[session.client_id].working_set in (None, 0)


def test_a_line_over_the_limit_is_answered_once_then_nothing_more() -> None:
    session = connect(node())
    outcomes = say(session, p.encode(p.PING, seq=1), b"x" * p.MAX_REQUEST_BYTES)
    assert [r.get("code", r["op"]) for r in replies(outcomes)] == [p.PONG, p.E_TOO_LARGE]
    assert outcomes[-1].close
    assert say(session, p.encode(p.PING, seq=2)) == [] and not session.has_requests()


def test_the_node_refuses_clients_past_its_bound() -> None:
    rules = node()
    for i in range(limits.MAX_CLIENTS):
        rules.scheduler.register(0.0, Registration(name=f"c{i}"))
    session = connect(rules)
    (reply,) = replies(say(session, p.encode(p.REGISTER, name="one too many")))
    assert reply["code"] == p.E_LIMIT and str(limits.MAX_CLIENTS) in reply["message"]


def test_labels_of_all_clients_together_are_bounded() -> None:
    rules = node()
    labels = {f"k{i:03d}": "v" * 250 for i in range(64)}  # 64 * 254 bytes
    per_client = sum(len(k) + len(v) for k, v in labels.items())
    fit = limits.MAX_LABEL_BYTES_TOTAL // per_client
    sessions = [registered(rules, f"c{i}", labels=labels) for i in range(fit)]
    extra = connect(rules)
    (reply,) = replies(say(extra, p.encode(p.REGISTER, name="late", labels=labels)))
    assert reply["code"] == p.E_LIMIT
    rules.forget(sessions[0].client_id or "")  # its connection went away: room again
    (reply,) = replies(say(extra, p.encode(p.REGISTER, name="late", labels=labels)))
    assert reply["op"] == p.REGISTERED


def test_the_largest_status_document_the_bounds_allow_fits_what_clients_read() -> None:
    rules = node()
    worst = "é" * 128  # 256 bytes that JSON escapes to 768
    labels = {f"{worst[:-2]}{i:02d}": worst for i in range(40)}  # a request line holds 40
    per_client = sum(len(k.encode()) + len(v.encode()) for k, v in labels.items())
    with_labels = limits.MAX_LABEL_BYTES_TOTAL // per_client
    for i in range(limits.MAX_CLIENTS):
        session = connect(rules)
        fields = {"labels": labels} if i < with_labels else {}
        (reply,) = replies(say(session, p.encode(
            p.REGISTER, name=f"{worst[:-3]}{i:04d}", display_name=worst, pool=f"{worst[:-3]}"
            f"{i:04d}", kind=worst, **fields)))
        assert reply["op"] == p.REGISTERED, reply
    (outcome,) = say(connect(rules), p.encode(p.STATUS, seq=1))
    (line,) = outcome.out
    assert isinstance(line, bytes) and len(line) <= p.MAX_REPLY_BYTES
    assert json.loads(line)["op"] == p.STATUS_REPLY


def test_status_over_the_reply_bound_leaves_labels_out_and_says_so() -> None:
    from nodeside.daemon.status_line import status_line

    status = {"clients": [{"id": "c1", "labels": {"k": "v" * 1000}}]}
    doc = json.loads(status_line(status, 3, limit=500))
    assert doc["seq"] == 3 and doc["status"]["labels_omitted"] is True
    assert "labels" not in doc["status"]["clients"][0]


# -- the handshake and the admin line -----------------------------------------------------------

def test_welcome_lists_only_the_features_this_daemon_serves() -> None:
    session = Session(node(), Peer(1, ADMIN, ADMIN, 3), 0.0)
    (reply,) = replies(say(session, p.encode(p.HELLO, version=1,
                                             features=["position", "teleport", 3])))
    assert reply["features"] == ["position"]
    plain = Session(node(), Peer(1, ADMIN, ADMIN, 3), 0.0)
    (reply,) = replies(say(plain, p.encode(p.HELLO, version=1)))
    assert "features" not in reply  # an old client hears nothing new


def test_non_admin_may_not_change_mode_or_tq() -> None:
    rules = node()
    session = connect(rules, uid=NOBODY)
    for message in (p.encode(p.SET_MODE, mode="off"), p.encode(p.SET_TQ, tq=5)):
        (outcome,) = say(session, message)
        assert replies([outcome])[0]["code"] == p.E_PERMISSION and not outcome.close
    assert (rules.scheduler.mode, rules.scheduler.tq) == ("on", 1.0)


def test_admin_change_is_broadcast_and_reschedules() -> None:
    (outcome,) = say(connect(node()), p.encode(p.SET_TQ, seq=1, tq=2))
    assert outcome.broadcast == p.encode(p.MODE, mode="on", tq=2.0) and outcome.reschedule


def test_status_and_ping_do_not_ask_for_the_deadline_again() -> None:
    session = registered(node())
    for message in (p.encode(p.STATUS), p.encode(p.PING)):
        (outcome,) = say(session, message)
        assert not outcome.reschedule
    (outcome,) = say(session, p.encode(p.ACQUIRE))
    assert outcome.reschedule


def test_register_by_gpu_uuid_places_the_client_on_that_gpu() -> None:
    rules = node(gpus=3, uuids=True)
    session = connect(rules)
    (reply,) = replies(say(session, p.encode(p.REGISTER, name="k", gpu=0,
                                             gpu_uuid="GPU-0002")))
    assert reply["gpu"] == 2
    other = connect(rules)  # a UUID the daemon does not know: the index decides
    (reply,) = replies(say(other, p.encode(p.REGISTER, name="j", gpu=1, gpu_uuid="MIG-x")))
    assert reply["gpu"] == 1


def test_register_refuses_an_unknown_evict_kind() -> None:
    session = connect(node())
    (reply,) = replies(say(session, p.encode(p.REGISTER, name="k", evict="shred")))
    assert reply["code"] == p.E_INVALID
    (reply,) = replies(say(session, p.encode(p.REGISTER, name="k", evict="managed")))
    assert reply["op"] == p.REGISTERED


# -- release and ask again ------------------------------------------------------------------------

def test_requeue_hands_over_first_and_answers_once_with_the_position() -> None:
    rules = node()
    holder, waiter = registered(rules, "holder"), registered(rules, "waiter")
    assert replies(say(holder, p.encode(p.ACQUIRE, seq=1)))[0]["op"] == p.GRANT
    assert replies(say(waiter, p.encode(p.ACQUIRE, seq=1)))[0] == {
        "op": "waiting", "seq": 1, "position": 1}
    (outcome,) = say(holder, p.encode(p.RELEASE, seq=2, requeue=True))
    released, grant, reply = outcome.out
    assert isinstance(released, Released) and released.client == holder.client_id  # sends nothing
    assert isinstance(grant, Grant) and grant.client == waiter.client_id  # the waiter first
    assert json.loads(reply) == {"op": "waiting", "seq": 2, "position": 1}  # no "released"
    assert outcome.handoff


def test_a_requeue_granted_and_paused_at_once_hears_its_grant_before_its_pause() -> None:
    """Taking turns: the caller granted again beside a holder of as little work keeps its
    memory but waits for its turn; the reply (its grant) must reach it before the pause."""
    config = from_mapping({"mode": "auto", "policy": "interactive", "tq": 30.0,
                           "interactive": {"turns": 1.0, "first_quantum": 30.0}})
    rules = Requests(Scheduler(config, [GpuSpec(0, "logical GPU", None, 40 << 30)], 0.0),
                     admin_gid=None)
    a = registered(rules, "a", pausable=True, working_set=1 << 30)
    b = registered(rules, "b", pausable=True, working_set=1 << 30)
    say(a, p.encode(p.ACQUIRE, seq=1))
    say(b, p.encode(p.ACQUIRE, seq=1))  # granted beside a, paused: a keeps its turn
    # a asks again at once: b has the turn now, and a, granted again, waits for its own.
    (outcome,) = say(a, p.encode(p.RELEASE, seq=2, requeue=True))
    *_, reply, pause = outcome.out
    assert json.loads(reply) == {"op": "grant", "seq": 2, "gpu": 0, "quantum": 30.0}
    assert pause == Pause(a.client_id, 0)


def test_requeue_alone_is_granted_again_at_once() -> None:
    session = registered(node())
    say(session, p.encode(p.ACQUIRE, seq=1))
    assert replies(say(session, p.encode(p.RELEASE, seq=2, requeue=True))) == [
        {"op": "grant", "seq": 2, "gpu": 0, "quantum": 1.0}]


def test_requeue_with_evict_first_is_refused() -> None:
    session = registered(node())
    (reply,) = replies(say(session, p.encode(p.RELEASE, requeue=True, evict_first=True)))
    assert reply["code"] == p.E_INVALID


def test_plain_release_still_answers_released_after_the_next_grant() -> None:
    rules = node()
    holder, waiter = registered(rules, "holder"), registered(rules, "waiter")
    say(holder, p.encode(p.ACQUIRE))
    say(waiter, p.encode(p.ACQUIRE))
    (outcome,) = say(holder, p.encode(p.RELEASE, seq=9))
    released, grant, reply = outcome.out
    # The action goes first, for the evictor (a checkpoint before the next grant); it sends
    # nothing, and the reply follows the next holder's grant.
    assert isinstance(released, Released) and released.client == holder.client_id
    assert isinstance(grant, Grant) and json.loads(reply)["op"] == p.RELEASED


def test_a_fault_of_the_daemon_fails_that_request_only_and_logs_one_line(caplog) -> None:
    rules = node()
    session = registered(rules)

    def broken(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("a bug")

    # The compiled scheduler's methods cannot be replaced; the handler table can (acquire and
    # release are called directly, so the table's status stands in for a broken handler).
    rules._handlers[p.STATUS] = broken  # type: ignore[assignment]
    with caplog.at_level(logging.WARNING, "kiwi.daemon"):
        for seq in range(5):
            (outcome,) = say(session, p.encode(p.STATUS, seq=seq))
            (reply,) = replies([outcome])
            assert (reply["code"], reply["seq"]) == (p.E_INVALID, seq) and not outcome.close
    assert [r.exc_info for r in caplog.records] == [None]
    assert "ZeroDivisionError: a bug" in caplog.records[0].getMessage()
    assert replies(say(session, p.encode(p.PING, seq=9))) == [{"op": "pong", "seq": 9}]


def test_a_non_admin_viewer_sees_no_pid_or_labels_of_others_but_its_own() -> None:
    rules = node()
    registered(rules, "someone else's", labels={"pod": "secret"})
    viewer = Session(rules, Peer(777, NOBODY, NOBODY, 9), 0.0)
    say(viewer, p.encode(p.HELLO, version=1), p.encode(p.REGISTER, name="mine",
                                                        labels={"pod": "mine"}))
    (reply,) = replies(say(viewer, p.encode(p.STATUS)))
    entries = {c["name"]: c for c in reply["status"]["clients"]}
    assert entries["someone else's"]["pid"] is None and "labels" not in entries["someone else's"]
    assert entries["mine"]["pid"] == 777
    (reply,) = replies(say(connect(rules), p.encode(p.STATUS)))  # an admin sees all
    assert all(c["pid"] is not None for c in reply["status"]["clients"])


@pytest.mark.parametrize("on_violation, reply_op", [("downgrade", p.REGISTERED),
                                                    ("refuse", p.ERROR)])
def test_a_claim_outside_the_access_policy_is_downgraded_with_its_reason_or_refused(
        on_violation: str, reply_op: str, caplog) -> None:
    from nodeside.config import from_mapping

    config = from_mapping({"pools": {"training": {"guarantee": 0.5}},
                           "access": {"on_violation": on_violation,
                                      "default": {"pools": ["default", "training"],
                                                  "priorities": ["NORMAL", "LOW"]}}})
    rules = Requests(Scheduler(config, [GpuSpec(0)], 0.0), admin_gid=None)
    session = connect(rules, uid=NOBODY)
    with caplog.at_level(logging.WARNING, "kiwi.daemon"):
        (reply,) = replies(say(session, p.encode(p.REGISTER, seq=1, name="greedy",
                                                 pool="training", priority="HIGH")))
    assert reply["op"] == reply_op
    if on_violation == "downgrade":
        assert (reply["pool"], reply["priority"]) == ("training", "NORMAL")
        assert "HIGH" in reply["warning"] and "HIGH" in caplog.text
    else:
        assert reply["code"] == p.E_PERMISSION and not rules.scheduler.clients


@given(st.lists(st.integers(0, 200), max_size=12))
def test_requests_cut_anywhere_across_reads_are_answered_whole_and_in_order(cuts) -> None:
    session = connect(node())
    stream = b"".join(p.encode(p.PING, seq=seq) for seq in range(6))
    points = sorted({min(c, len(stream)) for c in cuts})
    pieces = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    answered = []
    for piece in pieces:
        answered += replies(say(session, piece))
        assert not session.has_requests()
    assert answered == [{"op": "pong", "seq": seq} for seq in range(6)]


def test_requests_return_what_they_change_of_a_session_and_only_the_session_writes_it() -> None:
    rules = node()
    session = connect(rules, hello=False)
    hello = {"op": p.HELLO, "version": 1, "features": ["position", "nonsense"]}
    outcome = rules.dispatch(session, p.HELLO, hello, None, 0.0)
    assert outcome.features == {p.FEATURE_POSITION} and not session.greeted
    say(session, p.encode(p.HELLO, version=1, features=["position"]))
    assert session.greeted and session.features == {p.FEATURE_POSITION}
    (outcome,) = say(session, p.encode(p.REGISTER, name="k"))
    assert (outcome.client_id, outcome.label) == (session.client_id, session.label) == \
        ("c1", "k")
    (outcome,) = say(registered(rules, "holder"), p.encode(p.ACQUIRE))
    assert outcome.told and outcome.position is None  # granted
    (outcome,) = say(session, p.encode(p.ACQUIRE))
    assert (outcome.told, outcome.position, session.told_position) == (True, 1, 1)
