"""The quantum timer after handoffs: the daemon keeps an armed timer that fires earlier than the
new deadline (a handoff starts a quantum, so the deadline moves later on every one) instead of
re-arming it each time. The early firing must tick harmlessly and arm the real deadline: the next
holder is asked to drop when its own quantum ends, never at the earlier one, and never not at all.

In process on virtual time (``nodeside.testing.Node``) to the millisecond; once more on a real
socket, where only "not before the quantum's end" can be told apart on a loaded machine.
"""

from __future__ import annotations

import time

import pytest
from support import DaemonProcess, scaled
from test_batched_requests import greeted

from nodeside import protocol as p
from nodeside.testing import Node, Peer

TQ = 0.6


def acquire(peer: Peer) -> dict:
    return peer.request(p.ACQUIRE)


def test_a_holder_with_a_waiter_is_asked_to_drop_exactly_at_the_end_of_its_quantum() -> None:
    with Node(tq=TQ, grace=5) as node:
        a, b = node.client("a"), node.client("b")
        assert acquire(a)["op"] == p.GRANT
        granted = node.now
        assert acquire(b)["op"] == p.WAITING
        drop = a.read(within=10)
        assert (drop["op"], drop["reason"]) == (p.DROP, p.REASON_QUANTUM)
        assert node.now - granted == pytest.approx(TQ)


def test_a_quantum_started_by_a_handoff_ends_on_its_own_deadline_not_the_armed_one() -> None:
    # The timer armed for a's quantum fires half a quantum into b's; it must tick harmlessly
    # and arm b's own deadline, not drop b early (nor never).
    with Node(tq=TQ, grace=5) as node:
        a, b = node.client("a"), node.client("b")
        acquire(a)
        acquire(b)
        node.sleep(TQ / 2)
        a.send(p.encode(p.RELEASE, seq=10), p.encode(p.ACQUIRE, seq=11))
        assert b.read()["op"] == p.GRANT
        granted = node.now
        assert [m["op"] for m in a.lines()] == [p.RELEASED, p.WAITING]
        node.sleep(TQ / 2)  # past a's old deadline
        assert b.quiet()
        drop = b.read(within=10)
        assert drop["op"] == p.DROP and drop["reason"] == p.REASON_QUANTUM
        assert node.now - granted == pytest.approx(TQ)


def test_over_a_real_socket_a_quantum_started_by_a_handoff_is_never_cut_short(
        start_daemon) -> None:
    daemon: DaemonProcess = start_daemon("--tq", str(TQ), "--grace", "5")
    first, second = greeted(daemon, "first"), greeted(daemon, "second")
    first.send(p.encode(p.ACQUIRE, seq=1))
    assert first.read()["op"] == p.GRANT
    second.send(p.encode(p.ACQUIRE, seq=1))  # now first's quantum has a deadline: a timer
    assert second.read()["op"] == p.WAITING
    time.sleep(TQ / 2)  # let the armed deadline be well before the next quantum's end
    first.send(p.encode(p.RELEASE, seq=2), p.encode(p.ACQUIRE, seq=3))
    granted_at = time.monotonic()
    assert second.read()["op"] == p.GRANT
    assert [first.read()["op"], first.read()["op"]] == [p.RELEASED, p.WAITING]
    # The timer armed for first's quantum fires about TQ/2 from here; second's quantum ends TQ
    # from its grant. The drop must wait for the latter, and come (the read times out if not).
    second.sock.settimeout(scaled(TQ * 20))
    drop = second.read()
    waited = time.monotonic() - granted_at
    assert drop["op"] == p.DROP and drop["reason"] == p.REASON_QUANTUM
    assert waited >= TQ - 0.05, f"dropped {waited:.3f} s into a {TQ} s quantum"
