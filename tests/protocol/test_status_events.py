"""``support.StatusEvents``: tests wait for what the status document shows on the daemon's own
``changed`` events, over one connection, instead of polling."""

from __future__ import annotations

import pytest
from support import DaemonProcess, StatusEvents, client_state

from nodeside.client import Client


def test_it_wakes_on_the_change_it_waits_for(daemon: DaemonProcess) -> None:
    with StatusEvents(daemon.socket) as watch:
        assert watch.status()["clients"] == []
        with Client(daemon.socket, name="late") as late:
            late.request()
            assert watch.wait_for(lambda doc: client_state(doc, "late") == "holding",
                                  what="the grant")
        assert watch.changes >= 1  # it read the document again because the daemon said so


def test_it_fails_with_what_it_waited_for_and_the_last_document(daemon: DaemonProcess) -> None:
    with StatusEvents(daemon.socket) as watch, \
            pytest.raises(AssertionError, match=r"waiting for nobody's grant; the last document"):
        watch.wait_for(lambda doc: client_state(doc, "nobody") == "holding", timeout=0.3,
                       what="nobody's grant")
