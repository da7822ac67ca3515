"""Hostile and buggy peers against the real daemon on its real socket (issue 11).

Each test ends the same way: the offending connection gets a clear error (or is closed), every
other client keeps being served, and the daemon's memory stays bounded.
"""

from __future__ import annotations

import json
import resource
import shutil
import socket
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest
from support import DaemonProcess, socket_answers, wait_for
from test_daemon import Raw

from nodeside import protocol as p
from nodeside.client import Client


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def config(scratch: Path, text: str) -> str:
    path = scratch / "kiwi.yaml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def registered_raw(daemon: DaemonProcess, name: str, **fields: object) -> Raw:
    conn = Raw(daemon)
    conn.sendall(p.encode(p.REGISTER, seq=1, name=name, **fields))
    reply = conn.read()
    assert reply["op"] == p.REGISTERED, reply
    return conn


def test_a_never_read_flood_of_pipelined_status_requests_stays_bounded_and_others_are_served(
        daemon: DaemonProcess) -> None:
    labels = {f"label{i}": "v" * 200 for i in range(8)}
    crowd = [registered_raw(daemon, f"kernel-{i:03d}-" + "n" * 200, labels=labels)
             for i in range(150)]
    with Client(daemon.socket, name="probe") as probe:
        probe.acquire(timeout=10)
        probe.release()
        one_status = len(json.dumps(probe.status()))
        assert one_status > 200_000  # 4,000 of them would be most of a gigabyte
        before = rss_bytes(daemon.process.pid)
        attacker = Raw(daemon)
        attacker.sock.setblocking(False)
        flood = p.encode(p.STATUS) * 4000  # one 64 KB write, never read
        sent = 0
        deadline_hits = 0
        while sent < len(flood) and deadline_hits < 200:
            try:
                sent += attacker.sock.send(flood[sent:])
            except BlockingIOError:
                deadline_hits += 1
                wait_for(lambda: True, 0.01)
        for _ in range(20):  # the probe is served while the flood waits
            probe.acquire(timeout=10)
            probe.release()
        assert probe.status()["clients"]
        grown = rss_bytes(daemon.process.pid) - before
    assert grown < 64 * 2**20, f"the daemon grew by {grown / 2**20:.0f} MiB"
    assert daemon.process.poll() is None
    for conn in crowd:
        conn.sock.close()
    attacker.sock.close()


def test_an_oversized_name_is_refused_with_limit_and_the_connection_stays(
        daemon: DaemonProcess) -> None:
    conn = Raw(daemon)
    conn.sendall(p.encode(p.REGISTER, seq=1, name="n" * 1000))
    reply = conn.read()
    assert (reply["code"], reply["seq"]) == (p.E_LIMIT, 1) and "256" in reply["message"]
    conn.sendall(p.encode(p.PING, seq=2))
    assert conn.read() == {"op": "pong", "seq": 2}


def test_an_evictor_nobody_knows_is_refused_as_invalid_and_nothing_is_registered(
        daemon: DaemonProcess) -> None:
    conn = Raw(daemon)
    conn.sendall(p.encode(p.REGISTER, seq=1, name="nb", evict="teleport"))
    reply = conn.read()
    assert (reply["code"], reply["seq"]) == (p.E_INVALID, 1), reply
    assert "evict must be one of" in reply["message"]
    with Client(socket_path=daemon.socket) as watcher:
        assert "nb" not in [c["name"] for c in watcher.status()["clients"]]


@pytest.mark.parametrize("line, code", [
    (b'{"op":"set_tq","tq":NaN}\n', p.E_MALFORMED),
    (b'{"op":"set_tq","tq":1e999}\n', p.E_MALFORMED),
    (b'{"op":"set_tq","tq":-3}\n', p.E_LIMIT),
    (b'{"op":"set_tq","tq":99999999}\n', p.E_LIMIT),
])
def test_a_tq_that_is_no_number_or_out_of_range_is_refused_and_others_are_served(
        daemon: DaemonProcess, line: bytes, code: str) -> None:
    with Client(daemon.socket, name="bystander") as bystander:
        bystander.acquire(timeout=5)
        conn = Raw(daemon)
        conn.sendall(line)
        assert conn.read()["code"] == code
        assert bystander.status()["tq"] == 0.2 and bystander.holding


def test_a_state_file_with_bad_values_is_ignored_field_by_field(start_daemon, scratch) -> None:
    state = scratch / "state.json"
    state.write_text('{"mode": "off", "tq": NaN, "gpu_tq": {"0": 1e999, "x": 3}}')
    daemon = start_daemon("--state-file", str(state))
    daemon.wait_log(r"Ignoring tq in state file .*got nan")
    daemon.wait_log(r"Ignoring gpu_tq\.0 in state file")
    daemon.wait_log(r"Ignoring gpu_tq\.x in state file")
    with Client(daemon.socket, name="k") as c:
        c.acquire(timeout=5)
        status = c.status()
    assert (status["mode"], status["tq"]) == ("off", 30.0)  # the good field is kept


def test_a_connection_that_never_says_hello_is_closed_at_the_deadline(start_daemon,
                                                                      scratch) -> None:
    daemon = start_daemon("--config", config(scratch, """
        connections: {hello_timeout: 0.3}
    """))
    silent = Raw(daemon, hello=False)
    reply = silent.read()
    assert reply["code"] == p.E_LIMIT and "hello" in reply["message"]
    assert silent.closed()
    daemon.wait_log(r"Closing connection \[FD=\d+\] of uid \d+: no hello within 0.3 s")


def test_an_unregistered_connection_is_closed_when_idle_and_a_registered_one_stays(
        start_daemon, scratch) -> None:
    daemon = start_daemon("--config", config(scratch, """
        connections: {idle_timeout: 0.5}
    """))
    kernel = registered_raw(daemon, "kernel")
    idle = Raw(daemon)
    reply = idle.read()
    assert reply["code"] == p.E_LIMIT and "idle" in reply["message"] and idle.closed()
    kernel.sendall(p.encode(p.PING, seq=2))
    assert kernel.read() == {"op": "pong", "seq": 2}


def test_per_uid_cap_makes_room_from_idle_connections_then_refuses_clearly(
        start_daemon, scratch) -> None:
    daemon = start_daemon("--config", config(scratch, """
        connections: {per_uid: 3}
    """))
    kernels = [registered_raw(daemon, f"k{i}") for i in range(2)]
    idle = Raw(daemon)
    newcomer = registered_raw(daemon, "newcomer")  # the idle one makes room
    reply = idle.read()
    assert reply["code"] == p.E_LIMIT and "make room" in reply["message"]
    refused = Raw(daemon, hello=False)
    reply = refused.read()
    assert reply["code"] == p.E_LIMIT and "per_uid" in reply["message"] and refused.closed()
    for conn in (*kernels, newcomer):
        conn.sendall(p.encode(p.PING, seq=9))
        assert conn.read() == {"op": "pong", "seq": 9}
    daemon.wait_log(r"Refused a connection from uid \d+: uid \d+ already has 3")


LIMITED = textwrap.dedent("""
    import resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[1])))
    from nodeside.daemon.main import main
    sys.exit(main(sys.argv[2:]))
""")


def idle_connections_do_not_lock_out_a_new_kernel(scratch: Path, daemon_fds: int,
                                                  idle: int) -> None:
    sock_path = str(scratch / "kiwi.sock")
    log = open(scratch / "daemon.log", "wb")  # noqa: SIM115
    daemon = subprocess.Popen(
        [sys.executable, "-c", LIMITED, str(daemon_fds), "--socket", sock_path,
         "--config", config(scratch, "connections: {hello_timeout: 600}\n")],
        stdout=log, stderr=log)
    log.close()
    opened: list[socket.socket] = []
    try:
        wait_for(lambda: socket_answers(sock_path), 15, what="the daemon to listen")
        for _ in range(idle):
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(sock_path)
            opened.append(conn)
        with Client(sock_path, name="new kernel", reconnect_timeout=60) as kernel:
            kernel.acquire(timeout=60)
            assert kernel.holding
        assert daemon.poll() is None
        assert "Traceback" not in (scratch / "daemon.log").read_text()
    finally:
        for conn in opened:
            conn.close()
        daemon.kill()
        daemon.wait()


def test_more_idle_connections_than_the_daemon_has_descriptors_do_not_lock_out_a_kernel(
        scratch: Path) -> None:
    idle_connections_do_not_lock_out_a_new_kernel(scratch, daemon_fds=512, idle=800)


def test_as_many_idle_connections_as_the_descriptor_limit_allows_do_not_lock_out_a_kernel(
        scratch: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    count = min(21_000, (soft if soft != resource.RLIM_INFINITY else 21_300) - 300)
    if count < 2_000:
        pytest.skip(f"only {soft} file descriptors for this test")
    idle_connections_do_not_lock_out_a_new_kernel(scratch, daemon_fds=count // 2, idle=count)


def test_a_peer_repeating_bad_requests_logs_one_line_and_no_traceback(
        daemon: DaemonProcess) -> None:
    conn = Raw(daemon)
    conn.sendall(b"".join(p.encode(p.ACQUIRE, seq=i) for i in range(300)))
    for _ in range(300):
        assert conn.read()["code"] == p.E_STATE
    conn.sendall(p.encode(p.PING, seq=1))
    assert conn.read()["op"] == p.PONG
    log = daemon.log()
    assert log.count("Refused a request from") == 1 and "Traceback" not in log


def test_requeue_and_position_events_over_the_socket(daemon: DaemonProcess) -> None:
    holder = registered_raw(daemon, "holder")
    first = registered_raw(daemon, "first")
    watcher = Raw(daemon, hello=False)
    watcher.sendall(p.encode(p.HELLO, version=p.VERSION, features=["position"]))
    assert watcher.read()["features"] == ["position"]
    watcher.sendall(p.encode(p.REGISTER, seq=1, name="watcher"))
    assert watcher.read()["op"] == p.REGISTERED
    holder.sendall(p.encode(p.ACQUIRE, seq=2))
    assert holder.read()["op"] == p.GRANT
    first.sendall(p.encode(p.ACQUIRE, seq=2))
    assert first.read()["position"] == 1
    watcher.sendall(p.encode(p.ACQUIRE, seq=2))
    assert watcher.read() == {"op": "waiting", "seq": 2, "position": 2}
    holder.sendall(p.encode(p.RELEASE, seq=3, requeue=True))
    reply = holder.read()
    assert reply == {"op": "waiting", "seq": 3, "position": 2}  # one reply, no "released"
    assert first.read()["op"] == p.GRANT
    assert watcher.read() == {"op": "waiting", "position": 1}  # an event: no seq


def test_each_bad_state_field_is_named_once(start_daemon, scratch) -> None:
    state = scratch / "state.json"
    state.write_text('{"tq": -1}')
    daemon = start_daemon("--state-file", str(state))
    daemon.wait_log(r"listening on")
    assert daemon.log().count("Ignoring tq in state file") == 1


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2) to read the backlog")
@pytest.mark.parametrize("setting, backlog", [("", 4096), ("connections: {backlog: 777}\n", 777)])
def test_the_socket_listens_with_a_backlog_for_a_busy_node(start_daemon, scratch, setting: str,
                                                           backlog: int) -> None:
    daemon = start_daemon("--config", config(scratch, setting or "tq: 30\n"))
    listening = subprocess.run(["ss", "-xln"], capture_output=True, text=True).stdout
    (row,) = [line.split() for line in listening.splitlines() if daemon.socket in line]
    assert int(row[3]) == min(backlog, int(Path("/proc/sys/net/core/somaxconn").read_text()))


@pytest.mark.parametrize("field", ["name", "pool", "display_name"])
def test_a_lone_surrogate_is_refused_where_it_is_read_and_status_and_metrics_stay_whole(
        start_daemon, field: str) -> None:
    daemon = start_daemon("--metrics-port", "0")
    conn = Raw(daemon)
    conn.sendall(b'{"op":"register","seq":1,"' + field.encode() + b'":"bad\\ud800"}\n')
    reply = conn.read()
    assert reply["code"] == p.E_MALFORMED
    assert "surrogate" in reply["message"] and field in reply["message"]
    assert conn.closed()
    with Client(daemon.socket, name="bystander") as bystander:
        bystander.acquire(timeout=10)
        shown = subprocess.run([sys.executable, "-m", "nodeside.ctl", "--socket", daemon.socket,
                                "status"], capture_output=True, text=True, timeout=30)
        assert shown.returncode == 0 and "bystander" in shown.stdout, shown.stderr
        url = daemon.wait_log(r"Serving Prometheus metrics on (\S+)").group(1)
        with urllib.request.urlopen(url, timeout=30) as scraped:
            assert b'client="bystander"' in scraped.read()
    log = daemon.log()
    assert log.count("surrogate") == 1 and "Traceback" not in log


def test_a_surrogate_pair_is_text_and_stays(daemon: DaemonProcess) -> None:
    conn = Raw(daemon)
    conn.sendall(b'{"op":"register","seq":1,"name":"snow \\ud83c\\udf28"}\n')
    assert conn.read()["op"] == p.REGISTERED
    with Client(daemon.socket, register=False) as viewer:
        assert "snow \U0001f328" in [c["name"] for c in viewer.status()["clients"]]
