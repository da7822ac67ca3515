"""The ``tiers`` feature against the real daemon on a real Unix socket, with Python client
sessions (``nodeside.protocol.client_session``) speaking it.

Kernels on a GPU with room for one, and a host budget with room for one evicted: the next
eviction waits while the evicted one spills (it reports its progress and ends with
``tier_moved``); the status document shows its tier, its disk and the node's budget. An
``intent`` from a connection of the kernel's uid brings it back to host memory at once, and on
to the GPU only once the holder's memory is gone; a name no client of the uid has is refused.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support import DaemonProcess, scaled

from nodeside import protocol as p
from nodeside.memory_words import waiting_for_words
from nodeside.protocol import events as ev
from nodeside.protocol.client_session import ClientSession

GiB = 1 << 30


class Kernel:
    """A client session on its own connection; what it reads waits in ``inbox``."""

    def __init__(self, daemon: DaemonProcess, name: str | None, working_set: int = 0,
                 features: tuple[str, ...] = (p.FEATURE_MEMORY, p.FEATURE_TIERS)) -> None:
        self.session = ClientSession(features=features)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(daemon.socket)
        self.inbox: list[ev.Event] = []
        self.session.working_set = working_set
        self.session.connect(None if name is None else {
            "name": name, "display_name": f"{name}.ipynb", "evict": "vmm", "resident": 0,
            "host": 0})
        self.ready = self.take(lambda e: isinstance(e, ev.Ready))

    def flush(self) -> None:
        self.sock.sendall(self.session.data_to_send())

    def take(self, wanted: Callable[[ev.Event], bool], timeout: float = 10.0) -> Any:
        """The first event ``wanted`` matches, read as it comes (what else came waits)."""
        self.flush()
        deadline = time.monotonic() + scaled(timeout)
        while True:
            for i, event in enumerate(self.inbox):
                if wanted(event):
                    return self.inbox.pop(i)
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"nothing wanted came; heard {self.inbox}")
            self.sock.settimeout(left)
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionResetError("closed")
            self.inbox += self.session.receive_data(data)
            self.flush()

    def reply(self, seq: int | None) -> dict[str, Any]:
        assert seq is not None
        event = self.take(lambda e: isinstance(e, ev.Reply) and e.seq == seq)
        return event.message

    def me(self) -> dict[str, Any]:
        seq = self.session.request(p.STATUS)
        status = self.reply(seq)["status"]
        return next(c for c in status["clients"] if c["id"] == self.session.client_id)

    def gpu(self) -> dict[str, Any]:
        return self.reply(self.session.request(p.STATUS))["status"]["gpus"][0]

    def close(self) -> None:
        self.sock.close()


def start(start_daemon, tmp_path: Path, settings: str) -> DaemonProcess:
    config = tmp_path / "kiwi.yaml"
    config.write_text("memory_reserve: 0\nevict_timeout: 30\n" + settings)
    return start_daemon("--tq", "30", "--grace", "30", "--gpus", "1", "--gpu-memory", "10GiB",
                        "--config", str(config))


@pytest.fixture
def budget8(start_daemon, tmp_path: Path) -> DaemonProcess:
    """One GPU of 10 GiB, a host budget of 8 GiB, nothing spilled for idling alone."""
    return start(start_daemon, tmp_path, "host_budget: 8GiB\nspill_after: 0\n")


@pytest.fixture
def spill_at_once(start_daemon, tmp_path: Path) -> DaemonProcess:
    """One GPU of 10 GiB; an evicted kernel is spilled as soon as the daemon's timer fires."""
    return start(start_daemon, tmp_path, "host_budget: 64GiB\nspill_after: 0.01\n")


def used(kernel: Kernel, nbytes: int) -> None:
    kernel.session.ask()
    kernel.take(lambda e: isinstance(e, ev.Granted))
    assert kernel.reply(kernel.session.report_working_set(nbytes, resident=nbytes, host=0,
                                                         pinned=0))["op"] == p.OK
    kernel.session.release()
    kernel.flush()


def evict(kernel: Kernel, nbytes: int) -> None:
    kernel.take(lambda e: isinstance(e, ev.EvictAsked))
    assert kernel.reply(kernel.session.evicted(resident=0, host=nbytes, moved=nbytes,
                                               seconds=0.1))["op"] == p.OK


def evicted_for_b(a: Kernel, b: Kernel) -> None:
    """a's 6 GiB moved to host memory for b, which used the GPU, says its 6 GiB and is idle."""
    used(a, 6 * GiB)
    b.session.ask()
    b.flush()
    evict(a, 6 * GiB)
    b.take(lambda e: isinstance(e, ev.Granted))
    assert b.reply(b.session.report_working_set(6 * GiB, resident=6 * GiB, host=0))["op"] \
        == p.OK
    b.session.release()
    b.flush()


def test_evictions_wait_for_a_spill_and_an_intent_brings_the_memory_back(budget8) -> None:
    a, b, c = (Kernel(budget8, name, 6 * GiB) for name in ("nbA", "nbB", "nbC"))
    assert a.ready.registered["pin_budget"] <= 8 * GiB  # its share of the host budget
    evicted_for_b(a, b)
    # c needs b's 6 GiB moved out; the budget has 2 GiB left: a is asked to spill first, and
    # b is asked to evict only once a's memory is on disk.
    c.session.ask()
    c.flush()
    spill = a.take(lambda e: isinstance(e, ev.SpillAsked))
    assert spill.nbytes is None and a.me()["tier"] == "moving"
    assert not [e for e in b.inbox if isinstance(e, ev.EvictAsked)]
    assert a.reply(a.session.report_working_set(6 * GiB, resident=0, host=3 * GiB,
                                                disk=3 * GiB))["op"] == p.OK
    assert a.reply(a.session.tier_moved("disk", host=0, disk=6 * GiB, moved=6 * GiB,
                                        seconds=0.5))["op"] == p.OK
    evict(b, 6 * GiB)
    c.take(lambda e: isinstance(e, ev.Granted))
    mine = a.me()
    assert (mine["tier"], mine["disk_bytes"], mine["host_bytes"], mine["tier_failed"]) == \
        ("disk", 6 * GiB, 0, None)
    gpu = c.gpu()
    assert (gpu["spill_bytes"], gpu["host_budget"]) == (6 * GiB, 8 * GiB)
    assert c.me()["tier"] == "gpu"
    assert c.reply(c.session.report_working_set(6 * GiB, resident=6 * GiB, host=0))["op"] \
        == p.OK

    # The Jupyter server, as the same uid: a cell of nbA is about to run.
    server = Kernel(budget8, None, features=(p.FEATURE_TIERS,))
    assert server.reply(server.session.intent("nbA"))["op"] == p.OK
    assert a.take(lambda e: isinstance(e, ev.FetchAsked)).tier == "host"
    refused = server.reply(server.session.intent("nobody"))
    assert (refused["op"], refused["code"]) == (p.ERROR, p.E_INVALID)
    # Back in host memory; c holds 6 of 10 GiB, so a's 6 wait: no fetch to the GPU, nobody
    # asked to evict, c keeps the GPU.
    assert a.reply(a.session.tier_moved("host", host=6 * GiB, disk=0, moved=6 * GiB,
                                        seconds=0.5))["op"] == p.OK
    assert not [e for e in a.inbox if isinstance(e, ev.FetchAsked)]
    assert not [e for e in c.inbox if isinstance(e, (ev.EvictAsked, ev.DropAsked))]
    assert c.me()["state"] == "holding"
    c.close()  # c's memory is gone: the intent waiting is acted on
    assert a.take(lambda e: isinstance(e, ev.FetchAsked)).tier == "gpu"


def test_a_kernel_whose_evictions_wait_for_a_spill_says_so(budget8) -> None:
    a, b, c = (Kernel(budget8, name, 6 * GiB) for name in ("nbA", "nbB", "nbC"))
    evicted_for_b(a, b)
    c.session.ask()
    c.flush()
    a.take(lambda e: isinstance(e, ev.SpillAsked))
    status = c.reply(c.session.request(p.STATUS))["status"]
    waiter = next(e for e in status["clients"] if e["id"] == c.session.client_id)
    assert waiter["waiting_for"] == {"client": a.session.client_id, "name": "nbA.ipynb",
                                     "bytes": 6 * GiB, "action": "spill"}
    assert waiting_for_words(waiter, status, viewer=waiter.get("user")) == \
        "waiting for nbA.ipynb to move 6.0 GiB to disk (the host memory budget is full)"


def test_a_failed_spill_is_shown_and_a_move_needs_the_feature(spill_at_once) -> None:
    a, b = Kernel(spill_at_once, "nbA", 6 * GiB), Kernel(spill_at_once, "nbB", 6 * GiB)
    plain = Kernel(spill_at_once, "nbC", 0, features=(p.FEATURE_MEMORY,))
    used(a, 6 * GiB)
    b.session.ask()
    b.flush()
    evict(a, 6 * GiB)
    a.take(lambda e: isinstance(e, ev.SpillAsked))  # idle past spill_after: the daemon's timer
    assert a.reply(a.session.tier_moved("host", host=6 * GiB, disk=0,
                                        failed="spill_dir: no space left"))["op"] == p.OK
    mine = a.me()
    assert (mine["tier"], mine["tier_failed"]) == ("host", "spill_dir: no space left")
    # Without the feature the request is refused, and the session does not even send it.
    assert plain.session.tier_moved("disk", host=0, disk=0) is None
    seq = plain.session.request(p.TIER_MOVED, tier="disk")
    assert plain.reply(seq)["code"] == p.E_STATE
