"""The waiting line follows the client's queue position and asks for the status document only
when something changed: the position, or the end of the holder's quantum. Against a daemon that
sends no position events it asks on every refresh, as it must."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support import DaemonProcess, wait_on_client

from kiwi_jupyter.kernel.wait_view import Place, WaitView, describe_wait
from nodeside import protocol as p
from nodeside.client import Client

Document = dict[str, Any]


@pytest.fixture
def calm(start_daemon: Callable[..., DaemonProcess]) -> DaemonProcess:
    """A daemon with a long quantum: the queue moves only when a test moves it."""
    return start_daemon("--tq", "30", "--grace", "30")


def document(position: int, quantum_remaining: float = 20.0) -> Document:
    return {
        "gpus": [{"index": 0, "holders": ["h"], "queue": ["x"] * position,
                  "quantum_remaining": quantum_remaining}],
        "clients": [
            {"id": "h", "name": "k-1", "display_name": "~/holder.ipynb", "user": "ada"},
            {"id": "me", "name": "k-2", "gpu": 0, "queue_position": position},
        ],
    }


class Counting:
    """A status source that counts how often it is asked."""

    def __init__(self, doc: Document) -> None:
        self.doc = doc
        self.asked = 0

    def __call__(self) -> Document:
        self.asked += 1
        return self.doc


def test_with_live_positions_the_status_is_asked_once_while_nothing_changes() -> None:
    status = Counting(document(2))
    view = WaitView(status, lambda: Place(2, live=True))
    texts = [view.text("me", waited) for waited in range(10)]
    assert status.asked == 1
    assert "position 2 of 2 in the queue" in texts[-1]
    assert "held by ~/holder.ipynb (ada)" in texts[-1]


def test_a_new_position_asks_again_and_shows_at_once() -> None:
    status = Counting(document(2))
    place = Place(2, live=True)
    view = WaitView(status, lambda: place)
    view.text("me", 1)
    place = Place(1, live=True)
    assert "position 1 of" in view.text("me", 2)
    assert status.asked == 2


def test_the_end_of_the_holders_quantum_asks_again() -> None:
    status = Counting(document(1, quantum_remaining=0.0))
    view = WaitView(status, lambda: Place(1, live=True))
    view.text("me", 1)
    view.text("me", 2)
    assert status.asked == 2


def test_without_position_events_every_look_asks() -> None:
    status = Counting(document(1))
    view = WaitView(status, lambda: Place(1, live=False))
    for waited in range(3):
        view.text("me", waited)
    assert status.asked == 3


def test_the_quantum_counts_down_between_two_documents() -> None:
    line = describe_wait(document(1, quantum_remaining=12.0), "me", 3, position=1, aged=2.0)
    assert "10 s left in its quantum" in line


def test_the_clients_own_position_wins_over_an_older_document() -> None:
    line = describe_wait(document(3), "me", 3, position=1)
    assert "position 1 of 3 in the queue" in line


def test_a_wait_refused_for_room_says_why_and_when_it_asks_again_without_a_document() -> None:
    status = Counting(document(1))
    why = "nbB needs 4.0 GiB on GPU 0 ... held by nbA (6.0 GiB, pinned allocations)"
    view = WaitView(status, lambda: Place(None, live=True, refused=why, retry_in=3.6))
    line = view.text("me", 12)
    assert line == ("kiwi: waiting for room on the GPU (12 s): the scheduler cannot make it "
                    f"now: {why} · asking again in 4 s")
    assert status.asked == 0


def test_a_waiting_line_over_a_real_daemon_asks_only_on_change(calm: DaemonProcess) -> None:
    with Client(calm.socket, name="holder") as holder, \
            Client(calm.socket, name="first") as first, \
            Client(calm.socket, name="me") as me:
        holder.acquire(timeout=5)
        wait_on_client(first, lambda: first.connected, what="the first connection")
        wait_on_client(me, lambda: me.connected, what="my connection")
        first.request()
        wait_on_client(first, lambda: first.position == 1, what="the first waiter in the queue")
        me.request()
        wait_on_client(me, lambda: me.position == 2,
                       what=f"my place in the queue (at {me.position})")
        live = p.FEATURE_POSITION in me.features
        view = WaitView(me.status, lambda: Place(me.position, live=live))
        assert "position 2 of 2" in view.text(me.id, 0)
        for waited in range(1, 5):
            view.text(me.id, waited)
        assert view.asked == (1 if live else 5)
        first.release()
        if live:
            wait_on_client(me, lambda: me.position == 1, what="the position event")
            assert "position 1 of 1" in view.text(me.id, 5)
            assert view.asked == 2
