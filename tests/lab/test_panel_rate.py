"""Open panels cost the daemon one read per change round, at a rate bounded by the document's
size (issue 34.7): a real server, a real daemon, a panel long-polling while the GPU changes
hands all the time."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

from support import DaemonProcess, scaled
from test_server_long_poll import long_poll, pushed_document

from kiwi_jupyter.server.watch import DOCUMENT_BYTES_PER_SECOND
from nodeside import protocol as p
from nodeside.client import Client


def crowd(daemon: DaemonProcess, count: int) -> list[socket.socket]:
    """Registered clients with long names and labels: a document of a few hundred KB."""
    labels = {f"label{i}": "v" * 200 for i in range(8)}
    out = []
    for i in range(count):
        conn = socket.socket(socket.AF_UNIX)
        conn.settimeout(10)
        conn.connect(daemon.socket)
        lines = conn.makefile("rb")
        conn.sendall(p.encode(p.HELLO, version=p.VERSION))
        lines.readline()
        conn.sendall(p.encode(p.REGISTER, seq=1, name=f"kernel-{i:03d}-" + "n" * 100,
                              labels=labels))
        assert json.loads(lines.readline())["op"] == p.REGISTERED
        out.append(conn)
    return out


async def test_a_panel_gets_a_large_document_at_a_rate_bounded_by_its_size(
        jp_fetch: Any, kiwi_daemon: DaemonProcess) -> None:
    others = crowd(kiwi_daemon, 100)
    first = await pushed_document(jp_fetch)
    size = len(json.dumps(first))
    assert size > 200_000
    stop = threading.Event()

    def churn() -> None:  # a change every few milliseconds, for as long as the panel watches
        with Client(kiwi_daemon.socket, name="churn") as kernel:
            while not stop.is_set():
                kernel.acquire(timeout=10)
                kernel.release()

    churning = threading.Thread(target=churn, daemon=True)
    churning.start()
    try:
        documents, tag = 0, first["etag"]
        started = time.monotonic()
        watched = scaled(3)
        while time.monotonic() - started < watched:
            document = await long_poll(jp_fetch, tag)
            tag = document["etag"]
            documents += 1
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        churning.join(10)
        for conn in others:
            conn.close()
    # Without the bound: ten documents a second, whatever their size.
    most = elapsed / (size / DOCUMENT_BYTES_PER_SECOND) + 2
    assert 1 <= documents <= most, (documents, most)
