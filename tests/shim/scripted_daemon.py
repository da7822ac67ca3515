"""A daemon scripted on a real Unix socket, for the shim's side of a protocol the real daemon
does not speak yet (the hello feature ``memory``, MEMORY-PROTOCOL.md), or no longer speaks (a
daemon that predates a feature).

It answers what a client asks the way the daemon does (welcome with the features it serves of
those asked, registered with the evictor asked for, a grant to every acquire, or a refusal for
room when told, released to every release, ok to the rest), records every line with the time it
came, and sends whatever a test tells it to. One client at a time: what it sends goes to the
connection that registered last; other connections (a kernel's own status link) are answered
and recorded alike.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from support import scaled

Message = dict[str, Any]


class ScriptedDaemon:
    def __init__(self, path: Path, features: Iterable[str] = ("position", "memory")) -> None:
        self.path = path
        self.features = tuple(features)
        #: What ``released`` says of the room (``evict``): whether the next holder needed it.
        self.released_evict = False
        #: Sent right behind the next grant, in the same write (once): a drop that comes at
        #: once, as the end of a short quantum does.
        self.after_grant: Message | None = None
        #: More fields for ``registered`` (what a daemon tells the client of itself there).
        self.registered_extra: Message = {}
        #: When set, every acquire is answered ``waiting`` and then refused with an ``error``
        #: event of code ``room`` and this message, as the daemon refuses a waiter whose room
        #: cannot be made.
        self.refuse_room: str | None = None
        self.received: list[tuple[float, Message]] = []
        self._changed = threading.Condition()
        self._connection: socket.socket | None = None
        self._send_lock = threading.Lock()
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(8)
        threading.Thread(target=self._serve, daemon=True).start()

    def close(self) -> None:
        self.server.close()
        if self._connection:
            self._connection.close()

    # ---- what the test does ----
    def send(self, **message: Any) -> None:
        self.wait_op("register")
        self._write(message)

    def hang_up(self) -> None:
        """Closes the client's connection, as a daemon that stops does; it may connect again."""
        with self._send_lock:
            if self._connection:
                self._connection.shutdown(socket.SHUT_RDWR)

    def messages(self, op: str | None = None) -> list[Message]:
        with self._changed:
            return [m for _, m in self.received if op is None or m["op"] == op]

    def timed(self, op: str) -> list[tuple[float, Message]]:
        with self._changed:
            return [(t, m) for t, m in self.received if m["op"] == op]

    def wait_for(self, predicate: Callable[[Message], bool], timeout: float = 10.0,
                 what: str = "a message") -> Message:
        """The first message received (from the start) for which predicate holds."""
        deadline = time.monotonic() + scaled(timeout)
        with self._changed:
            while True:
                for _, message in self.received:
                    if predicate(message):
                        return message
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {what} from the shim; it sent "
                                         f"{[m for _, m in self.received]}")
                self._changed.wait(left)

    def wait_op(self, op: str, timeout: float = 10.0, **fields: Any) -> Message:
        return self.wait_for(lambda m: m["op"] == op and all(m.get(k) == v
                                                             for k, v in fields.items()),
                             timeout, what=f"{op} {fields or ''}")

    # ---- the daemon's side ----
    def _write(self, message: Message, connection: socket.socket | None = None) -> None:
        self._write_all([message], connection)

    def _write_all(self, messages: list[Message],
                   connection: socket.socket | None = None) -> None:
        with self._send_lock:
            connection = connection or self._connection
            if connection:
                # Compact, as the daemon writes; several lines go in one write.
                lines = "".join(json.dumps(m, separators=(",", ":")) + "\n" for m in messages)
                # Hung up on (hang_up): the client is gone, as from a real daemon.
                with contextlib.suppress(OSError):
                    connection.sendall(lines.encode())

    def _reply(self, message: Message) -> Message | None:
        op, seq = message["op"], message.get("seq")
        if op == "hello":
            asked = message.get("features") or []
            return {"op": "welcome", "version": 1, "daemon": "scripted", "max_message": 65536,
                    "mode": "on", "tq": 30, "features": [f for f in asked if f in self.features]}
        if op == "register":
            return {"op": "registered", "seq": seq, "client": "c1", "gpu": 0, "mode": "on",
                    "tq": 30, "evict": message.get("evict") or "managed",
                    **self.registered_extra}
        if op == "acquire" and self.refuse_room is not None:
            return {"op": "waiting", "seq": seq, "position": 1}
        if op == "acquire":
            return {"op": "grant", "seq": seq, "gpu": 0, "quantum": 30}
        if op == "release":
            return {"op": "released", "seq": seq, "evict": self.released_evict}
        return {"op": "ok", "seq": seq}

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve_one, args=(connection,), daemon=True).start()

    def _serve_one(self, connection: socket.socket) -> None:
        with contextlib.suppress(OSError):  # a client that went away (reset): as a daemon
            self._converse(connection)

    def _converse(self, connection: socket.socket) -> None:
        for line in connection.makefile("r"):
            message = json.loads(line)
            if message["op"] == "register":
                self._connection = connection  # the client: what the test sends goes here
            with self._changed:
                self.received.append((time.monotonic(), message))
                self._changed.notify_all()
            refusal = self.refuse_room if message["op"] == "acquire" else None
            reply = self._reply(message)
            if reply and reply["op"] == "grant" and self.after_grant is not None:
                self._write_all([reply, self.after_grant], connection)
                self.after_grant = None
            elif reply:
                self._write(reply, connection)
            if refusal is not None:
                self._write({"op": "error", "code": "room", "message": refusal}, connection)
