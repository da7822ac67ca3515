"""A client's working set reaches the scheduler rate-limited and damped (issue 34.3): a holder
that reports 1 PiB and 0 over and over makes the others drop once, not at every report.

On a real socket, then the rules to the virtual millisecond on the in-process daemon."""

from __future__ import annotations

import json
import threading
import time

from support import DaemonProcess, scaled
from test_daemon_hardening import registered_raw

from nodeside import limits
from nodeside import protocol as p
from nodeside.daemon.working_sets import HOLD, INTERVAL
from nodeside.testing import Node

GiB = 1 << 30
PiB = limits.MAX_BYTES


def test_a_holder_flapping_its_working_set_makes_the_other_holder_drop_once(
        start_daemon) -> None:
    daemon: DaemonProcess = start_daemon("--mode", "auto", "--tq", "30", "--gpu-memory", "8GiB")
    other = registered_raw(daemon, "other", working_set=GiB)
    other.sendall(p.encode(p.ACQUIRE, seq=2))
    assert other.read()["op"] == p.GRANT
    flapper = registered_raw(daemon, "flapper", working_set=GiB)
    flapper.sendall(p.encode(p.ACQUIRE, seq=2))
    assert flapper.read()["op"] == p.GRANT  # both fit: they hold side by side
    drops = []
    done = threading.Event()

    def comply() -> None:
        """What a kernel does: give the GPU back when asked, and ask again."""
        other.sock.settimeout(0.2)
        pending = b""
        while not done.is_set():
            try:
                pending += other.sock.recv(65536)
            except TimeoutError:
                continue
            *lines, pending = pending.split(b"\n")
            for message in map(json.loads, lines):
                comply_with(message)

    def comply_with(message: dict) -> None:
        if message["op"] == p.DROP:
            drops.append(message)
            other.sendall(p.encode(p.RELEASE, seq=3))
        elif message["op"] == p.RELEASED:
            other.sendall(p.encode(p.ACQUIRE, seq=4))

    complying = threading.Thread(target=comply, daemon=True)
    complying.start()
    try:
        for _ in range(10):  # 400 reports in 10 bursts, each its own write
            flapper.sendall(b"".join(p.encode(p.WORKING_SET, seq=10, bytes=PiB if i % 2 == 0
                                              else 0) for i in range(40)))
            for _ in range(40):
                assert flapper.read()["op"] == p.OK
            time.sleep(scaled(0.1))
    finally:
        done.set()
        complying.join(10)
    assert len(drops) == 1 and drops[0]["reason"] == p.REASON_ROOM
    daemon.wait_log(r"flapper \(c\d+, uid \d+\) reports its working set up and down faster "
                    r"than the scheduler follows")
    assert daemon.log().count("reports its working set up and down") == 1


def test_a_larger_working_set_is_heard_once_per_interval_and_a_smaller_one_after_the_hold(
        ) -> None:
    with Node(tq=30, mode="auto", gpu_memory=8 * GiB) as node:
        client = node.client("k")
        assert client.request(p.ACQUIRE)["op"] == p.GRANT

        def heard() -> int:
            (entry,) = node.status()["clients"]
            return entry["working_set"]

        client.request(p.WORKING_SET, bytes=2 * GiB)
        assert heard() == 2 * GiB  # the first report: at once
        client.request(p.WORKING_SET, bytes=3 * GiB)
        assert heard() == 2 * GiB
        node.sleep(INTERVAL / 2)
        assert heard() == 2 * GiB
        node.sleep(INTERVAL / 2 + 0.01)
        assert heard() == 3 * GiB  # once the interval has passed since the last one heard
        client.request(p.WORKING_SET, bytes=1 * GiB)
        node.sleep(HOLD / 2)
        client.request(p.WORKING_SET, bytes=1 * GiB)
        assert heard() == 3 * GiB
        node.sleep(HOLD / 2 + 0.01)
        assert heard() == 1 * GiB  # once the smaller one held, with nothing larger
