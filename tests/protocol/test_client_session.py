"""``ClientSession`` by itself, in memory: the bytes it makes are the bytes the clients sent
before it existed, and what it tells its shell. The hold's behaviour is the transcripts'."""

from __future__ import annotations

import pytest

from nodeside import __version__
from nodeside.protocol import events as ev
from nodeside.protocol.client_session import ClientSession, Phase
from nodeside.protocol.hold import MOVES, Hold, IllegalMove

WELCOME = b'{"op":"welcome","version":1,"mode":"on","tq":30.0,"features":["position"]}\n'


def test_hello_is_the_line_each_client_always_sent() -> None:
    kernel = ClientSession(features=["position"])
    kernel.connect()
    assert kernel.data_to_send() == (b'{"op":"hello","version":1,"software":"nodeside.client '
                                     + __version__.encode() + b'","features":["position"]}\n')
    bare = ClientSession(software=None)  # daemon_answers
    bare.connect()
    assert bare.data_to_send() == b'{"op":"hello","version":1}\n'


def test_register_follows_the_welcome_with_the_working_set_last() -> None:
    session = ClientSession(features=["position"])
    session.report_working_set(4096)
    session.connect({"name": "k", "pool": "default", "priority": "NORMAL", "gpu": 0,
                     "kind": "client", "labels": None, "display_name": None})
    session.data_to_send()
    assert session.receive_data(WELCOME) == []
    assert session.data_to_send() == (b'{"op":"register","name":"k","pool":"default",'
                                      b'"priority":"NORMAL","gpu":0,"kind":"client",'
                                      b'"working_set":4096}\n')
    session.report_working_set(8192)  # while registering: reported again once registered
    [ready] = session.receive_data(b'{"op":"registered","client":"c4","gpu":0,"tq":2.5}\n')
    assert isinstance(ready, ev.Ready) and ready.registered is not None
    assert (session.client_id, session.tq, session.phase) == ("c4", 2.5, Phase.READY)
    assert session.data_to_send() == b'{"op":"working_set","seq":1,"bytes":8192}\n'
    assert session.receive_data(b'{"op":"ok","seq":1}\n') == []  # nobody waits for it


def test_a_reply_comes_back_to_the_request_by_its_seq_past_events() -> None:
    session = ready_session()
    first, second = session.request("status"), session.request("ping")
    happened = session.receive_data(b'{"op":"mode","mode":"off","tq":1.0}\n'
                                    b'{"op":"pong","seq":%d}\n{"op":"status","seq":%d,'
                                    b'"status":{}}\n' % (second, first))
    assert [type(e) for e in happened] == [ev.ModeChanged, ev.Reply, ev.Reply]
    assert [e.seq for e in happened[1:]] == [second, first]  # type: ignore[attr-defined]
    assert (session.mode, session.tq) == ("off", 1.0)


def test_anything_but_a_welcome_first_is_a_refusal() -> None:
    session = ClientSession()
    session.connect()
    [refused] = session.receive_data(b'{"op":"error","code":"version","message":"no"}\n')
    assert isinstance(refused, ev.Refused)


def test_a_request_before_the_connection_is_ready_is_a_bug_of_the_shell() -> None:
    with pytest.raises(RuntimeError, match="before the connection is ready"):
        ClientSession().request("status")


def test_every_move_is_checked_against_the_table() -> None:
    session = ready_session()
    assert (Hold.IDLE, Hold.HOLDING) not in MOVES
    with pytest.raises(IllegalMove, match="IDLE -> HOLDING"):
        session._move(Hold.HOLDING)


def test_a_new_connection_counts_one_generation_more_and_forgets_the_old_ones_requests() -> None:
    session = ready_session()
    seq = session.request("status")
    generation = session.generation
    session.connect()
    assert session.generation == generation + 1
    session.data_to_send()
    session.receive_data(WELCOME)
    assert session.receive_data(b'{"op":"status","seq":%d,"status":{}}\n' % seq) == []


def ready_session() -> ClientSession:
    session = ClientSession(features=["position"])
    session.connect()
    session.receive_data(WELCOME)
    session.data_to_send()
    return session


MEMORY_WELCOME = (b'{"op":"welcome","version":1,"mode":"on","tq":30.0,'
                  b'"features":["position","memory"]}\n')


def memory_session(welcome: bytes = MEMORY_WELCOME) -> ClientSession:
    session = ClientSession(features=["position", "memory"])
    session.connect({"name": "k"})
    session.receive_data(welcome)
    session.receive_data(b'{"op":"registered","client":"c1","gpu":0,"tq":30.0}\n')
    session.data_to_send()
    return session


def test_an_evict_to_an_idle_client_asks_its_shell_to_move_out() -> None:
    session = memory_session()
    [asked] = session.receive_data(b'{"op":"evict","gpu":0,"bytes":4096,"for":"nbB.ipynb"}\n')
    assert isinstance(asked, ev.EvictAsked)
    assert (asked.nbytes, asked.for_name) == (4096, "nbB.ipynb")


def test_an_evict_that_crossed_a_grant_is_ignored_the_holder_is_told_drop() -> None:
    session = memory_session()
    session.ask()
    session.receive_data(b'{"op":"grant","gpu":0,"tq":30.0}\n')
    assert session.receive_data(b'{"op":"evict","gpu":0,"bytes":1,"for":"x"}\n') == []


def test_a_release_evicting_says_so_only_where_the_daemon_serves_memory() -> None:
    for welcome, line in ((MEMORY_WELCOME, b'{"op":"release","evicting":true}\n'),
                          (WELCOME, b'{"op":"release"}\n')):
        session = memory_session(welcome)
        session.ask()
        session.data_to_send()
        session.receive_data(b'{"op":"grant","gpu":0,"tq":30.0}\n')
        session.release(evicting=True)
        assert session.data_to_send() == line
        assert session.state is Hold.IDLE


def test_memory_figures_go_with_the_working_set_only_where_the_daemon_serves_memory() -> None:
    with_memory, without = memory_session(), memory_session(WELCOME)
    with_memory.report_working_set(8, resident=8, host=0)
    without.report_working_set(8, resident=8, host=0)
    assert with_memory.data_to_send() == \
        b'{"op":"working_set","seq":1,"bytes":8,"resident":8,"host":0}\n'
    assert without.data_to_send() == b'{"op":"working_set","seq":1,"bytes":8}\n'
