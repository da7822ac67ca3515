"""A waiter for room never blocks the queue (issue 40, N4b), over real shimmed processes on the
fake driver and the real daemon on a real Unix socket.

An idle peer says it keeps the whole card's room and never evicts (a raw connection: no shim
would). A kernel (vmm evictor) whose working set needs that room waits for the eviction asked
of it; a second kernel that needs no room is granted meanwhile, and again after each of its
releases; the wait ends once, with a grant, when the liar's eviction fails. Run under ASan and
TSan too (``make sanitize``).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

from support import DaemonProcess, scaled
from test_memory_e2e import (
    RESERVE,
    ROOM_FOR_ONE,
    WORKING_SET,
    Kernel,
    client,
    registered,
)

MiB = 1 << 20


class Liar:
    """An idle memory client that claims ``resident`` bytes on the card, in raw lines."""

    def __init__(self, daemon: DaemonProcess, resident: int) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(scaled(30))
        self.sock.connect(daemon.socket)
        self.lines = self.sock.makefile("rb")
        self.seq = 0
        self.events: list[dict] = []
        self.request("hello", version=1, features=["memory"])
        self.id = self.request("register", name="liar", display_name="liar.ipynb",
                               working_set=resident, evict="vmm")["client"]
        self.request("acquire")
        self.request("working_set", bytes=resident, resident=resident, host=0)
        self.request("release")

    def request(self, op: str, **fields: object) -> dict:
        self.seq += 1
        self.sock.sendall(json.dumps({"op": op, "seq": self.seq, **fields}).encode() + b"\n")
        while True:
            message = json.loads(self.lines.readline())
            if message.get("seq") == self.seq:
                return message
            self.events.append(message)

    def close(self) -> None:
        self.lines.close()
        self.sock.close()


def test_a_kernel_that_needs_no_room_is_granted_while_another_waits_for_a_silent_one(
        start_daemon, workload, card, watch, tmp_path: Path) -> None:
    config = tmp_path / "kiwi.yaml"
    config.write_text("evict_timeout: 600\n")
    daemon = start_daemon("--tq", "60", "--grace", "30", "--gpus", "1", "--gpu-memory",
                          f"{(RESERVE + ROOM_FOR_ONE) // MiB}MiB", "--config", str(config))
    events = watch(daemon)
    liar = Liar(daemon, ROOM_FOR_ONE)
    try:
        waiter = Kernel(workload, card, daemon, "nbW.ipynb")
        registered(events, waiter)
        other = workload(KIWI_SOCKET=daemon.socket, KIWI_EVICT="vmm",
                         KIWI_DISPLAY_NAME="nbP.ipynb", **card.env)
        launch = waiter.w.start("d.launch()")
        events.wait_for(lambda d: (client(d, waiter) or {}).get("waiting_for") and d,
                        what="the waiter to wait for the liar's eviction")
        for _ in range(3):  # granted at once, each time, while the waiter still waits
            assert other.call("d.launch()", timeout=scaled(30)) == 0
            assert not launch.done()
            other.call("shim.release()")
        assert client(events.status(), waiter)["state"] == "waiting"
        # The liar's last word on its eviction: the wait ends, with a grant.
        assert liar.request("evicted", failed="never")["op"] == "ok"
        assert launch.result(timeout=scaled(30)) == 0
        assert waiter.on_card() == WORKING_SET
    finally:
        liar.close()
