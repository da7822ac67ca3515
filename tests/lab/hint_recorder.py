"""A peer at a daemon's socket that answers every request ``ok`` and records what it was sent, in
order: where the test is of the server's side of a request (when it sends it, what it says), not
of the daemon's handling of it, which the daemon's own tests cover (issue 42: ``intent``)."""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from support import scaled

from nodeside import protocol as p


class HintRecorder:
    """Listens at ``path``; ``requests`` is every request heard, as decoded, in order."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.requests: list[dict[str, Any]] = []
        self._heard = threading.Condition()
        recorder = self

        class Peer(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                for line in self.rfile:
                    message = p.decode(line)
                    with recorder._heard:
                        recorder.requests.append(message)
                        recorder._heard.notify_all()
                    self.wfile.write(answer(message))

        self._server = socketserver.ThreadingUnixStreamServer(str(path), Peer)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def ops(self) -> list[str]:
        with self._heard:
            return [str(m["op"]) for m in self.requests]

    def wait_for(self, found: Callable[[list[dict[str, Any]]], Any],
                 timeout: float = 10.0) -> list[dict[str, Any]]:
        """The requests heard so far, once ``found`` holds for them."""
        with self._heard:
            assert self._heard.wait_for(lambda: found(self.requests), scaled(timeout)), \
                f"never heard what was expected; heard {self.requests}"
            return list(self.requests)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def answer(message: dict[str, Any]) -> bytes:
    if message["op"] == p.HELLO:
        return p.encode(p.WELCOME, seq=message.get("seq"), version=p.VERSION,
                        daemon="hint recorder", max_message=p.MAX_REQUEST_BYTES, mode="on",
                        tq=30.0, features=sorted(set(message.get("features") or ()) &
                                                 p.FEATURES))
    return p.encode(p.OK, seq=message.get("seq"))


def intents(requests: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(m["name"], m.get("reason", "")) for m in requests if m["op"] == p.INTENT]


def recording(directory: Path) -> Iterator[HintRecorder]:
    recorder = HintRecorder(directory / "recorder.sock")
    yield recorder
    recorder.close()
