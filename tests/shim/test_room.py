"""When the daemon cannot make room (issue 40 N4a and Must-work 3): a wait it refuses with an
``error`` event of code ``room`` ends (the hold is idle again), the connection stays, and the
shim asks again later and later (client/room.c), says so once, and gives up after
``KIWI_ROOM_TIMEOUT``.

The shim's side runs against a daemon scripted on a real Unix socket (scripted_daemon.py), which
refuses every acquire while told to: what the shim sends, and when, is what is checked; and once
against the real daemon, whose refusal (and its log line, once a minute per client, tested in
tests/nodeside) the issue reproduced.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from scripted_daemon import ScriptedDaemon
from support import build_fake_nvml, scaled, wait_for, wait_for_status

from nodeside import protocol as p

GiB = 1 << 30
OUT_OF_MEMORY = 2
REFUSAL = ("nbB.ipynb needs 4.0 GiB on GPU 0, 2.0 GiB more than is free, and that room cannot "
           "be made: the memory is held by nbA.ipynb (6.0 GiB, pinned allocations)")


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[ScriptedDaemon]:
    scripted = ScriptedDaemon(tmp_path / "room.sock")
    scripted.refuse_room = REFUSAL
    yield scripted
    scripted.close()


def asked(daemon: ScriptedDaemon, n: int, timeout: float = 20.0) -> list[float]:
    """When the shim sent its acquires, once it has sent n of them."""
    daemon.wait_for(lambda _: len(daemon.timed("acquire")) >= n, timeout,
                    what=f"{n} acquires")
    return [at for at, _ in daemon.timed("acquire")]


def test_a_wait_refused_for_room_asks_again_later_and_later_on_the_same_connection(
        daemon, workload) -> None:
    w = workload(KIWI_SOCKET=str(daemon.path))
    launch = w.start("d.launch()")
    times = asked(daemon, 3)
    # Not a reconnect and a new registration per refusal (110,000 a minute, before): one
    # connection, and each ask waits twice as long as the one before (1 s, 2 s, ...).
    assert len(daemon.messages("hello")) == len(daemon.messages("register")) == 1
    assert times[1] - times[0] >= 0.95 and times[2] - times[1] >= 1.95
    assert not launch.done()
    # Between two asks: idle, and what it waits for (the kernel's waiting line shows it).
    stats = wait_for(lambda: (s := w.stats())["state"] == "idle" and s["room_refused"] and s,
                     interval=0.05, timeout=10, what="the stats to show the refusal")
    assert stats["room_refused"] == REFUSAL
    assert stats["room_refusals"] >= 3 and 0 <= stats["room_retry_in"] <= 4.0
    # Said once, whatever the number of refusals; the stats (and the kernel's waiting line,
    # updated in place) carry the rest.
    refused = w.said("cannot make room")
    assert len(refused) == 1 and REFUSAL in refused[0]
    daemon.refuse_room = None  # the room is there now: the next ask is granted
    assert launch.result(timeout=scaled(30)) == 0
    stats = w.stats()
    assert (stats["state"], stats["room_refused"], stats["room_last_refusal"]) == (
        "holding", None, None)


def test_the_backoff_outlasts_a_new_connection(daemon, workload) -> None:
    w = workload(KIWI_SOCKET=str(daemon.path))
    w.start("d.launch()")
    refused_at = asked(daemon, 2)[-1]
    wait_for(lambda: w.stats()["room_refusals"] == 2, interval=0.05,
             what="the second refusal read")  # refused twice: the next ask waits 2 s
    daemon.hang_up()
    daemon.wait_for(lambda _: len(daemon.messages("register")) == 2, what="a new registration")
    again = asked(daemon, 3)[-1]
    assert again - refused_at >= 1.95, "a new connection asked at once"


def test_a_wait_refused_past_its_room_timeout_fails_out_of_memory_and_says_why(
        daemon, workload) -> None:
    w = workload(KIWI_SOCKET=str(daemon.path), KIWI_ROOM_TIMEOUT="2")
    began = time.monotonic()
    assert w.call("d.launch()", timeout=30) == OUT_OF_MEMORY
    assert time.monotonic() - began >= 2.0
    gave_up = w.said("giving up on the GPU")
    assert len(gave_up) == 1 and REFUSAL in gave_up[0] and "KIWI_ROOM_TIMEOUT" in gave_up[0]
    # An eager acquire (a kernel's eager mode) gives up the same way, with the reason.
    error = w.call("repr(_err(lambda: shim.acquire(None)))", timeout=30)
    assert error.startswith("NoRoomError(") and REFUSAL in error, error


def test_a_kernel_the_real_daemon_refuses_room_registers_once_and_asks_a_few_times(
        start_daemon, workload, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's reproduction against the real daemon: beside an idle kernel whose eviction
    failed (its 6 GiB stay, and NVML vouches for them: a claim alone would stop counting), a
    shimmed kernel that needs 4 GiB of an 8 GiB GPU is refused. Before, it reconnected and
    registered again after every refusal (110,000 times a minute)."""
    nvml_memory = tmp_path / "nvml-memory"
    nvml_memory.write_text(f"{os.getpid()} {6 * GiB}\n")  # the idle kernel is this process
    monkeypatch.setenv("FAKE_NVML_MEMORY", str(nvml_memory))
    fake_nvml = build_fake_nvml(tmp_path)
    monkeypatch.setenv("LD_LIBRARY_PATH", f"{fake_nvml}:{os.environ.get('LD_LIBRARY_PATH', '')}")
    daemon = start_daemon("--gpus", "1", "--gpu-memory", "8GiB", "--tq", "60")
    daemon.wait_log(r"Found 1 GPU\(s\) through NVML")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as peer:
        peer.connect(daemon.socket)
        lines = peer.makefile("rb")

        def ask(op: str, **fields: object) -> dict:
            peer.sendall(p.encode(op, seq=1, **fields))
            return json.loads(lines.readline())

        assert ask(p.HELLO, version=p.VERSION, features=[p.FEATURE_MEMORY])["op"] == p.WELCOME
        assert ask(p.REGISTER, name="nbA", working_set=6 * GiB, resident=6 * GiB, host=0,
                   evict="vmm")["op"] == p.REGISTERED
        assert ask(p.EVICTED, failed="pinned allocations")["op"] == p.OK
        wait_for_status(daemon.socket, lambda doc: any(
            c["name"] == "nbA" and c["memory_source"] == "nvml" for c in doc["clients"]),
            timeout=20, what="NVML to vouch for the idle kernel's memory")
        w = workload(KIWI_SOCKET=daemon.socket, KIWI_EVICT="vmm", KIWI_ROOM_TIMEOUT="4",
                     FAKE_CUDA_DEVICE=str(tmp_path / "card"))
        w.call(f"d.alloc({4 * GiB})")
        began = time.monotonic()
        assert w.call("d.launch()", timeout=30) == OUT_OF_MEMORY  # after KIWI_ROOM_TIMEOUT
        waited = time.monotonic() - began
        log = daemon.log()
    assert log.count(f"(pid {w.process.pid},") == 1  # registered once: one connection
    assert len(w.said("cannot make room")) == 1 and "pinned allocations" in w.said(
        "cannot make room")[0]
    assert w.stats()["room_refusals"] <= 2 + waited / 2  # asked at 1 s, 2 s, 4 s... apart
    assert log.count("Refused python-") == 1  # and the daemon said so once
