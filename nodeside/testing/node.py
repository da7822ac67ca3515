"""``Node``: the daemon in this process, on virtual time, and ``Peer``: a connection to it made of
bytes in memory. Timers, backpressure, queue positions and ``changed`` rounds, tested
deterministically and in milliseconds.

``Node`` builds the real ``Daemon`` (the same session, requests, scheduler, router, delivery and
timers as ``kiwi-scheduler``) on an event loop whose clock is virtual: when nothing is ready to
run, the loop does not wait, it moves its clock to the next timer. Each peer is a real
``DaemonConnection`` on a ``Transport`` that hands the daemon's bytes to the test and the test's
bytes to the daemon, with the transport's own rules: a write buffer with high and low water
marks that pause and resume the protocol's writing, and reading that the protocol pauses and
resumes. The peer's credentials are real (the far end of a socket pair: this process, whose
user may change the mode and TQ).

Nothing is read from a socket and no thread runs, so what a test sees depends only on what it
sends and how far it moves the clock. What only a real socket shows (the kernel's buffers,
other processes, a real clock) stays in the end-to-end tests, which run ``kiwi-scheduler``.

    with Node(tq=0.6, grace=5) as node:
        a, b = node.client("a"), node.client("b")
        a.send(p.encode(p.ACQUIRE, seq=1))
        assert a.read()["op"] == p.GRANT
        node.sleep(0.6)
        assert a.read()["reason"] == p.REASON_QUANTUM
"""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

from nodeside import protocol as p
from nodeside.config import from_mapping
from nodeside.daemon.connection import DaemonConnection
from nodeside.daemon.hostmem import MEMINFO
from nodeside.daemon.options import DaemonOptions
from nodeside.daemon.process_memory import Reader
from nodeside.daemon.server import Daemon
from nodeside.scheduler.core import GpuSpec
from nodeside.testing.loop import VirtualTimeLoop

#: What a real transport reads from its socket at most at a time (asyncio's max_size).
READ_SIZE = 256 * 1024


class Transport(asyncio.Transport):
    """Both ends of one connection: what the daemon writes waits in ``unread`` until the test
    reads it (that is the write buffer the protocol's backpressure watches); what the test
    sends reaches the protocol on the loop, and not while the protocol has paused reading."""

    def __init__(self, loop: VirtualTimeLoop, protocol: DaemonConnection,
                 sock: socket.socket) -> None:
        super().__init__()
        self.loop = loop
        self.protocol = protocol
        self.sock = sock
        self.unread = bytearray()
        self.incoming = bytearray()
        self.high = 64 * 1024
        self.low = self.high // 4
        self.writing_paused = False
        self.reading_paused = False
        self.closed = False
        self._delivering = False
        #: Resolved when a whole line is there to read.
        self.line_waiter: asyncio.Future[None] | None = None

    # -- the daemon's side ------------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.closed:
            return
        self.unread += data
        if self.line_waiter is not None and not self.line_waiter.done() and b"\n" in self.unread:
            self.line_waiter.set_result(None)
        if not self.writing_paused and len(self.unread) > self.high:
            self.writing_paused = True
            self.protocol.pause_writing()

    def get_write_buffer_size(self) -> int:
        return len(self.unread)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.high = 64 * 1024 if high is None else high
        self.low = self.high // 4 if low is None else low
        # As asyncio's transports do: limits below what is buffered pause writing at once.
        if not self.writing_paused and len(self.unread) > self.high:
            self.writing_paused = True
            self.protocol.pause_writing()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self.low, self.high

    def pause_reading(self) -> None:
        self.reading_paused = True

    def resume_reading(self) -> None:
        self.reading_paused = False
        self._arrange_delivery()

    def is_reading(self) -> bool:
        return not self.reading_paused

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.loop.call_soon(self.protocol.connection_lost, None)

    def abort(self) -> None:
        """Close without writing what is buffered: the test reads nothing more."""
        self.unread.clear()
        self.close()

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.sock if name == "socket" else default

    # -- the test's side --------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        self.incoming += data
        self._arrange_delivery()

    def _arrange_delivery(self) -> None:
        if self.incoming and not self.reading_paused and not self._delivering \
                and not self.closed:
            self._delivering = True
            self.loop.call_soon(self._deliver)

    def _deliver(self) -> None:
        self._delivering = False
        if self.reading_paused or self.closed or not self.incoming:
            return
        data = bytes(self.incoming[:READ_SIZE])
        del self.incoming[:READ_SIZE]
        self.protocol.data_received(data)
        self._arrange_delivery()  # the rest on a later turn of the loop, as a socket would

    def take_line(self) -> bytes | None:
        end = self.unread.find(b"\n")
        if end < 0:
            return None
        line = bytes(self.unread[:end])
        del self.unread[:end + 1]
        if self.writing_paused and len(self.unread) <= self.low:
            self.writing_paused = False
            self.loop.call_soon(self.protocol.resume_writing)
        return line

    def hang_up(self) -> None:
        if not self.closed:
            self.closed = True
            self.loop.call_soon(self.protocol.connection_lost, None)


class Peer:
    """The test's end of one connection."""

    def __init__(self, node: Node, transport: Transport) -> None:
        self.node = node
        self.transport = transport
        #: The client id its registration was given (``Node.client``).
        self.client_id: str | None = None
        self._seq = 0

    @property
    def fd(self) -> int:
        return self.transport.sock.fileno()

    def send(self, *messages: bytes) -> None:
        """Write these lines in one write; the daemon reads them when the loop runs next."""
        self.transport.send(b"".join(messages))

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send one request with the next seq and read lines until its reply (events that
        come before it are passed over)."""
        self._seq += 1
        self.send(p.encode(op, seq=self._seq, **fields))
        while True:
            message = self.read()
            if message.get("seq") == self._seq:
                return message

    def read(self, within: float | None = None) -> dict[str, Any]:
        """The next line the daemon sent, once everything ready has run; with ``within``,
        what comes within that many (virtual) seconds."""
        line = self._next(within)
        if line is None:
            raise AssertionError(
                "nothing to read" if within is None else f"nothing to read within {within} s")
        return json.loads(line)

    def lines(self) -> list[dict[str, Any]]:
        """Every line there is to read now."""
        self.node.settle()
        out = []
        while (line := self.transport.take_line()) is not None:
            out.append(json.loads(line))
        return out

    def quiet(self) -> bool:
        """Nothing to read now."""
        self.node.settle()
        return not self.transport.unread

    @property
    def closed(self) -> bool:
        """The daemon closed this connection (what it wrote first may still be read)."""
        self.node.settle()
        return self.transport.closed

    def close(self) -> None:
        self.transport.hang_up()
        self.node.settle()

    def _next(self, within: float | None) -> bytes | None:
        self.node.settle()
        line = self.transport.take_line()
        if line is not None or within is None:
            return line
        loop = self.node.loop
        waiter = self.transport.line_waiter = loop.create_future()
        try:
            loop.run_until_complete(asyncio.wait_for(waiter, within))
        except TimeoutError:
            return None
        finally:
            self.transport.line_waiter = None
        return self.transport.take_line()


class Node:
    """A ``Daemon`` on a virtual-time loop. Settings are the config file's (``tq``, ``grace``,
    ``mode``, ``pools``, ``connections``...); ``gpus`` and ``gpu_memory`` as on the command
    line; ``process_memory``: NVML's per-process used memory as a test makes it, read as the
    daemon reads NVML's (the peers' pid is this process's); ``meminfo``: the file the host's
    MemAvailable is read from."""

    def __init__(self, *, gpus: int = 1, gpu_memory: int | None = None,
                 process_memory: Reader | None = None,
                 cuda_library: str = "/nonexistent/libcuda.so.1", meminfo: Path = MEMINFO,
                 **settings: Any) -> None:
        self.loop = VirtualTimeLoop()
        # No CUDA driver for the checkpoint evictor unless a test names one: by its soname the
        # daemon would find whatever driver this process loaded before (a test's fake one).
        options = DaemonOptions(socket="/nonexistent/kiwi.sock", config=from_mapping(settings),
                                gpus=[GpuSpec(i, "logical GPU", None, gpu_memory)
                                      for i in range(gpus)],
                                process_memory=process_memory, cuda_library=cuda_library,
                                meminfo=meminfo)
        self.daemon: Daemon = self.loop.run_until_complete(_make(options))
        self.daemon.start_watches()
        self.settle()
        self.peers: list[Peer] = []
        self._sockets: list[socket.socket] = []

    @property
    def now(self) -> float:
        return self.loop.time()

    def connect(self, hello: bool = True, features: list[str] | None = None) -> Peer:
        """A new connection, greeted unless ``hello`` is False."""
        ours, theirs = socket.socketpair()
        self._sockets += [ours, theirs]
        protocol = DaemonConnection(self.daemon.router)
        transport = Transport(self.loop, protocol, ours)
        protocol.connection_made(transport)
        peer = Peer(self, transport)
        self.peers.append(peer)
        if hello:
            welcome = peer.request(p.HELLO, version=p.VERSION, features=features)
            assert welcome["op"] == p.WELCOME, welcome
        return peer

    def client(self, name: str, features: list[str] | None = None, **fields: Any) -> Peer:
        """A greeted connection registered as a client called ``name``."""
        peer = self.connect(features=features)
        registered = peer.request(p.REGISTER, name=name, **fields)
        assert registered["op"] == p.REGISTERED, registered
        peer.client_id = registered["client"]
        return peer

    def settle(self) -> None:
        self.loop.settle()

    def sleep(self, seconds: float) -> None:
        """Let ``seconds`` of virtual time pass, running every timer due on the way."""
        self.loop.run_until_complete(asyncio.sleep(seconds))
        self.settle()

    def status(self) -> dict[str, Any]:
        self.settle()
        return self.daemon.status()

    def close(self) -> None:
        for peer in self.peers:
            peer.transport.hang_up()
        self.settle()
        self.daemon.timers.close()
        self.loop.close()
        for sock in self._sockets:
            sock.close()

    def __enter__(self) -> Node:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _make(options: DaemonOptions) -> Daemon:
    return Daemon(options)

