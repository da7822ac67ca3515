"""The one table of messages is what the code and the daemon go by: the names, the check of each
request's fields, and what a real daemon sends and answers."""

from __future__ import annotations

import socket

import pytest
from support import DaemonProcess, scaled

from nodeside import protocol as p
from nodeside.protocol import messages


def test_every_op_code_feature_and_reason_has_its_name_from_the_table() -> None:
    for message in messages.MESSAGES:
        assert getattr(p, message.const) == message.op
    for word in (*messages.ERRORS, *messages.FEATURES, *messages.REASONS):
        assert getattr(p, word.const) == word.value
    assert {m.op for m in messages.requests()} == p.REQUESTS
    assert {w.value for w in messages.ERRORS if w.fatal} == p.FATAL_ERRORS
    assert {w.value for w in messages.FEATURES} == p.FEATURES


def test_every_reply_answers_requests_the_table_defines() -> None:
    ops = {m.op for m in messages.requests()}
    for message in messages.daemon_messages():
        assert set(message.answers) <= ops, message.op
        assert message.answers or message.event, f"{message.op} is neither reply nor event"
    for message in messages.MESSAGES:
        assert all(f.type in messages.TYPES for f in message.fields), message.op


_WRONG = {"int": "seven", "number": "seven", "str": 7, "bool": 1, "list": "a", "object": [1]}


@pytest.mark.parametrize("request_", messages.requests(), ids=lambda m: m.op)
def test_each_field_of_each_request_is_checked_as_the_table_says(
        request_: messages.Message) -> None:
    required = {f.name: _RIGHT[f.type] for f in request_.fields if f.required}
    p.check_request({"op": request_.op, **required})
    for field in request_.fields:
        with pytest.raises(p.ProtocolError, match=f"{request_.op}: field '{field.name}' must "
                                                  f"be ") as wrong:
            p.check_request({"op": request_.op, **required, field.name: _WRONG[field.type]})
        assert wrong.value.code == p.E_MALFORMED and wrong.value.fatal
        if field.required:
            without = {k: v for k, v in required.items() if k != field.name}
            with pytest.raises(p.ProtocolError, match=f"{request_.op}: missing field "
                                                      f"'{field.name}'"):
                p.check_request({"op": request_.op, **without})


_RIGHT = {"int": 1, "number": 0.5, "str": "x", "bool": True, "list": [], "object": {}}


def test_a_real_daemon_sends_only_what_the_table_says_it_may(daemon: DaemonProcess) -> None:
    """A session through register, acquire (granted, then queued behind another), requeue,
    release with evict_first, status, set_tq, ping and an error: every line the daemon sends
    is a message of the table, with fields the table names, answering what it may answer."""
    said: list[tuple[dict, str | None]] = []  # each message, and the op of what it answers
    with socket.socket(socket.AF_UNIX) as a, socket.socket(socket.AF_UNIX) as b:
        buffers = {a: p.LineBuffer(p.MAX_REPLY_BYTES), b: p.LineBuffer(p.MAX_REPLY_BYTES)}

        def ask(sock: socket.socket, op: str, seq: int | None, **fields: object) -> None:
            """Send one request and read up to its reply, keeping every line read."""
            sock.sendall(p.encode(op, seq=seq, **fields))
            while True:
                for line in buffers[sock].feed(sock.recv(1 << 20)):
                    message = p.decode(line)
                    if seq is None:  # hello and register: the handshake's replies
                        answered = message["op"] in (p.WELCOME, p.REGISTERED)
                    else:
                        answered = message.get("seq") == seq
                    said.append((message, op if answered else None))
                    if answered:
                        return

        for sock in (a, b):
            sock.connect(daemon.socket)
            sock.settimeout(scaled(10))
            ask(sock, p.HELLO, None, version=1, features=["position", "changes"])
        ask(a, p.REGISTER, None, name="a", working_set=10)
        ask(b, p.REGISTER, None, name="b")
        ask(a, p.ACQUIRE, 1)
        ask(b, p.ACQUIRE, 2)
        ask(a, p.RELEASE, 3, requeue=True)
        ask(b, p.RELEASE, 4, evict_first=True)
        ask(a, p.WORKING_SET, 5, bytes=5)
        ask(a, p.STATUS, 6)
        ask(a, p.PING, 7)
        ask(a, p.SET_TQ, 8, tq=0.5)
        ask(a, p.SET_MODE, 9, mode="nonsense")
        ask(b, p.PING, 10)  # the events b was sent meanwhile come before its pong
    ops = set()
    for message, answers in said:
        op = message["op"]
        table = messages.daemon_message(op)
        ops.add(op)
        assert set(message) - {"op", "seq"} <= {f.name for f in table.fields}, message
        if answers is None:
            assert table.event, f"{op} came on its own, but the table says it never does"
        else:
            assert answers in table.answers, f"{op} answered {answers}"
    # The session went through the messages it was meant to (not a test of nothing).
    assert {"welcome", "registered", "grant", "waiting", "ok", "status", "pong",
            "error", "mode", "changed"} <= ops

