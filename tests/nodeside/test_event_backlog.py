"""Everything owed to a peer is bounded, events included (issue 34.1): a peer behind on its
reading gets only the latest state event of each kind, and one that stays behind is cut off.

On a real socket, then the same rules to the virtual millisecond on the in-process daemon."""

from __future__ import annotations

import json
import selectors
import socket
import textwrap
import time
from pathlib import Path

from support import DaemonProcess, scaled
from test_daemon import Raw
from test_daemon_hardening import registered_raw, rss_bytes

from nodeside import protocol as p
from nodeside.client import Client
from nodeside.limits import MAX_OWED_BYTES, MAX_OWED_BYTES_TOTAL
from nodeside.testing import Node


def read_to_the_end(sock: socket.socket, within: float) -> tuple[bool, int]:
    """Read what is there until the daemon closes the connection: (closed, bytes read)."""
    sock.settimeout(0.5)
    deadline = time.monotonic() + scaled(within)
    read = 0
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(1 << 20)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return True, read
        if not chunk:
            return True, read
        read += len(chunk)
    return False, read


def count_closed(socks: list[socket.socket], within: float) -> int:
    """Read all of ``socks`` at once, for ``within`` seconds in all (stretched by the load):
    how many the daemon closed. One deadline for all: those left open (served in full, then
    quiet) cost no more than those closed."""
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            sock.setblocking(False)
            selector.register(sock, selectors.EVENT_READ)
        closed = 0
        deadline = time.monotonic() + scaled(within)
        while closed < len(socks) and (left := deadline - time.monotonic()) > 0:
            for key, _ in selector.select(left):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    chunk = sock.recv(1 << 20)
                except BlockingIOError:
                    continue
                except ConnectionResetError:
                    chunk = b""
                if not chunk:
                    selector.unregister(sock)
                    closed += 1
        return closed


def test_peers_that_never_read_are_cut_off_and_the_daemon_stays_bounded(
        start_daemon, scratch: Path) -> None:
    config = scratch / "kiwi.yaml"
    config.write_text(textwrap.dedent("""
        connections: {stall_timeout: 1}
    """))
    daemon: DaemonProcess = start_daemon("--tq", "0.05", "--config", str(config))
    labels = {f"label{i}": "v" * 200 for i in range(8)}
    crowd = [registered_raw(daemon, f"kernel-{i:03d}-" + "n" * 100, labels=labels)
             for i in range(100)]
    before = rss_bytes(daemon.process.pid)
    deaf = []
    for _ in range(20):
        peer = Raw(daemon, hello=False)
        peer.sendall(p.encode(p.HELLO, version=p.VERSION, features=[p.FEATURE_CHANGES]))
        assert json.loads(peer.lines.readline())["op"] == p.WELCOME
        peer.sendall(p.encode(p.STATUS) * 16)  # megabytes of replies, never read
        deaf.append(peer)
    # Changes all the while: every one is a "changed" event owed to every deaf peer.
    with Client(daemon.socket, name="probe") as probe, \
            Client(daemon.socket, name="other") as other:
        started = time.monotonic()
        while time.monotonic() - started < scaled(3):
            probe.acquire(timeout=10)
            other.report_working_set(int(time.monotonic() * 1000) % 1000)
            probe.release()
        grown = rss_bytes(daemon.process.pid) - before
    for peer in deaf:
        closed, read = read_to_the_end(peer.sock, within=10)
        assert closed, "a peer that never read was not cut off"
        assert read < 16 * 2**20
    assert grown < 64 * 2**20, f"the daemon grew by {grown / 2**20:.0f} MiB"
    daemon.wait_log(r"Cutting off <UNREGISTERED> \(uid \d+\) \[FD=\d+\]: it left what the "
                    r"daemon owes it unread for \d+\.\d s")
    assert "Traceback" not in daemon.log()
    for conn in crowd:  # the registered kernels that read were never touched
        conn.sendall(p.encode(p.PING, seq=5))
        assert conn.read() == {"op": "pong", "seq": 5}


def test_peers_that_never_read_are_cut_off_once_together_they_are_owed_too_much(
        start_daemon, scratch: Path) -> None:
    config = scratch / "kiwi.yaml"
    config.write_text("connections: {stall_timeout: 3600}\n")  # only the total cuts them off
    daemon: DaemonProcess = start_daemon("--config", str(config))
    labels = {f"label{i}": "v" * 200 for i in range(8)}
    crowd = [registered_raw(daemon, f"kernel-{i:03d}-" + "n" * 100, labels=labels)
             for i in range(100)]
    before = rss_bytes(daemon.process.pid)
    deaf = []
    for _ in range(80):  # each owed past MAX_OWED_BYTES: together far past the total
        peer = Raw(daemon)
        peer.sendall(p.encode(p.STATUS) * 8)
        deaf.append(peer)
    daemon.wait_log(r"Cutting off <UNREGISTERED> \(uid \d+\) \[FD=\d+\]: the peers that do "
                    rf"not read are owed more than {MAX_OWED_BYTES_TOTAL >> 20} MiB together")
    with Client(daemon.socket, name="probe") as probe:
        probe.acquire(timeout=10)
        probe.release()
    grown = rss_bytes(daemon.process.pid) - before
    assert grown < 2 * (MAX_OWED_BYTES_TOTAL >> 20) * 2**20, f"grew {grown / 2**20:.0f} MiB"
    cut = count_closed([peer.sock for peer in deaf], within=2)
    assert cut >= 80 - MAX_OWED_BYTES_TOTAL // MAX_OWED_BYTES
    for conn in crowd:
        conn.sendall(p.encode(p.PING, seq=5))
        assert conn.read() == {"op": "pong", "seq": 5}


def test_a_watcher_that_reads_again_gets_the_latest_event_of_each_kind_once() -> None:
    with Node(tq=30, connections={"stall_timeout": 60}) as node:
        watcher = node.connect(features=[p.FEATURE_CHANGES])
        watcher.transport.unread += b"unread\n"  # it has not read what came before
        admin = node.client("admin")
        for mode in ("auto", "off", "on", "auto"):  # each: a mode broadcast and a change
            assert admin.request(p.SET_MODE, mode=mode)["op"] == p.OK
            node.sleep(0.2)
        assert watcher.transport.unread == b"unread\n"  # behind: nothing more was written
        assert watcher.transport.take_line() == b"unread"  # it reads: the daemon resumes
        lines = watcher.lines()
        assert lines == [{"op": "mode", "mode": "auto", "tq": 30.0}, {"op": "changed"}]


def test_a_grant_to_a_peer_that_is_behind_comes_after_the_events_before_it() -> None:
    with Node(tq=30, connections={"stall_timeout": 60}) as node:
        holder = node.client("holder")
        assert holder.request(p.ACQUIRE)["op"] == p.GRANT
        waiter = node.client("waiter", features=[p.FEATURE_CHANGES])
        assert waiter.request(p.ACQUIRE)["op"] == p.WAITING
        waiter.transport.unread += b"unread\n"
        node.client("admin").request(p.SET_MODE, mode="on")
        holder.request(p.RELEASE)
        node.settle()
        assert waiter.transport.take_line() == b"unread"
        ops = [line["op"] for line in waiter.lines()]
        assert ops.index(p.MODE) < ops.index(p.GRANT)


def test_a_peer_behind_for_the_stall_timeout_is_cut_off_to_the_virtual_second() -> None:
    with Node(tq=30, connections={"stall_timeout": 5}) as node:
        watcher = node.connect(features=[p.FEATURE_CHANGES])
        watcher.transport.unread += b"unread\n"
        admin = node.client("admin")
        admin.request(p.SET_MODE, mode="auto")
        behind_since = node.now
        node.sleep(4.9)
        assert not watcher.closed
        node.sleep(0.2)
        assert watcher.closed and not admin.closed
        assert node.now - behind_since >= 5
