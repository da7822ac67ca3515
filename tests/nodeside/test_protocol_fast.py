"""The handoff's lines, written and read without the JSON layers, mean exactly what they did.

``grant_line``, ``waiting_line`` and ``released_line`` must be the very bytes ``encode`` makes of
the same fields, and a plain request read by ``decode``'s shortcut must be the message the JSON
decoder makes of it; a line the shortcut does not take must be answered as before.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodeside import protocol as p
from nodeside.limits import MAX_INTEGER

seqs = st.none() | st.integers(min_value=0, max_value=MAX_INTEGER)
quanta = st.none() | st.floats(min_value=0.01, max_value=86400.0) | st.integers(1, 86400)


@given(gpu=st.integers(0, 64), quantum=quanta, seq=seqs)
def test_grant_line_is_the_bytes_encode_makes(gpu: int, quantum: float | None,
                                              seq: int | None) -> None:
    assert p.grant_line(gpu, quantum, seq) == p.encode(p.GRANT, seq=seq, gpu=gpu,
                                                       quantum=quantum)


@given(position=st.none() | st.integers(1, 10**6), seq=seqs)
def test_waiting_line_is_the_bytes_encode_makes(position: int | None, seq: int | None) -> None:
    assert p.waiting_line(position, seq) == p.encode(p.WAITING, seq=seq, position=position)


@given(evict=st.booleans(), seq=seqs)
def test_released_line_is_the_bytes_encode_makes(evict: bool, seq: int | None) -> None:
    assert p.released_line(evict, seq) == p.encode(p.RELEASED, seq=seq, evict=evict)


def test_fast_lines_refuse_what_encode_refuses() -> None:
    # A value JSON cannot carry fails the same way on both paths: never a line with "inf".
    with pytest.raises(ValueError):
        p.grant_line(0, float("inf"), 3)
    with pytest.raises(ValueError):
        p.encode(p.GRANT, seq=3, gpu=0, quantum=float("inf"))


@given(op=st.sampled_from(sorted(p.REQUESTS) + ["no_such_op"]),
       seq=st.integers(min_value=0, max_value=MAX_INTEGER))
def test_plain_request_reads_as_the_json_decoder_reads_it(op: str, seq: int) -> None:
    line = json.dumps({"op": op, "seq": seq}, separators=(",", ":")).encode()
    message = p.decode(line)
    assert message == json.loads(line)
    assert type(message["seq"]) is int


def test_lines_the_shortcut_does_not_take_are_read_in_full() -> None:
    assert p.decode(b'{"op": "release", "seq": 7}') == {"op": "release", "seq": 7}
    assert p.decode(b'{"seq":7,"op":"release"}') == {"op": "release", "seq": 7}
    assert p.decode(b'{"op":"release","seq":7,"requeue":true}') == {
        "op": "release", "seq": 7, "requeue": True}
    assert p.decode(b'{"op":"ping"}') == {"op": "ping"}
    for bad in (b'{"op":"release","seq":-1}', b'{"op":"release","seq":07}',
                b'{"op":"release","seq":1e3}', b'{"op":"release","seq":%d}' % (MAX_INTEGER + 1),
                b'{"op":"release","seq":7}}', b'{"op":"\\u0000","seq":1}x'):
        with pytest.raises(p.ProtocolError) as exc:
            p.decode(bad)
        assert exc.value.code == p.E_MALFORMED


@given(op=st.sampled_from(sorted(p.REQUESTS) + ["no_such_op", "", "acquire\\u0000"]),
       digits=st.text(alphabet="0123456789+-_ .e}", max_size=22))
def test_near_plain_requests_read_as_the_json_decoder_reads_them(op: str, digits: str) -> None:
    # Lines one step off the plain form (a sign, a space, an underscore, a leading zero, too
    # many digits, a stray brace) must take the full path: int() alone would accept some.
    line = b'{"op":"%s","seq":%s}' % (op.encode(), digits.encode())
    try:
        expected = json.loads(line)
    except ValueError:
        expected = None
    seq = expected.get("seq") if isinstance(expected, dict) else None
    if type(seq) is int and 0 <= seq <= MAX_INTEGER:
        assert p.decode(line) == expected
    else:
        with pytest.raises(p.ProtocolError):
            p.decode(line)
