"""Memory claims are evidence, and a waiter for room never blocks the queue (issue 40: N4b, N1,
N1c, N2, N5b), as attacks on the real daemon on a real Unix socket.

The attackers speak raw protocol lines. Where NVML must tell their process from the test's, the
attacker is a process of its own (``Claimer``), and the daemon reads a fake libnvidia-ml whose
per-process figures the test writes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support import DaemonProcess, build_fake_nvml, scaled, wait_for_status
from test_daemon_memory import Line, config, used

from nodeside import protocol as p
from nodeside.client import Client
from nodeside.daemon.hostmem import host_total

GiB = 1 << 30

#: A client in a process of its own: hello with ``memory``, register, hold the GPU once and say
#: it keeps ``resident`` bytes on it, then print every line the daemon sends, and send each
#: line the test writes to its stdin.
CLAIMER = r"""
import json, socket, sys, threading
path, name, resident = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = socket.socket(socket.AF_UNIX)
s.connect(path)
lines = s.makefile("rb")
def send(**message):
    s.sendall(json.dumps(message).encode() + b"\n")
def reply():
    while True:
        message = json.loads(lines.readline())
        if "seq" in message:
            return message
        print(json.dumps(message), flush=True)
send(op="hello", version=1, features=["memory"], seq=1); reply()
send(op="register", name=name, display_name=name, working_set=resident, evict="vmm", seq=2)
print(json.dumps(reply()), flush=True)
send(op="acquire", seq=3); reply()
send(op="working_set", bytes=resident, resident=resident, host=0, seq=4); reply()
send(op="release", seq=5); reply()
print(json.dumps({"op": "ready"}), flush=True)
def relay():
    for line in sys.stdin:
        s.sendall(line.encode())
threading.Thread(target=relay, daemon=True).start()
for line in lines:
    print(line.decode().strip(), flush=True)
"""


class Claimer:
    """A memory client in a process of its own (its own pid, for NVML to tell apart)."""

    def __init__(self, daemon: DaemonProcess, name: str, resident: int) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", CLAIMER, daemon.socket, name,
                                         str(resident)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        self.pid = self.process.pid
        registered = self.read()
        self.id = registered["client"]
        assert self.read() == {"op": "ready"}

    def read(self) -> dict:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, "the claimer's connection closed"
        return json.loads(line)

    def send(self, **message: object) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def close(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture
def claimers():
    made: list[Claimer] = []

    def make(daemon: DaemonProcess, name: str, resident: int) -> Claimer:
        made.append(Claimer(daemon, name, resident))
        return made[-1]

    yield make
    for claimer in made:
        claimer.close()


@pytest.fixture
def nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fake NVML's per-process memory file (``<pid> <bytes>`` lines): the daemon started
    after this reads it."""
    figures = tmp_path / "nvml-memory"
    figures.write_text("")
    monkeypatch.setenv("FAKE_NVML_MEMORY", str(figures))
    fake = build_fake_nvml(tmp_path)
    monkeypatch.setenv("LD_LIBRARY_PATH", f"{fake}:{os.environ.get('LD_LIBRARY_PATH', '')}")
    return figures


def daemon_on(start_daemon, tmp_path: Path, memory: str, **settings: object) -> DaemonProcess:
    settings.setdefault("memory_reserve", 0)
    return start_daemon("--tq", "30", "--grace", "30", "--gpus", "1", "--gpu-memory", memory,
                        "--config", config(tmp_path, **settings))


def state_of(daemon: DaemonProcess, client_id: str) -> str:
    with Client(daemon.socket, name="look") as look:
        return next(c["state"] for c in look.status()["clients"] if c["id"] == client_id)


# -- N4b: a waiter for room never blocks the queue ---------------------------------------------

def test_a_plain_client_is_granted_while_a_waiter_waits_for_an_idle_client_that_never_answers(
        start_daemon, tmp_path) -> None:
    daemon = daemon_on(start_daemon, tmp_path, "16GiB", evict_timeout=60)
    liar = Line(daemon, "liar", 12 * GiB)
    used(liar, 12 * GiB)
    waiter = Line(daemon, "second", 6 * GiB)  # the liar's own second connection
    assert waiter.request(p.ACQUIRE)["op"] == p.WAITING
    assert liar.event()["op"] == p.EVICT
    # A root client that needs no room: granted now, again and again, whatever the liar does.
    with Client(daemon.socket, name="root") as root:
        for _ in range(3):
            assert liar.request(p.WORKING_SET, bytes=12 * GiB, resident=12 * GiB,
                                host=0)["op"] == p.OK
            root.acquire(timeout=scaled(10))
            assert state_of(daemon, waiter.id) == "waiting"
            root.release()
    # The wait ends once: the liar's failure is its last word on it.
    assert liar.request(p.EVICTED, failed="no")["op"] == p.OK
    assert waiter.event()["op"] == p.GRANT


# -- N1: claims are evidence -------------------------------------------------------------------

def test_a_claim_nvml_shows_no_memory_for_keeps_nobody_waiting(start_daemon, tmp_path, nvml,
                                                               claimers) -> None:
    nvml.write_text(f"{os.getpid()} 0\n")
    daemon = daemon_on(start_daemon, tmp_path, "16GiB", evict_timeout=60)
    daemon.wait_log(r"Found 1 GPU\(s\) through NVML")
    liar = claimers(daemon, "liar", 12 * GiB)
    nvml.write_text(f"{os.getpid()} 0\n{liar.pid} 0\n")
    wait_for_status(daemon.socket, lambda doc: any(
        c["id"] == liar.id and c["memory_source"] == "nvml" and c["resident_bytes"] == 0
        for c in doc["clients"]), timeout=scaled(20), what="NVML's figure for the liar")
    waiter = Line(daemon, "nb", 6 * GiB)
    assert waiter.request(p.ACQUIRE)["op"] == p.GRANT


def test_a_resident_claim_larger_than_the_gpu_is_refused(start_daemon, tmp_path) -> None:
    daemon = daemon_on(start_daemon, tmp_path, "16GiB")
    liar = Line(daemon, "liar", GiB)
    used(liar, GiB)
    refused = liar.request(p.WORKING_SET, bytes=GiB, resident=1 << 50, host=0)
    assert (refused["op"], refused["code"]) == (p.ERROR, p.E_INVALID)
    assert "more than GPU 0 has" in refused["message"]
    assert liar.me()["resident_bytes"] == GiB


def test_a_registration_that_claims_more_than_the_gpu_is_refused_whole(start_daemon,
                                                                       tmp_path) -> None:
    daemon = daemon_on(start_daemon, tmp_path, "16GiB")
    liar = Line(daemon, "liar", GiB, resident=1 << 50)
    assert (liar.registered["op"], liar.registered["code"]) == (p.ERROR, p.E_INVALID)
    with Client(daemon.socket, name="look") as look:
        assert [c["name"] for c in look.status()["clients"]] == ["look"]


# -- N1c: what NVML still shows after "evicted" counts ------------------------------------------

def test_memory_nvml_still_shows_after_evicted_is_not_granted_to_the_next_kernel(
        start_daemon, tmp_path, nvml, claimers) -> None:
    nvml.write_text(f"{os.getpid()} 0\n")
    daemon = daemon_on(start_daemon, tmp_path, "8GiB", evict_timeout=60)
    daemon.wait_log(r"Found 1 GPU\(s\) through NVML")
    keeper = claimers(daemon, "keeper", 6 * GiB)
    keeper.send(op="evicted", resident=0, host=6 * GiB, moved=6 * GiB, seconds=1.0, seq=9)
    assert keeper.read()["op"] == p.OK
    nvml.write_text(f"{os.getpid()} 0\n{keeper.pid} {6 * GiB}\n")
    wait_for_status(daemon.socket, lambda doc: any(
        c["id"] == keeper.id and c["resident_bytes"] == 6 * GiB for c in doc["clients"]),
        timeout=scaled(20), what="NVML's figure for the keeper")
    waiter = Line(daemon, "nb", 4 * GiB)
    refused = waiter.request(p.ACQUIRE)
    if refused["op"] == p.WAITING:
        refused = waiter.event()
    assert (refused["op"], refused.get("code")) == (p.ERROR, p.E_ROOM)
    assert "keeper (6.0 GiB" in refused["message"]
    gpu = waiter.gpu()
    assert gpu["resident_bytes"] <= gpu["capacity"]


# -- N2 and N5b: memory reports metered and damped ----------------------------------------------

def test_a_flood_of_memory_reports_is_answered_and_heard_at_most_every_50_ms(
        start_daemon, tmp_path) -> None:
    daemon = daemon_on(start_daemon, tmp_path, "16GiB")
    flooder = Line(daemon, "flood", GiB)
    used(flooder, GiB)
    # 2,000 reports in one write, each a different figure: every one is answered...
    lines = b"".join(p.encode(p.WORKING_SET, seq=100 + i, bytes=GiB, resident=GiB + i * 4096,
                              host=0) for i in range(2000))
    flooder.sock.sendall(lines)
    for i in range(2000):
        assert json.loads(flooder.lines.readline())["seq"] == 100 + i
    # ... and the last one is what the scheduler has once the meter lets it through.
    wait_for_status(daemon.socket, lambda doc: any(
        c["id"] == flooder.id and c["resident_bytes"] == GiB + 1999 * 4096
        for c in doc["clients"]), timeout=scaled(10), what="the last report to be heard")


def test_an_idle_client_flipping_its_resident_figure_does_not_make_holders_evict(
        start_daemon, tmp_path) -> None:
    """N5b: two kernels whose working sets fit together hand the GPU to each other; a client
    that never holds says 16 GiB and 0 in turn. Its rises never hold, so no handoff tells the
    leaver to move its memory out (before: each handoff while it said 16 did)."""
    daemon = daemon_on(start_daemon, tmp_path, "20GiB", evict_timeout=60)
    flipper = Line(daemon, "flipper", GiB)
    a, b = Line(daemon, "nbA", 4 * GiB), Line(daemon, "nbB", 4 * GiB)
    stop = threading.Event()

    def flip() -> None:
        high = False
        while not stop.is_set():
            flipper.request(p.WORKING_SET, bytes=GiB, resident=16 * GiB if high else 0, host=0)
            high = not high

    flipping = threading.Thread(target=flip, daemon=True)
    flipping.start()
    evicts = []
    try:
        assert a.request(p.ACQUIRE)["op"] == p.GRANT
        leaver, next_one = a, b
        for _ in range(20):  # 4 + 4 fit in 20; with 16 beside them they would not
            assert next_one.request(p.ACQUIRE)["op"] == p.WAITING
            released = leaver.request(p.RELEASE)
            evicts.append(released["evict"])
            assert next_one.event()["op"] == p.GRANT
            leaver, next_one = next_one, leaver
    finally:
        stop.set()
        flipping.join(scaled(10))
    assert not any(evicts)


# -- N3: figures people read are the daemon's ------------------------------------------------------

def test_host_figures_past_what_the_host_has_are_shown_cut_to_it(start_daemon, tmp_path) -> None:
    total = host_total()
    assert total is not None
    daemon = daemon_on(start_daemon, tmp_path, "16GiB")
    claimers = [Line(daemon, f"nb{i}", GiB) for i in range(3)]
    for line in claimers:
        used(line, GiB)
        assert line.request(p.WORKING_SET, bytes=GiB, resident=GiB, host=1 << 50,
                            shadow=1 << 50)["op"] == p.OK
    with Client(daemon.socket, name="look") as look:
        status = look.status()
    [gpu] = status["gpus"]
    assert gpu["host_bytes"] <= total and gpu["host_budget"] <= total
    for entry in status["clients"]:
        if entry["name"].startswith("nb"):
            assert entry["host_bytes"] <= total and entry["shadow_bytes"] <= total
