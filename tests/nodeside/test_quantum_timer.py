"""The quantum timer after handoffs: the daemon keeps an armed timer that fires earlier than the
new deadline (a handoff starts a quantum, so the deadline moves later on every one) instead of
re-arming it each time. The early firing must tick harmlessly and arm the real deadline: the next
holder is asked to drop when its own quantum ends, never at the earlier one, and never not at all.
"""

from __future__ import annotations

import time

from support import DaemonProcess
from test_batched_requests import greeted

from nodeside import protocol as p

TQ = 0.6


def test_a_quantum_started_by_a_handoff_ends_on_its_own_deadline(start_daemon) -> None:
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
    second.sock.settimeout(TQ * 20)
    drop = second.read()
    waited = time.monotonic() - granted_at
    assert drop["op"] == p.DROP and drop["reason"] == p.REASON_QUANTUM
    assert waited >= TQ - 0.05, f"dropped {waited:.3f} s into a {TQ} s quantum"
