"""The Python client speaking the ``memory`` feature for memory it moves itself (``pages``),
against a real daemon that plans with a GPU of 100 MiB."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from support import DaemonProcess, scaled, wait_for_status

from nodeside.client import Client
from nodeside.client.memory import MemoryFigures

MiB = 1024 * 1024


class Pages:
    """Memory that moves when asked, in two steps, reporting between them."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.resident = nbytes
        self.client: Client | None = None
        self.asked: list[tuple[int, str]] = []
        self.moved = threading.Event()

    def figures(self) -> MemoryFigures:
        return MemoryFigures(self.nbytes, self.resident, self.nbytes - self.resident)

    def evict_asked(self, nbytes: int, for_name: str) -> None:
        assert self.client is not None
        self.asked.append((nbytes, for_name))
        started = time.monotonic()
        self.resident = self.nbytes // 2
        self.client.report_memory()
        self.resident = 0
        self.client.evicted(moved=self.nbytes, seconds=time.monotonic() - started)
        self.moved.set()


@pytest.fixture
def daemon(start_daemon: Callable[..., DaemonProcess]) -> DaemonProcess:
    return start_daemon("--tq", "60", "--gpu-memory", "100MiB")


def paging_client(daemon: DaemonProcess, name: str, nbytes: int) -> tuple[Client, Pages]:
    pages = Pages(nbytes)
    client = Client(daemon.socket, name=name, pages=pages)
    pages.client = client
    return client, pages


def entry(document: dict, name: str) -> dict:
    return next(c for c in document["clients"] if c["name"] == name)


def test_its_register_says_where_its_memory_is(daemon: DaemonProcess) -> None:
    client, _ = paging_client(daemon, "a", 60 * MiB)
    with client:
        client.acquire(timeout=scaled(10))
        mine = entry(client.status(), "a")
        assert (mine["residency"], mine["resident_bytes"], mine["working_set"]) == \
            ("resident", 60 * MiB, 60 * MiB)


def test_an_idle_client_moves_out_when_anothers_grant_needs_the_room(
        daemon: DaemonProcess) -> None:
    a, a_pages = paging_client(daemon, "a", 60 * MiB)
    b, _ = paging_client(daemon, "b", 60 * MiB)
    with a, b:
        a.acquire(timeout=scaled(10))
        a.release()
        b.acquire(timeout=scaled(10))  # granted once enough of a's memory left the GPU
        assert a_pages.moved.wait(scaled(10))
        assert a_pages.asked == [(60 * MiB, "b")]
        moved = entry(b.status(), "a")
        assert (moved["residency"], moved["resident_bytes"], moved["host_bytes"]) == \
            ("evicted", 0, 60 * MiB)


def test_a_holder_dropped_with_evict_gives_back_while_its_memory_moves_out(
        start_daemon: Callable[..., DaemonProcess]) -> None:
    daemon = start_daemon("--tq", "0.5", "--grace", "60", "--gpu-memory", "100MiB")
    a, a_pages = paging_client(daemon, "a", 60 * MiB)
    b, _ = paging_client(daemon, "b", 60 * MiB)
    with a, b:
        a.acquire(timeout=scaled(10))
        b.request()
        assert a.drop_requested.wait(scaled(10))  # the quantum ends with b waiting
        assert a.last_drop is not None and a.last_drop["evict"] is True
        a.release_evicting()
        wait_for_status(daemon.socket, lambda d: entry(d, "a")["residency"] == "evicting",
                        what="a's memory moving out")
        assert not b.holding  # the room is not there yet
        a_pages.resident = 0
        a.evicted(moved=60 * MiB, seconds=0.1)
        assert b.wait_for_grant(scaled(10))


def test_a_grant_brings_an_evicted_client_back_once_it_reports_nothing_in_host_memory(
        daemon: DaemonProcess) -> None:
    a, a_pages = paging_client(daemon, "a", 60 * MiB)
    b, _ = paging_client(daemon, "b", 60 * MiB)
    with a, b:
        a.acquire(timeout=scaled(10))
        a.release()
        b.acquire(timeout=scaled(10))
        b.release()
        a.acquire(timeout=scaled(10))
        assert entry(a.status(), "a")["residency"] == "restoring"
        a_pages.resident = a_pages.nbytes
        a.report_memory()
        # Reports are metered (at most one per 50 ms per client reaches the scheduler).
        wait_for_status(daemon.socket, lambda d: entry(d, "a")["residency"] == "resident",
                        what="a's restore to end")
