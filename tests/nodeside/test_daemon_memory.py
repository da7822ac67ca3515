"""The ``memory`` feature against the real daemon on a real Unix socket, in raw protocol lines.

Two clients that page themselves (``vmm``) alternate on a GPU with room for one working set:
the second one's grant waits until the idle first has moved its memory out, asked by an
``evict`` event; an idle client that does not answer gets the waiter an ``error`` event with
code ``room``; the status document says where every client's memory is. A client that did not
ask for the feature speaks today's protocol.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
from support import DaemonProcess, build_fake_nvml, scaled, wait_for_status

from nodeside import protocol as p
from nodeside.daemon.hostmem import host_total

GiB = 1 << 30


class Line:
    """One client connection, driven line by line; events that come while a reply is awaited
    are kept for ``event``."""

    def __init__(self, daemon: DaemonProcess, name: str, working_set: int, *,
                 memory: bool = True, evict: str = "vmm", **register: object) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(scaled(10))
        self.sock.connect(daemon.socket)
        self.lines = self.sock.makefile("rb")
        self.seq = 0
        self.events: list[dict] = []
        welcome = self.request(p.HELLO, version=p.VERSION,
                               features=[p.FEATURE_MEMORY] if memory else [])
        assert welcome["op"] == p.WELCOME
        registered = self.request(p.REGISTER, name=name, display_name=f"{name}.ipynb",
                                  working_set=working_set, evict=evict, **register)
        self.id = registered.get("client")
        self.registered = registered

    def request(self, op: str, **fields: object) -> dict:
        self.seq += 1
        self.sock.sendall(p.encode(op, seq=self.seq, **fields))
        while True:
            message = self._read()
            if message.get("seq") == self.seq:
                return message
            self.events.append(message)

    def event(self) -> dict:
        """The next event (waits for it on the socket)."""
        return self.events.pop(0) if self.events else self._read()

    def _read(self) -> dict:
        line = self.lines.readline()
        if not line:
            raise ConnectionResetError("closed")
        return json.loads(line)

    def me(self) -> dict:
        status = self.request(p.STATUS)["status"]
        return next(c for c in status["clients"] if c["id"] == self.id)

    def gpu(self) -> dict:
        return self.request(p.STATUS)["status"]["gpus"][0]

    def close(self) -> None:
        self.lines.close()
        self.sock.close()


def config(tmp: Path, **settings: object) -> str:
    path = tmp / "kiwi.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in settings.items()))
    return str(path)


@pytest.fixture
def gpu10(start_daemon, tmp_path) -> DaemonProcess:
    """One GPU of 10 GiB, nothing kept in reserve, a long quantum and grace, and idle clients
    given 30 s to answer: only the test's requests move anything."""
    return start_daemon("--tq", "30", "--grace", "30", "--gpus", "1", "--gpu-memory", "10GiB",
                        "--config", config(tmp_path, memory_reserve=0, evict_timeout=30))


def used(client: Line, nbytes: int) -> None:
    """``client`` holds the GPU, fills ``nbytes`` and gives it back (its memory stays)."""
    assert client.request(p.ACQUIRE)["op"] == p.GRANT
    assert client.request(p.WORKING_SET, bytes=nbytes, resident=nbytes, host=0)["op"] == p.OK
    assert client.request(p.RELEASE)["op"] == p.RELEASED


def test_two_kernels_alternate_with_room_for_one_and_one_is_resident_at_a_time(gpu10) -> None:
    a, b = Line(gpu10, "nbA", 6 * GiB), Line(gpu10, "nbB", 6 * GiB)
    assert a.registered["evict"] == "vmm"
    used(a, 6 * GiB)
    assert b.request(p.ACQUIRE)["op"] == p.WAITING
    assert a.event() == {"op": p.EVICT, "gpu": 0, "bytes": 6 * GiB, "for": "nbB.ipynb"}
    waiting = b.me()
    assert waiting["state"] == "waiting"
    assert waiting["waiting_for"] == {"client": a.id, "name": "nbA.ipynb", "bytes": 6 * GiB,
                                      "action": "evict"}
    assert a.me()["residency"] == "evicting"
    # Half way out: 3 + 6 fits in 10, so the grant goes out while the rest moves.
    assert a.request(p.WORKING_SET, bytes=6 * GiB, resident=3 * GiB, host=3 * GiB)["op"] == p.OK
    assert b.event()["op"] == p.GRANT
    assert a.request(p.EVICTED, resident=0, host=6 * GiB, moved=6 * GiB, seconds=0.2)["op"] \
        == p.OK
    mine = a.me()
    assert (mine["residency"], mine["resident_bytes"], mine["host_bytes"]) == \
        ("evicted", 0, 6 * GiB)
    gpu = b.gpu()
    assert (gpu["resident_bytes"], gpu["capacity"], gpu["host_bytes"]) == \
        (6 * GiB, 10 * GiB, 6 * GiB)
    # The host memory evicted memory may take: what it holds plus what the host has available.
    assert isinstance(gpu["host_budget"], int) and gpu["host_budget"] > gpu["host_bytes"]
    # Back the other way: b gives the GPU up, a asks again and b is asked to move out.
    assert b.request(p.WORKING_SET, bytes=6 * GiB, resident=6 * GiB, host=0)["op"] == p.OK
    assert b.request(p.RELEASE)["op"] == p.RELEASED
    assert a.request(p.ACQUIRE)["op"] == p.WAITING
    assert b.event()["op"] == p.EVICT
    assert b.request(p.EVICTED, resident=0, host=6 * GiB, moved=6 * GiB, seconds=0.2)["op"] \
        == p.OK
    assert a.event()["op"] == p.GRANT
    assert a.me()["residency"] == "restoring"
    assert a.request(p.WORKING_SET, bytes=6 * GiB, resident=6 * GiB, host=0)["op"] == p.OK
    assert a.me()["residency"] == "resident" and b.me()["residency"] == "evicted"


def test_shadows_made_ahead_count_as_host_memory_that_evictions_have(gpu10) -> None:
    """The vmm evictor makes its host shadows while the kernel works: that host memory is
    spoken for already (the host's MemAvailable no longer counts it), so the budget counts it
    as held, once (evicted memory lives in those shadows), and an eviction into shadows that
    are there is not said to lack room; one that needs new host memory is."""
    # All the host has: more than MemAvailable, and no more than a figure the daemon shows
    # (issue 40, N3: host figures past what the host has are cut to it).
    shadows = host_total()
    assert shadows is not None
    a, b = Line(gpu10, "nbA", 6 * GiB), Line(gpu10, "nbB", 6 * GiB)
    assert a.request(p.ACQUIRE)["op"] == p.GRANT
    assert a.request(p.WORKING_SET, bytes=6 * GiB, evictable=6 * GiB, resident=6 * GiB, host=0,
                     shadow=shadows)["op"] == p.OK
    assert a.request(p.RELEASE)["op"] == p.RELEASED
    assert a.me()["shadow_bytes"] == shadows
    assert b.gpu()["host_budget"] >= shadows
    assert b.request(p.ACQUIRE)["op"] == p.WAITING
    assert a.event()["op"] == p.EVICT
    assert a.request(p.EVICTED, resident=0, host=6 * GiB, shadow=shadows, moved=6 * GiB,
                     seconds=0.1)["op"] == p.OK
    assert b.event()["op"] == p.GRANT
    gpu = b.gpu()
    assert (gpu["host_bytes"], a.me()["shadow_bytes"]) == (6 * GiB, shadows)
    assert shadows <= gpu["host_budget"] < 2 * shadows  # the evicted bytes are in the shadows
    # b has no shadows and more to evict than any host has: its eviction is said to lack room.
    assert b.request(p.WORKING_SET, bytes=6 * GiB, evictable=1 << 49, resident=6 * GiB, host=0,
                     shadow=0)["op"] == p.OK
    assert b.request(p.RELEASE)["op"] == p.RELEASED
    assert a.request(p.ACQUIRE)["op"] == p.WAITING
    assert b.event()["op"] == p.EVICT
    # The log names a client as every view does, with its user (nodeside.names.label).
    gpu10.wait_log(r"Asking nbB\.ipynb \(\S+\) to evict: no room in host memory")
    assert "Asking nbA to evict" not in gpu10.log()


def test_a_release_with_evicting_hands_over_once_enough_is_out(gpu10) -> None:
    a, b = Line(gpu10, "nbA", 6 * GiB), Line(gpu10, "nbB", 6 * GiB)
    assert a.request(p.ACQUIRE)["op"] == p.GRANT
    assert a.request(p.WORKING_SET, bytes=6 * GiB, resident=6 * GiB, host=0)["op"] == p.OK
    assert b.request(p.ACQUIRE)["op"] == p.WAITING
    released = a.request(p.RELEASE, evicting=True)
    assert (released["op"], released["evict"]) == (p.RELEASED, True)
    assert (a.me()["residency"], b.me()["state"]) == ("evicting", "waiting")
    assert a.request(p.WORKING_SET, bytes=6 * GiB, resident=2 * GiB, host=4 * GiB)["op"] == p.OK
    assert b.event()["op"] == p.GRANT


def idle_asked_to_evict(start_daemon, tmp_path) -> tuple[DaemonProcess, Line, Line]:
    """A daemon whose evict_timeout is 0.5 s, nbA idle with 6 GiB on a 10 GiB GPU, and nbB
    waiting for the room: nbA is being asked to evict."""
    daemon = start_daemon("--tq", "30", "--grace", "30", "--gpus", "1", "--gpu-memory",
                          "10GiB", "--config", config(tmp_path, memory_reserve=0,
                                                      evict_timeout=0.5))
    a, b = Line(daemon, "nbA", 6 * GiB), Line(daemon, "nbB", 6 * GiB)
    used(a, 6 * GiB)
    assert b.request(p.ACQUIRE)["op"] == p.WAITING
    return daemon, a, b


def test_an_idle_client_that_does_not_answer_stops_counting_and_the_waiter_is_granted(
        start_daemon, tmp_path) -> None:
    """Only its claim says it holds the memory (no NVML here): after evict_timeout without
    progress the claim stops counting, the log names it, and saying its figures again does not
    make the next waiter wait for it (issue 40, N1 and N4b)."""
    daemon, a, b = idle_asked_to_evict(start_daemon, tmp_path)
    assert a.event()["op"] == p.EVICT  # and a says nothing more
    assert b.event()["op"] == p.GRANT
    daemon.wait_log(r"nbA\.ipynb \(\w+\) \(c1\) did not begin to evict within 0\.5 s "
                    r"\(evict_timeout\); the "
                    r"6144 MiB only it says it holds no longer count")
    assert a.request(p.WORKING_SET, bytes=6 * GiB, resident=6 * GiB, host=0)["op"] == p.OK
    assert b.request(p.RELEASE)["op"] == p.RELEASED
    c = Line(daemon, "nbC", 6 * GiB)
    assert c.request(p.ACQUIRE)["op"] == p.GRANT
    assert a.me()["residency"] == "resident"


def test_a_way_outs_first_report_is_heard_though_its_figures_are_unchanged(
        start_daemon, tmp_path) -> None:
    """The shim reports as its way out starts, before a byte has moved: the same figures the
    daemon has. Damped as unchanged, the daemon went on thinking the way out never began, and
    a first chunk slower than evict_timeout had the process checkpointed mid-move; heard, the
    way out that stalls is only given up on (never checkpointed in the middle)."""
    daemon, a, b = idle_asked_to_evict(start_daemon, tmp_path)
    assert a.event()["op"] == p.EVICT
    assert a.request(p.WORKING_SET, bytes=6 * GiB, resident=6 * GiB, host=0)["op"] == p.OK
    assert b.event()["op"] == p.GRANT
    daemon.wait_log(r"nbA\.ipynb \(\w+\) \(c1\) made no progress evicting for 0\.5 s "
                    r"\(evict_timeout\)")
    assert "did not begin to evict" not in daemon.log()


def test_without_the_feature_the_protocol_is_todays(gpu10) -> None:
    old = Line(gpu10, "old", 6 * GiB, memory=False, evict="managed")
    assert "residency" not in old.me()
    refused = old.request(p.EVICTED, resident=0)
    assert (refused["op"], refused["code"]) == (p.ERROR, p.E_STATE)
    vmm = Line(gpu10, "vmm", 1 * GiB, memory=False)
    assert (vmm.registered["op"], vmm.registered["code"]) == (p.ERROR, p.E_INVALID)
    # An old client's idle memory is not counted: a newcomer is granted as before.
    used(old, 6 * GiB)
    new = Line(gpu10, "new", 6 * GiB)
    assert new.request(p.ACQUIRE)["op"] == p.GRANT


def test_nvml_counts_where_it_sees_more_than_the_client_reports(start_daemon, tmp_path,
                                                                monkeypatch) -> None:
    """The daemon reads each memory client's process in NVML (here a fake libnvidia-ml, the
    compute processes' used memory as the test writes it): where NVML sees more than the
    client says, the scheduler plans with NVML's figure and the status says so."""
    used_file = tmp_path / "nvml-memory"
    monkeypatch.setenv("FAKE_NVML_MEMORY", str(used_file))
    fake = build_fake_nvml(tmp_path)
    monkeypatch.setenv("LD_LIBRARY_PATH", f"{fake}:{os.environ.get('LD_LIBRARY_PATH', '')}")
    daemon = start_daemon("--tq", "30", "--grace", "30", "--gpus", "1", "--gpu-memory", "8GiB",
                          "--config", config(tmp_path, memory_reserve=0, evict_timeout=30))
    daemon.wait_log(r"Found 1 GPU\(s\) through NVML")
    a = Line(daemon, "nbA", 1 * GiB)
    used(a, 1 * GiB)
    assert (a.me()["memory_source"], a.me()["resident_bytes"]) == ("shim", 1 * GiB)
    # This process (the test's: the clients are its sockets) holds 3 GiB as NVML counts it.
    used_file.write_text(f"{os.getpid()} {3 * GiB}\n")
    wait_for_status(daemon.socket, lambda doc: any(
        c["id"] == a.id and c["memory_source"] == "nvml" for c in doc["clients"]),
        timeout=scaled(20), what="NVML's larger figure to count")
    # A newcomer of 6 GiB now needs a's memory out (1 + 6 fit in 8; 3 + 6 do not).
    b = Line(daemon, "nbB", 6 * GiB)
    assert b.request(p.ACQUIRE)["op"] == p.WAITING
    assert a.event() == {"op": p.EVICT, "gpu": 0, "bytes": 3 * GiB, "for": "nbB.ipynb"}


def test_a_memory_client_hears_the_configured_pin_budget_in_registered(start_daemon,
                                                                     tmp_path) -> None:
    daemon = start_daemon("--gpus", "1", "--gpu-memory", "10GiB",
                          "--config", config(tmp_path, pin_budget="6GiB"))
    memory, plain = Line(daemon, "a", GiB), Line(daemon, "b", GiB, memory=False, evict="managed")
    try:
        assert memory.registered["pin_budget"] == 6 * GiB
        assert "pin_budget" not in plain.registered  # not a word of the feature's to it
    finally:
        memory.close()
        plain.close()


def test_without_a_configured_pin_budget_the_client_keeps_its_own(gpu10) -> None:
    client = Line(gpu10, "a", GiB)
    try:
        assert "pin_budget" not in client.registered
    finally:
        client.close()
