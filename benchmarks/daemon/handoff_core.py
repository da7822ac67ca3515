"""The daemon's own work per handoff, in-process and without sockets, against a bare relay.

    python -m benchmarks.daemon.handoff_core [--clients 2,8,64,512] [--handoffs 3000]
                                             [--repeats 5] [--callgrind]
                                             [--callgrind-handoffs 500]

`benchmarks/daemon/handoff.py` measures the handoff end to end, so its figures carry the machine's
load and the event loop. This one drives the daemon's real per-request path (``DaemonConnection``,
``Session``, ``Requests``, the scheduler core, ``Delivery`` and the quantum timer's bookkeeping
in the router's ``carry_out``) with N registered clients, every one waiting: the holder writes
``release`` and ``acquire`` in one write, as the C harness does, and the one granted next does
the same. Nothing is read from a socket: each connection's transport keeps what it is given and
notes a grant, so what is counted is the daemon's rules and not the kernel's.

**The floor** is a relay ring in plain Python on the same transports and the same lines: on a
release the token goes to the longest waiter, an acquire waits or holds. What the daemon costs
over it is the cost of its rules. Two figures per N, each a ratio against the floor measured in
the same run:

- CPU time per handoff (``time.process_time``), the lowest of ``--repeats`` runs: it moves with
  the machine's load and its caches;
- with ``--callgrind``, instructions per handoff under ``valgrind --tool=callgrind``, which do
  not move with the load: each is counted in two processes that differ only in the number of
  handoffs (``--callgrind-handoffs`` and three times that), so start-up and setup cancel out.
  With the compiled core, also those inside the daemon's request path alone (the compiled
  ``DaemonConnection.data_received``, inclusive): the figure a change to the daemon moves, without
  the garbage collector's passes and the loop around it, which make the whole process's count
  move by a few percent from run to run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from benchmarks.common import utc_now

KINDS = ("kiwi", "floor")
_CALLGRIND_TOTAL = re.compile(rb"^summary:\s+(\d+)", re.MULTILINE)


class Ring:
    """Who was granted last, as the transports saw it: the driver's only bookkeeping."""

    def __init__(self) -> None:
        self.granted: int | None = None


class Transport:
    """A connection's far end that reads nothing: it keeps the socket its peer's credentials
    come from, and tells the ring when a grant was written to it."""

    def __init__(self, ring: Ring, index: int, sock: socket.socket) -> None:
        self.ring = ring
        self.index = index
        self.sock = sock
        self.written = 0

    def write(self, data: bytes) -> None:
        self.written += len(data)
        if b'{"op":"grant"' in data:
            self.ring.granted = self.index

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.sock if name == "socket" else default

    def get_write_buffer_size(self) -> int:
        return 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass


class Peer(Protocol):
    def data_received(self, data: bytes) -> None: ...


# -- the floor: a relay ring, as benchmarks/daemon/c/relay_ring.c but in Python --------------

class RelayServer:
    def __init__(self) -> None:
        self.holder: RelayConnection | None = None
        self.waiting: deque[RelayConnection] = deque()


class RelayConnection:
    """One client of the relay: the op read from its fixed place, the replies written whole."""

    def __init__(self, server: RelayServer, transport: Transport) -> None:
        self.server = server
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        server, out = self.server, []
        for line in data.splitlines():
            op = line[7:line.index(b'"', 7)]
            seq = int(line[line.index(b'"seq":') + 6:line.index(b"}")])
            if op == b"release":
                if server.holder is self:
                    server.holder = None
                    if server.waiting:
                        server.holder = nxt = server.waiting.popleft()
                        nxt.transport.write(b'{"op":"grant","gpu":0}\n')
                out.append(b'{"op":"released","seq":%d,"evict":false}\n' % seq)
            elif op == b"acquire":
                if server.holder is None:
                    server.holder = self
                    out.append(b'{"op":"grant","seq":%d,"gpu":0}\n' % seq)
                else:
                    server.waiting.append(self)
                    out.append(b'{"op":"waiting","seq":%d,"position":%d}\n'
                               % (seq, len(server.waiting)))
            else:
                out.append(b'{"op":"ok","seq":%d}\n' % seq)
        self.transport.write(b"".join(out))


# -- the two servers, set up with n clients all waiting ---------------------------------------

def _hello_register_acquire(index: int) -> list[bytes]:
    return [b'{"op":"hello","version":1,"seq":1}\n',
            b'{"op":"register","name":"bench-%d","kind":"client","seq":2}\n' % index,
            b'{"op":"acquire","seq":3}\n']


def floor_clients(n: int, ring: Ring, sockets: list[socket.socket]) -> list[Peer]:
    server = RelayServer()
    peers: list[Peer] = []
    for i in range(n):
        conn = RelayConnection(server, Transport(ring, i, sockets[i]))
        for line in _hello_register_acquire(i):
            conn.data_received(line)
        peers.append(conn)
    return peers


def kiwi_clients(n: int, ring: Ring, sockets: list[socket.socket]) -> list[Peer]:
    # Imported here: the floor's processes (under callgrind) never load the daemon.
    from nodeside.config import SchedulerConfig
    from nodeside.daemon.connection import DaemonConnection
    from nodeside.daemon.server import Daemon, DaemonOptions
    from nodeside.scheduler.core import GpuSpec

    daemon = Daemon(DaemonOptions(socket=os.devnull, config=SchedulerConfig(),
                                  gpus=[GpuSpec(0, "logical GPU")]))
    peers: list[Peer] = []
    for i in range(n):
        conn = DaemonConnection(daemon.router)
        conn.connection_made(Transport(ring, i, sockets[i]))  # type: ignore[arg-type]
        conn.data_received(b"".join(_hello_register_acquire(i)))
        peers.append(conn)
    return peers


SETUPS: dict[str, Callable[[int, Ring, list[socket.socket]], list[Peer]]] = {
    "kiwi": kiwi_clients, "floor": floor_clients}


async def handoffs_cpu(kind: str, n: int, handoffs: int) -> float:
    """CPU seconds for ``handoffs`` handoffs among n waiting clients (setup not counted)."""
    pairs = [socket.socketpair() for _ in range(n)]
    try:
        ring = Ring()
        peers = SETUPS[kind](n, ring, [a for a, _ in pairs])
        if ring.granted is None:
            raise RuntimeError(f"{kind}: nobody was granted the GPU")
        seqs = [3] * n
        started = time.process_time()
        for _ in range(handoffs):
            holder = ring.granted
            seq = seqs[holder] = seqs[holder] + 2
            ring.granted = None
            peers[holder].data_received(b'{"op":"release","seq":%d}\n{"op":"acquire","seq":%d}\n'
                                        % (seq - 1, seq))
            if ring.granted is None or (n > 1 and ring.granted == holder):
                raise RuntimeError(f"{kind}: the release by {holder} handed the GPU to nobody")
        return time.process_time() - started
    finally:
        for a, b in pairs:
            a.close()
            b.close()


def run_one(kind: str, n: int, handoffs: int) -> float:
    logging.disable(logging.INFO)  # the daemon's "Registered" lines, 512 of them
    return asyncio.run(handoffs_cpu(kind, n, handoffs))


# -- instructions, under callgrind -----------------------------------------------------------

#: The compiled daemon's whole per-request path: every line a connection reads goes through it
#: (session, requests, the scheduler core, the delivery of its actions). Counted alone, it
#: leaves out what moves from run to run without being the daemon's rules (the garbage
#: collector's passes, the benchmark's own loop).
REQUEST_PATH = "CPyDef_connection___Connection___data_received"


def instructions(kind: str, n: int, handoffs: int, only: str | None = None) -> int:
    """Instructions a whole child process ran (start-up included) for ``handoffs`` handoffs;
    with ``only``, those inside that C function (inclusive) alone."""
    with tempfile.TemporaryDirectory(prefix="kiwi-callgrind-") as tmp:
        out = os.path.join(tmp, "callgrind.out")
        toggle = [f"--toggle-collect={only}"] if only else []
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *toggle,
             sys.executable, "-m", "benchmarks.daemon.handoff_core", "--child", kind, str(n),
             str(handoffs)], capture_output=True, timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(f"callgrind run failed: {done.stderr.decode()[-2000:]}")
        with open(out, "rb") as f:
            found = _CALLGRIND_TOTAL.search(f.read())
        if found is None:
            raise RuntimeError("callgrind wrote no summary line")
        return int(found[1])


def instructions_per_handoff(kind: str, n: int, handoffs: int, only: str | None = None
                             ) -> float:
    return (instructions(kind, n, 3 * handoffs, only)
            - instructions(kind, n, handoffs, only)) / (2 * handoffs)


# -- the report --------------------------------------------------------------------------------

def core_name() -> str:
    from nodeside import core
    return core()


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", default="2,8,64,512")
    parser.add_argument("--handoffs", type=int, default=3000, help="per CPU-time run")
    parser.add_argument("--repeats", type=int, default=5, help="CPU-time runs; the lowest counts")
    parser.add_argument("--callgrind", action="store_true", help="count instructions too")
    parser.add_argument("--callgrind-handoffs", type=int, default=500)
    parser.add_argument("--child", nargs=3, metavar=("KIND", "N", "HANDOFFS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, n, handoffs = args.child[0], int(args.child[1]), int(args.child[2])
        print(json.dumps({"cpu": run_one(kind, n, handoffs)}))
        return ""
    without_valgrind = args.callgrind and shutil.which("valgrind") is None
    if without_valgrind:  # the CPU figures still say something; the report says what is missing
        args.callgrind = False
    sizes = [int(n) for n in args.clients.split(",")]
    load = os.getloadavg()[0]
    # The request path is a C function only in the compiled core.
    path = args.callgrind and core_name().startswith("compiled")
    rows = ["| clients waiting | Kiwi CPU per handoff (µs) | floor CPU per handoff (µs) | "
            "Kiwi / floor CPU |" + (" Kiwi instructions per handoff | floor instructions per "
                                    "handoff | Kiwi / floor instructions |"
                                    if args.callgrind else "")
            + (" of Kiwi's, in its request path |" if path else ""),
            "| --- | --- | --- | --- |" + (" --- | --- | --- |" if args.callgrind else "")
            + (" --- |" if path else "")]
    for n in sizes:
        cpu = {kind: min(run_one(kind, n, args.handoffs) for _ in range(args.repeats))
               / args.handoffs * 1e6 for kind in KINDS}
        row = (f"| {n} | {cpu['kiwi']:.1f} | {cpu['floor']:.2f} | "
               f"{cpu['kiwi'] / cpu['floor']:.1f}x |")
        if args.callgrind:
            ir = {kind: instructions_per_handoff(kind, n, args.callgrind_handoffs)
                  for kind in KINDS}
            row += f" {ir['kiwi']:,.0f} | {ir['floor']:,.0f} | {ir['kiwi'] / ir['floor']:.1f}x |"
        if path:
            inside = instructions_per_handoff("kiwi", n, args.callgrind_handoffs, REQUEST_PATH)
            row += f" {inside:,.0f} |"
        rows.append(row)
    text = "\n".join([
        f"## The daemon's work per handoff, in-process ({utc_now()})", "",
        f"Scheduler core: {core_name()}. {len(sizes)} sizes, every client waiting; CPU time "
        f"the lowest of {args.repeats} runs of {args.handoffs:,} handoffs"
        + (f", instructions from {args.callgrind_handoffs:,} and "
           f"{3 * args.callgrind_handoffs:,} handoffs under callgrind" if args.callgrind else "")
        + (" (the request path: inside `DaemonConnection.data_received`, the compiled "
           f"`{REQUEST_PATH}`, inclusive)" if path else "")
        + f". 1-minute load average {load:.1f} before."
        + (" No instruction counts: valgrind is not installed." if without_valgrind else ""),
        "", *rows])
    print(text)
    return text


if __name__ == "__main__":
    main()
