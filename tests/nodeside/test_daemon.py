"""The daemon on a real Unix socket, with real client processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from support import DaemonProcess, client_state, scaled, wait_for_status

from nodeside import protocol as p
from nodeside.client import Client

HOLDER = textwrap.dedent("""
    import sys, time
    from nodeside.client import Client
    c = Client(name=sys.argv[1])
    c.acquire(timeout=20)
    print("holding", flush=True)
    time.sleep(600)
""")


class Raw:
    """A hand-driven connection, for saying what a well-behaved client never would."""

    def __init__(self, daemon: DaemonProcess, hello: bool = True) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(5)
        self.sock.connect(daemon.socket)
        self.lines = self.sock.makefile("rb")
        if hello:
            self.sendall(p.encode(p.HELLO, version=p.VERSION))
            assert self.read()["op"] == p.WELCOME

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read(self) -> dict:
        line = self.lines.readline()
        if not line:
            raise ConnectionResetError("closed")
        return json.loads(line)

    def closed(self) -> bool:
        try:
            return self.lines.readline() == b""
        except ConnectionResetError:
            return True


def raw(daemon: DaemonProcess, hello: bool = True) -> Raw:
    return Raw(daemon, hello)


def read(conn: Raw) -> dict:
    return conn.read()


def closed(conn: Raw) -> bool:
    return conn.closed()


def start_holder(daemon: DaemonProcess, name: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, name], env=daemon.env(),
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "holding"
    return proc


def test_two_clients_take_turns_by_quantum(daemon: DaemonProcess) -> None:
    with Client(daemon.socket, name="A") as a, Client(daemon.socket, name="B") as b:
        a.acquire(timeout=5)
        got = threading.Event()
        threading.Thread(target=lambda: (b.acquire(timeout=10), got.set()), daemon=True).start()
        assert a.drop_requested.wait(scaled(5)), "no drop request for A"
        assert not got.is_set()
        a.release()
        assert got.wait(5) and b.holding


def test_kill_9_of_the_holder_frees_the_gpu_for_the_next_waiter(daemon: DaemonProcess) -> None:
    holder = start_holder(daemon, "doomed")
    try:
        with Client(daemon.socket, name="next") as waiter:
            started = threading.Event()
            done = threading.Event()

            def wait() -> None:
                started.set()
                waiter.acquire(timeout=10)
                done.set()

            threading.Thread(target=wait, daemon=True).start()
            started.wait()
            wait_for_status(daemon.socket, lambda doc: client_state(doc, "next") == "waiting", 5,
                            what="the waiter queued")
            os.kill(holder.pid, signal.SIGKILL)
            assert done.wait(5), "the waiter was not granted after the holder died"
            daemon.wait_log(r"Client doomed \(c\d+\) went away while holding")
    finally:
        holder.kill()
        holder.wait()


def test_several_client_processes_are_served_in_turn(daemon: DaemonProcess) -> None:
    script = textwrap.dedent("""
        import sys, time
        from nodeside.client import Client
        with Client(name=sys.argv[1]) as c:
            for _ in range(3):
                c.acquire(timeout=30)
                print(sys.argv[1], time.monotonic(), flush=True)
                time.sleep(0.05)
                c.release()
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, f"p{i}"], env=daemon.env(),
                              stdout=subprocess.PIPE, text=True) for i in range(4)]
    outputs = [proc.communicate(timeout=60)[0] for proc in procs]
    assert all(proc.returncode == 0 for proc in procs)
    assert sum(len(out.split("\n")) - 1 for out in outputs) == 12


@pytest.mark.parametrize("garbage, code", [
    (b"this is not json\n", p.E_MALFORMED),
    (b'{"op":"teleport"}\n', p.E_UNKNOWN_OP),
    (b'{"op":"working_set","bytes":"many"}\n', p.E_MALFORMED),
    (b"x" * (p.MAX_REQUEST_BYTES + 10), p.E_TOO_LARGE),
])
def test_bad_message_closes_that_connection_only(daemon: DaemonProcess, garbage: bytes,
                                                 code: str) -> None:
    with Client(daemon.socket, name="bystander") as bystander:
        bystander.acquire(timeout=5)
        sock = raw(daemon)
        sock.sendall(garbage)
        reply = read(sock)
        assert reply["op"] == p.ERROR and reply["code"] == code
        assert closed(sock)
        assert bystander.holding and bystander.connected
        assert bystander.ping() < 1.0
        assert daemon.process.poll() is None


def test_request_before_hello_is_refused_with_version_error(daemon: DaemonProcess) -> None:
    sock = raw(daemon, hello=False)
    sock.sendall(p.encode(p.STATUS))
    assert read(sock)["code"] == p.E_VERSION
    assert closed(sock)


def test_other_protocol_version_is_refused(daemon: DaemonProcess) -> None:
    sock = raw(daemon, hello=False)
    sock.sendall(p.encode(p.HELLO, version=99))
    reply = read(sock)
    assert reply["code"] == p.E_VERSION and "version 1" in reply["message"]


def test_invalid_value_is_an_error_but_keeps_the_connection(daemon: DaemonProcess) -> None:
    sock = raw(daemon)
    sock.sendall(p.encode(p.SET_MODE, seq=4, mode="sideways"))
    reply = read(sock)
    assert (reply["code"], reply["seq"]) == (p.E_INVALID, 4)
    sock.sendall(p.encode(p.PING, seq=5))
    assert read(sock) == {"op": "pong", "seq": 5}


def test_holder_ignoring_a_drop_is_revoked_with_a_warning(start_daemon) -> None:
    daemon = start_daemon("--tq", "0.1", "--grace", "0.3")
    sock = raw(daemon)
    sock.sendall(p.encode(p.REGISTER, seq=1, name="stubborn"))
    assert read(sock)["op"] == p.REGISTERED
    sock.sendall(p.encode(p.ACQUIRE, seq=2))
    assert read(sock)["op"] == p.GRANT
    with Client(daemon.socket, name="patient") as waiter:
        waiter.acquire(timeout=5)  # granted once the stubborn holder is revoked
        assert read(sock)["op"] == p.DROP
        assert read(sock) == {"op": "revoked", "gpu": 0, "reason": "grace"}
    daemon.wait_log(r"\[WARN\] Revoked GPU 0 from stubborn")


def test_client_can_release_only_its_own_hold(daemon: DaemonProcess) -> None:
    with Client(daemon.socket, name="owner") as owner, \
            Client(daemon.socket, name="other") as other:
        owner.acquire(timeout=5)
        other.release()  # nothing of its own to give back
        sock = raw(daemon)
        sock.sendall(p.encode(p.RELEASE, seq=1))
        assert read(sock)["code"] == p.E_STATE
        holders = owner.status()["gpus"][0]["holders"]
        assert holders == [owner.id]


def test_socket_is_created_with_restrictive_permissions(daemon: DaemonProcess) -> None:
    mode = stat.S_IMODE(os.stat(daemon.socket).st_mode)
    assert mode == 0o660


def test_status_document_has_the_contract_keys(daemon: DaemonProcess) -> None:
    with Client(daemon.socket, name="k1", pool="default", priority="HIGH") as c:
        c.acquire(timeout=5)
        c.report_working_set(1 << 30)
        doc = c.status()
    assert {"version", "mode", "tq", "gpus", "clients", "pools"} <= set(doc)
    gpu = doc["gpus"][0]
    assert {"index", "name", "uuid", "memory_total", "memory_used", "holders", "queue",
            "quantum_remaining"} <= set(gpu)
    client = doc["clients"][0]
    assert client["name"] == "k1" and client["pid"] == os.getpid()
    assert client["state"] == "holding" and client["working_set"] == 1 << 30
    assert client["priority"] == "HIGH" and client["gpu_seconds"] >= 0
    assert {"name", "guarantee", "weight", "maximum", "share", "clients"} <= set(doc["pools"][0])


def test_pid_comes_from_the_socket_not_from_the_client(daemon: DaemonProcess) -> None:
    sock = raw(daemon)
    sock.sendall(p.encode(p.REGISTER, seq=1, name="liar", pid=1))
    client_id = read(sock)["client"]
    with Client(daemon.socket, register=False) as observer:
        entry = next(c for c in observer.status()["clients"] if c["id"] == client_id)
    assert entry["pid"] == os.getpid()


def test_sighup_reloads_the_config_without_dropping_clients(start_daemon, scratch) -> None:
    config = scratch / "kiwi.yaml"
    config.write_text("tq: 5\npools:\n  research: {guarantee: 0.5, weight: 1, maximum: -1}\n")
    daemon = start_daemon("--config", str(config))
    with Client(daemon.socket, name="stays") as c:
        c.acquire(timeout=5)
        config.write_text("tq: 5\npools:\n  research: {guarantee: 0.2, weight: 2, maximum: 1}\n")
        daemon.process.send_signal(signal.SIGHUP)
        daemon.wait_log(r"Config reloaded")
        pools = {p_["name"]: p_ for p_ in c.status()["pools"]}
        assert pools["research"]["guarantee"] == 0.2
        assert c.holding and c.status()["gpus"][0]["holders"] == [c.id]


def test_bad_config_on_reload_keeps_the_running_one(start_daemon, scratch) -> None:
    config = scratch / "kiwi.yaml"
    config.write_text("tq: 5\n")
    daemon = start_daemon("--config", str(config))
    config.write_text("tq: -3\n")
    daemon.process.send_signal(signal.SIGHUP)
    daemon.wait_log(r"\[ERROR\] Config reload failed.*tq")
    with Client(daemon.socket, register=False) as c:
        assert c.status()["tq"] == 5


def test_second_daemon_on_the_same_socket_refuses_to_start(daemon: DaemonProcess) -> None:
    result = subprocess.run([sys.executable, "-m", "nodeside.daemon", "--socket", daemon.socket],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert "already listening" in result.stderr


def test_stale_socket_file_is_replaced(scratch) -> None:
    path = scratch / "kiwi.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()
    daemon = DaemonProcess(scratch)
    try:
        daemon.start()
        with Client(daemon.socket, register=False) as c:
            assert c.status()["mode"] == "on"
    finally:
        daemon.kill()


def test_grant_latency_is_measured_in_the_status_only_as_wall_time(daemon: DaemonProcess) -> None:
    with Client(daemon.socket, name="timed") as c:
        c.acquire(timeout=5)
        time.sleep(0.3)
        c.release()
        seconds = next(x for x in c.status()["clients"] if x["id"] == c.id)["gpu_seconds"]
    # At least the time it held; no upper bound, which only a loaded machine's clock would
    # test (the exact figure: test_daemon_in_process.py, on virtual time, and the core's tests).
    assert seconds > 0.25


def test_the_start_line_names_each_gpu_so_one_gpu_numbered_0_does_not_read_as_none(
        start_daemon) -> None:
    daemon = start_daemon("--gpus", "2", "--gpu-memory", "16GiB")
    line = daemon.wait_log(r"listening on .*").group(0)
    assert "GPU 0 (logical GPU, 16.0 GiB), GPU 1 (logical GPU, 16.0 GiB)" in line
    assert "GPUs 0" not in line
