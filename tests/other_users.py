"""Peers of other users, for tests that need the kernel's own credentials to differ (root only).

``as_user(uid, work)`` runs ``work`` in a child of this process that dropped to ``uid`` and
returns what it returned (pickled through a pipe); an exception in the child comes back as an
AssertionError naming it. The child is a fork, not a new interpreter: the other user need not be
able to read the test's Python or its venv. ``Peer`` is the same hand-driven connection as
test_daemon's ``Raw``, built from nothing but the socket path, so it works in such a child.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

NOBODY = 65534
#: Another unprivileged user, neither root nor NOBODY.
SOMEONE = 4242

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to be other users")


def open_to_everyone(directory: Path) -> None:
    """Let other users reach the daemon's socket in ``directory`` (its config must give the
    socket mode 0666)."""
    directory.chmod(0o755)


def as_user(uid: int, work: Callable[[], T]) -> T:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the test
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            result: tuple[str, Any] = ("ok", work())
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the test
            result = ("error", f"{type(exc).__name__}: {exc}")
        try:
            os.write(write_end, pickle.dumps(result))
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as answer:
        data = answer.read()
    os.waitpid(pid, 0)
    kind, value = pickle.loads(data)
    if kind == "error":
        raise AssertionError(f"the child as uid {uid} failed: {value}")
    return value  # type: ignore[no-any-return]


class Peer:
    """One connection, said hello on."""

    def __init__(self, socket_path: str, features: list[str] | None = None) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(socket_path)
        self.lines = self.sock.makefile("rb")
        hello: dict[str, Any] = {"op": "hello", "version": 1}
        if features:
            hello["features"] = features
        self.send(hello)
        assert self.read()["op"] == "welcome"

    def send(self, message: dict[str, Any]) -> None:
        self.sock.sendall(json.dumps(message).encode() + b"\n")

    def read(self) -> dict[str, Any]:
        line = self.lines.readline()
        if not line:
            raise ConnectionResetError("closed")
        return json.loads(line)  # type: ignore[no-any-return]

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send one request with a seq and read up to its reply (events are passed over)."""
        self.send({**message, "seq": 1})
        while True:
            reply = self.read()
            if reply.get("seq") == 1:
                return reply
