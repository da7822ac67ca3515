"""The wire protocol's framing and validation, without sockets."""

from __future__ import annotations

import json

import pytest

from nodeside import protocol as p


def test_encode_is_one_compact_line_without_none_fields() -> None:
    line = p.encode(p.GRANT, gpu=0, quantum=30.0, seq=None)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line) == {"op": "grant", "gpu": 0, "quantum": 30.0}


def test_decode_rejects_what_is_not_a_message() -> None:
    for bad in (b"not json", b"[1, 2]", b'{"no": "op"}', b'{"op": 3}', b'{"op":"ping","seq":-1}',
                b"\xff\xfe"):
        with pytest.raises(p.ProtocolError) as exc:
            p.decode(bad)
        assert exc.value.code == p.E_MALFORMED and exc.value.fatal


def test_unknown_op_is_fatal() -> None:
    with pytest.raises(p.ProtocolError) as exc:
        p.check_request({"op": "format_disk"})
    assert exc.value.code == p.E_UNKNOWN_OP and exc.value.fatal


def test_field_types_are_checked_per_op() -> None:
    with pytest.raises(p.ProtocolError, match="version"):
        p.check_request({"op": "hello"})
    with pytest.raises(p.ProtocolError, match="bytes"):
        p.check_request({"op": "working_set", "bytes": "lots"})
    with pytest.raises(p.ProtocolError, match="tq"):
        p.check_request({"op": "set_tq", "tq": True})
    p.check_request({"op": "set_tq", "tq": 0.05, "gpu": None})
    p.check_request({"op": "register", "name": "k", "gpu": 1, "labels": {"pod": "x"}})


def test_release_may_ask_to_evict_first_with_a_boolean_only() -> None:
    p.check_request({"op": "release"})
    p.check_request({"op": "release", "seq": 4, "evict_first": True})
    with pytest.raises(p.ProtocolError, match="evict_first"):
        p.check_request({"op": "release", "evict_first": 1})
    with pytest.raises(p.ProtocolError, match="bytes"):
        p.check_request({"op": "working_set", "bytes": True})


def test_permission_and_invalid_errors_keep_the_connection() -> None:
    assert not p.ProtocolError(p.E_PERMISSION, "no").fatal
    assert not p.ProtocolError(p.E_INVALID, "no").fatal


def test_line_buffer_reassembles_split_lines() -> None:
    buffer = p.LineBuffer(limit=64)
    assert buffer.feed(b'{"op":"pi') == []
    assert buffer.feed(b'ng"}\n{"op":"status"}\n{"op"') == [b'{"op":"ping"}', b'{"op":"status"}']
    assert buffer.feed(b':"ping"}\n') == [b'{"op":"ping"}']


def test_line_buffer_refuses_a_line_over_the_limit_even_without_newline() -> None:
    buffer = p.LineBuffer(limit=16)
    with pytest.raises(p.ProtocolError) as exc:
        buffer.feed(b"x" * 16)
    assert exc.value.code == p.E_TOO_LARGE
    with pytest.raises(p.ProtocolError):
        p.LineBuffer(limit=16).feed(b"y" * 20 + b"\n")
    assert p.LineBuffer(limit=16).feed(b"z" * 15 + b"\n") == [b"z" * 15]
