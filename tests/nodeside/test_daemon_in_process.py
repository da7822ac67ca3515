"""The daemon's shell in this process, on virtual time (``nodeside.testing.Node``): its timers, its
backpressure, its queue-position and ``changed`` rounds, and what it measures, each to the
(virtual) millisecond. The same behaviours have end-to-end tests on a real socket elsewhere;
these tell apart what a wall clock on a loaded machine cannot."""

from __future__ import annotations

import logging
import os

import pytest

from nodeside import protocol as p
from nodeside.daemon.changes import INTERVAL as CHANGE_INTERVAL
from nodeside.daemon.positions import INTERVAL as POSITION_INTERVAL
from nodeside.limits import MAX_OWED_BYTES, REQUESTS_PER_TURN
from nodeside.testing import Node, Peer


def acquire(peer: Peer) -> dict:
    return peer.request(p.ACQUIRE)


# -- the scheduler's deadline -----------------------------------------------------------------

def test_a_holder_that_ignores_its_drop_is_revoked_when_the_grace_runs_out() -> None:
    with Node(tq=0.5, grace=2) as node:
        a, b = node.client("a"), node.client("b")
        acquire(a)
        acquire(b)
        assert a.read(within=1)["op"] == p.DROP
        asked = node.now
        revoked = a.read(within=10)
        assert revoked["op"] == p.REVOKED
        assert node.now - asked == pytest.approx(2.0)
        assert b.read()["op"] == p.GRANT


def test_a_holder_alone_keeps_its_gpu_quantum_after_quantum_and_hears_nothing() -> None:
    with Node(tq=0.5) as node:
        a = node.client("a")
        acquire(a)
        node.sleep(5.0)
        assert a.quiet()


def test_gpu_seconds_are_the_time_between_grant_and_release_on_the_daemons_clock() -> None:
    with Node(tq=30) as node:
        a = node.client("a")
        acquire(a)
        node.sleep(0.3)
        assert a.request(p.RELEASE)["op"] == p.RELEASED
        (entry,) = node.status()["clients"]
        assert entry["gpu_seconds"] == pytest.approx(0.3)


# -- connection deadlines ---------------------------------------------------------------------

def test_a_connection_that_never_says_hello_is_closed_at_its_deadline() -> None:
    with Node(connections={"hello_timeout": 0.3}) as node:
        silent = node.connect(hello=False)
        opened = node.now
        reply = silent.read(within=5)
        assert reply["code"] == p.E_LIMIT and "no hello within 0.3 s" in reply["message"]
        assert node.now - opened == pytest.approx(0.3)
        assert silent.closed


def test_an_unregistered_connection_is_closed_when_idle_for_the_limit_after_its_last_request(
        ) -> None:
    with Node(connections={"idle_timeout": 2.0}) as node:
        kernel, idle = node.client("kernel"), node.connect()
        node.sleep(1.5)
        assert idle.request(p.PING)["op"] == p.PONG  # active again: the limit counts from here
        active = node.now
        reply = idle.read(within=10)
        assert reply["code"] == p.E_LIMIT and "idle" in reply["message"]
        assert node.now - active == pytest.approx(2.0)
        assert idle.closed
        assert kernel.request(p.PING)["op"] == p.PONG and not kernel.closed


# -- backpressure and turns -------------------------------------------------------------------

def test_a_peer_that_pipelines_is_answered_a_turn_at_a_time_with_others_between() -> None:
    with Node() as node:
        flood, other = node.client("flood"), node.client("other")
        flood.send(*(p.encode(p.PING, seq=n) for n in range(3 * REQUESTS_PER_TURN)))
        other.send(p.encode(p.PING, seq=1))
        node.loop.call_soon(node.loop.stop)  # one turn of the loop: each connection reads once
        node.loop.run_forever()
        assert len(flood.transport.unread.splitlines()) == REQUESTS_PER_TURN
        assert other.read() == {"op": "pong", "seq": 1}  # before the flood's second turn
        assert [m["seq"] for m in flood.lines()] == list(range(3 * REQUESTS_PER_TURN))


def test_a_peer_that_never_reads_is_not_answered_past_the_bound_and_others_are_served() -> None:
    # Stalled for a minute, short of being cut off (test_event_backlog.py: what comes after).
    with Node(connections={"stall_timeout": 120}) as node:
        big = node.client("big-" + "n" * 200, labels={f"l{i}": "v" * 200 for i in range(8)})
        reader = node.client("reader")
        flood = node.connect()
        status_bytes = len(p.encode(p.STATUS_REPLY, status=node.status()))
        count = 4 * MAX_OWED_BYTES // status_bytes
        flood.send(p.encode(p.STATUS) * count)
        node.settle()
        owed = flood.transport.get_write_buffer_size()
        assert MAX_OWED_BYTES < owed < MAX_OWED_BYTES + 2 * status_bytes
        assert flood.transport.reading_paused  # the rest stays in the kernel's buffer
        assert reader.request(p.PING)["op"] == p.PONG and big.request(p.PING)["op"] == p.PONG
        node.sleep(60)
        assert flood.transport.get_write_buffer_size() == owed  # still nothing more
        replies = flood.lines()  # the peer reads at last: the rest is answered, in order
        while len(replies) < count:
            more = flood.lines()
            assert more, f"answering stopped after {len(replies)} of {count}"
            replies += more
        assert len(replies) == count and all(r["op"] == p.STATUS_REPLY for r in replies)


# -- queue positions ----------------------------------------------------------------------------

def test_waiters_that_asked_hear_their_new_position_once_per_round_and_only_on_change() -> None:
    with Node(tq=30) as node:
        holder = node.client("holder")
        waiters = [node.client(f"w{i}", features=["position"]) for i in range(3)]
        acquire(holder)
        assert [acquire(w)["position"] for w in waiters] == [1, 2, 3]
        holder.send(p.encode(p.RELEASE, seq=50))  # w0 is granted; w1 and w2 move up
        assert waiters[0].read()["op"] == p.GRANT
        moved = node.now
        assert waiters[1].quiet() and waiters[2].quiet()  # not on the handoff's path
        assert waiters[1].read(within=1) == {"op": "waiting", "position": 1}
        assert node.now - moved == pytest.approx(POSITION_INTERVAL)
        assert waiters[2].read() == {"op": "waiting", "position": 2}
        node.sleep(5)
        assert all(w.quiet() for w in waiters)  # nothing moved since


def test_peers_that_did_not_ask_for_positions_hear_only_their_replies() -> None:
    with Node(tq=30) as node:
        holder, first, second = node.client("h"), node.client("a"), node.client("b")
        acquire(holder)
        acquire(first)
        acquire(second)
        holder.request(p.RELEASE)
        assert first.read()["op"] == p.GRANT
        node.sleep(5)
        assert second.quiet()


# -- changed events -----------------------------------------------------------------------------

def test_a_burst_of_changes_makes_one_event_at_once_then_one_per_interval() -> None:
    with Node(tq=30) as node:
        watcher = node.connect(features=["changes"])
        a = node.client("a")
        assert watcher.read() == {"op": "changed"}  # a registered: told on the next turn
        first = node.now
        for _ in range(5):  # a burst: each request changes what the status shows
            a.request(p.ACQUIRE)
            a.request(p.RELEASE)
        assert watcher.quiet()
        assert watcher.read(within=1) == {"op": "changed"}
        assert node.now - first == pytest.approx(CHANGE_INTERVAL)
        node.sleep(5)
        assert watcher.quiet()
        a.request(p.ACQUIRE)  # after a quiet spell: at once again
        assert watcher.read() == {"op": "changed"}


def test_status_and_ping_change_nothing_a_watcher_hears_of() -> None:
    with Node(tq=30) as node:
        watcher = node.connect(features=["changes"])
        other = node.connect()
        other.request(p.STATUS)
        other.request(p.PING)
        node.sleep(1)
        assert watcher.quiet()


# -- refusals for room --------------------------------------------------------------------------

def test_a_client_refused_room_again_and_again_is_one_log_line_a_minute_with_a_count(
        caplog) -> None:
    """Issue 40 N4a: a kernel whose room cannot be made asks again (the shim backs off, a
    hostile peer need not); each refusal is an event to it, not a line in the daemon's log."""
    gib = 1 << 30
    # NVML sees this process (every peer's) hold 6 GiB: what the holder says is vouched for.
    with Node(gpu_memory=8 * gib, process_memory=lambda: [(0, os.getpid(), 6 * gib)]) as node:
        holder = node.client("nbA", features=[p.FEATURE_MEMORY], working_set=6 * gib,
                             resident=6 * gib, host=0, evict="vmm")
        node.sleep(3.0)  # NVML is read every 2 s
        # An eviction that failed: its 6 GiB stay, and no eviction can make room beside them.
        assert holder.request(p.EVICTED, failed="pinned allocations")["op"] == p.OK
        waiter = node.client("nbB", features=[p.FEATURE_MEMORY], working_set=6 * gib,
                             evict="vmm")
        with caplog.at_level(logging.WARNING, "kiwi.daemon"):
            for _ in range(5):
                acquire(waiter)
                refused = waiter.read(within=1)
                assert (refused["op"], refused["code"]) == (p.ERROR, p.E_ROOM)
                node.sleep(2.0)
            said = [r.getMessage() for r in caplog.records if "Refused nbB" in r.getMessage()]
            assert len(said) == 1 and "pinned allocations" in said[0], said
            node.sleep(60.0)
            acquire(waiter)
            assert waiter.read(within=1)["code"] == p.E_ROOM
            said = [r.getMessage() for r in caplog.records if "Refused nbB" in r.getMessage()]
        assert len(said) == 2 and "(and 4 more like it in the last 70 s)" in said[1], said
