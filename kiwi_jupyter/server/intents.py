"""Restore on intent: the server tells the daemon that a kernel is about to work, before it does.

Two moments say so. A cell's ``execute_request`` passes through this server on its way from the
browser to the kernel: the kernel's websocket connection (jupyter_server's
``kernel_websocket_connection_class``, whichever class the server is configured with, in both
of its wire formats) sends the hint as it forwards the message, so the daemon starts bringing
the kernel's memory back while the message is still on its way. And the panel says when a
notebook is brought to the front (``POST kiwi/api/intent``, ``IntentHandler``).

A hint never waits for the daemon (``ServerDaemonLink.hint`` queues it and returns) and never stops
the message: whatever goes wrong here, the kernel gets its cell as before. Messages that do not
pass through the server's websocket (a server-side execution extension talking to the kernel's
ZMQ sockets itself) bring no hint: their kernels restore when their first GPU call asks.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

from kiwi_jupyter.server.link import ServerDaemonLink

log = logging.getLogger("kiwi_jupyter")

#: The ``intent`` request's reasons (docs/protocol.md).
EXECUTE = "execute"
FRONT = "front"
#: Seconds between two ``front`` hints for one kernel at least: a user flipping tabs.
FRONT_INTERVAL = 1.0
#: Kernels whose last ``front`` hint is remembered at most (the oldest are forgotten first).
FRONT_REMEMBERED = 1024
#: The websocket subprotocol whose messages are binary frames with the header apart.
_V1 = "v1.kernel.websocket.jupyter.org"


class FrontHints:
    """``front`` hints for ``ServerDaemonLink.hint``, at most one a ``FRONT_INTERVAL`` per
    kernel."""

    def __init__(self, link: ServerDaemonLink, *, interval: float = FRONT_INTERVAL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._link = link
        self._interval = interval
        self._clock = clock
        self._last: dict[str, float] = {}

    def hint(self, kernel_id: str) -> bool:
        """Hint that ``kernel_id`` came to the front; False when it did within the interval
        (or the link dropped the hint)."""
        now = self._clock()
        last = self._last.get(kernel_id)
        if last is not None and now - last < self._interval:
            return False
        self._last.pop(kernel_id, None)
        self._last[kernel_id] = now  # last in the dict's order: the newest
        while len(self._last) > FRONT_REMEMBERED:
            del self._last[next(iter(self._last))]
        return self._link.hint(kernel_id, FRONT)


def execute_request_in(connection: Any, message: Any) -> bool:
    """Whether a message from the browser, as the websocket received it, is a cell's
    ``execute_request`` on the shell channel. Reads no more than it must: the header only."""
    if connection.subprotocol == _V1:
        if not isinstance(message, (bytes, bytearray, memoryview)):
            return False
        from jupyter_server.services.kernels.connection.base import (
            deserialize_msg_from_ws_v1,
        )
        channel, parts = deserialize_msg_from_ws_v1(message)
        if channel != "shell" or not parts:
            return False
        header = json.loads(bytes(parts[0]))
    else:
        if not isinstance(message, str) or "execute_request" not in message:
            return False  # the cheap test first: most messages are no cell
        parsed = json.loads(message)
        if parsed.get("channel", "shell") != "shell":
            return False
        header = parsed.get("header")
    return isinstance(header, dict) and header.get("msg_type") == "execute_request"


class HintOnExecute:
    """Mixed into the server's kernel websocket connection class: an ``execute_request`` from
    the browser sends an ``execute`` hint just before it goes on to the kernel."""

    #: Set on the class ``hinting`` makes.
    kiwi_link: ServerDaemonLink

    def handle_incoming_message(self, incoming_msg: Any) -> None:
        try:
            if execute_request_in(self, incoming_msg):
                self.kiwi_link.hint(self.kernel_id, EXECUTE)  # type: ignore[attr-defined]
        except Exception as exc:  # noqa: BLE001 - the cell must go on whatever a hint does
            log.debug("Kiwi: no hint for a message: %s: %s", type(exc).__name__, exc)
        super().handle_incoming_message(incoming_msg)  # type: ignore[misc]


def hinting(connection_class: type, link: ServerDaemonLink) -> type:
    """The server's kernel websocket connection class, hinting on each cell it forwards."""
    if issubclass(connection_class, HintOnExecute):
        return connection_class
    return type(f"Hinting{connection_class.__name__}", (HintOnExecute, connection_class),
                {"kiwi_link": link, "__module__": __name__})
