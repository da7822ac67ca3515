"""A waiting client knows its queue position without asking for the status document, and a
holder gives the GPU back and asks again in one request. Real daemons on real sockets.

The daemon tells a waiter its position in the ``waiting`` reply; one that serves the
``position`` feature (the client asks for it in hello) also sends an event when it changes.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from support import DaemonProcess, wait_on_client

from nodeside import protocol as p
from nodeside.client import Client


@pytest.fixture
def calm(start_daemon: Callable[..., DaemonProcess]) -> DaemonProcess:
    """A daemon with a long quantum: the queue moves only when a test moves it."""
    return start_daemon("--tq", "30", "--grace", "30")


def queued(observer: Client, client: Client) -> int | None:
    row = next((c for c in observer.status()["clients"] if c["id"] == client.id), None)
    return None if row is None else row["queue_position"]


def test_a_waiting_client_knows_its_position_from_the_daemons_answer(
        calm: DaemonProcess) -> None:
    with Client(calm.socket, name="holder") as holder, \
            Client(calm.socket, name="first") as first, \
            Client(calm.socket, name="second") as second:
        holder.acquire(timeout=5)
        assert holder.position is None
        wait_on_client(first, lambda: first.connected, what="the first connection")
        wait_on_client(second, lambda: second.connected, what="the second connection")
        first.request()
        wait_on_client(first, lambda: first.position == 1, what="the first waiter's position")
        second.request()
        wait_on_client(second, lambda: second.position == 2, what="the second waiter's position")
        assert queued(holder, second) == 2  # the same as the status document says
        holder.release()
        assert first.wait_for_grant(timeout=5)
        assert first.position is None  # a holder has no place in the queue


def test_the_position_follows_the_queue_where_the_daemon_sends_events(
        calm: DaemonProcess) -> None:
    with Client(calm.socket, name="holder") as holder, \
            Client(calm.socket, name="first") as first, \
            Client(calm.socket, name="second") as second:
        holder.acquire(timeout=5)
        assert p.FEATURE_POSITION in holder.features
        wait_on_client(first, lambda: first.connected, what="the first connection")
        wait_on_client(second, lambda: second.connected, what="the second connection")
        first.request()
        wait_on_client(first, lambda: first.position == 1, what="the first waiter's position")
        second.request()
        wait_on_client(second, lambda: second.position == 2, what="the second waiter's position")
        first.release()  # withdraws: the second moves up without asking anything
        wait_on_client(second, lambda: second.position == 1, what="the position event")


def test_a_withdrawn_request_forgets_its_position(calm: DaemonProcess) -> None:
    with Client(calm.socket, name="holder") as holder, \
            Client(calm.socket, name="asker") as asker:
        holder.acquire(timeout=5)
        asker.request()
        wait_on_client(asker, lambda: asker.position == 1, what="the waiter's position")
        asker.release()
        assert asker.position is None


def test_a_timed_out_acquire_names_the_position_it_had(calm: DaemonProcess) -> None:
    with Client(calm.socket, name="holder") as holder, \
            Client(calm.socket, name="asker") as asker:
        holder.acquire(timeout=5)
        wait_on_client(asker, lambda: asker.connected, what="the connection")
        with pytest.raises(TimeoutError, match=r"queue position 1\)"):
            asker.acquire(timeout=1.0)


def test_requeue_gives_the_gpu_to_the_next_and_asks_again(calm: DaemonProcess) -> None:
    with Client(calm.socket, name="holder") as holder, \
            Client(calm.socket, name="waiter") as waiter:
        holder.acquire(timeout=5)
        waiter.request()
        wait_on_client(waiter, lambda: waiter.position == 1, what="the waiter in the queue")
        holder.requeue()
        assert waiter.wait_for_grant(timeout=5)
        wait_on_client(holder, lambda: holder.position == 1,
                       what="the requeued holder back in the queue")
        assert not holder.holding
        waiter.release()
        assert holder.wait_for_grant(timeout=5)


def test_requeue_alone_keeps_the_gpu(calm: DaemonProcess) -> None:
    with Client(calm.socket, name="alone") as alone:
        alone.acquire(timeout=5)
        alone.requeue()
        assert alone.wait_for_grant(timeout=5)
        assert alone.holding


def test_requeue_without_a_hold_is_a_request(calm: DaemonProcess) -> None:
    with Client(calm.socket, name="asker") as asker:
        wait_on_client(asker, lambda: asker.connected, what="the connection")
        asker.requeue()
        assert asker.wait_for_grant(timeout=5)
