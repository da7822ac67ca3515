"""The floor of a Python daemon: a relay ring as an asyncio protocol on uvloop, compiled.

    python -m benchmarks.daemon.py_ring SOCKET     (serves; compiled first if need be)

The same ring as benchmarks/daemon/c/relay_ring.c (hello, register, acquire, release with and
without "requeue", ping; one holder, the token to the longest waiter), but in Python, on the
daemon's own event loop (uvloop), compiled with mypyc as the daemon's core is (``build``, on
first use, into a folder keyed by this file's hash). What the daemon costs over it is the cost
of its rules; what it costs over the C ring is the cost of a Python daemon on asyncio at all.
It knows nothing of the daemon and imports nothing of this repository, so that it compiles
alone.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import subprocess
import sys
import tempfile
from collections import deque
from pathlib import Path
from typing import Any, Final

#: Where the op's first letter is in {"op":"...", and the letters that tell the ops apart.
_OP_AT: Final = 7
_A: Final = 97  # acquire
_H: Final = 104  # hello
_P: Final = 112  # ping
_R: Final = 114  # release, register
_L: Final = 108  # re(l)ease
_CLOSE: Final = 125  # }
_WELCOME: Final = b'{"op":"welcome","version":1,"daemon":"py-ring","mode":"on","tq":30.0}\n'
_GRANT: Final = b'{"op":"grant","gpu":0,"quantum":30.0}\n'


class Ring:
    def __init__(self) -> None:
        self.holder: Relay | None = None
        self.waiting: deque[Relay] = deque()


RING: Final = Ring()


def _seq(line: bytes) -> int:
    """The line's "seq": its last number, where the harness writes it ({"op":..,"seq":N}), or
    looked for (register carries more fields after it); -1 when there is none."""
    end = len(line) - 1
    if end > 0 and line[end] == _CLOSE and 48 <= line[end - 1] <= 57:
        start = end
        while 48 <= line[start - 1] <= 57:
            start -= 1
    else:
        start = line.find(b'"seq":') + 6
        if start < 6:
            return -1
        end = start
        while end < len(line) and 48 <= line[end] <= 57:
            end += 1
    number = 0
    for i in range(start, end):
        number = number * 10 + line[i] - 48
    return number


class Relay(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: Any = None
        self.rest = b""
        self.waits = False

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waits:
            RING.waiting.remove(self)
        if RING.holder is self:
            self._pass_on()

    def data_received(self, data: bytes) -> None:
        lines = (self.rest + data if self.rest else data).split(b"\n")
        self.rest = lines.pop()
        out: list[bytes] = []
        for line in lines:
            if len(line) <= _OP_AT + 2:
                continue
            seq = _seq(line)
            first = line[_OP_AT]
            if first == _R and line[_OP_AT + 2] == _L:  # release
                if RING.holder is self:
                    self._pass_on()
                elif self.waits:
                    RING.waiting.remove(self)
                    self.waits = False
                if line.endswith(b'"requeue":true}'):
                    out.append(self._acquire(seq))
                else:
                    out.append(b'{"op":"released","seq":%d,"evict":false}\n' % seq)
            elif first == _A:
                out.append(self._acquire(seq))
            elif first == _H:
                out.append(_WELCOME)
            elif first == _R:
                out.append(b'{"op":"registered","seq":%d,"client":"c","gpu":0}\n' % seq)
            elif first == _P:
                out.append(b'{"op":"pong","seq":%d}\n' % seq)
        if out:
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    def _acquire(self, seq: int) -> bytes:
        if RING.holder is None:
            RING.holder = self
            return b'{"op":"grant","seq":%d,"gpu":0,"quantum":30.0}\n' % seq
        if RING.holder is not self and not self.waits:
            RING.waiting.append(self)
            self.waits = True
        return b'{"op":"waiting","seq":%d,"position":%d}\n' % (seq, len(RING.waiting))

    def _pass_on(self) -> None:
        RING.holder = None
        if RING.waiting:
            nxt = RING.waiting.popleft()
            nxt.waits = False
            RING.holder = nxt
            nxt.transport.write(_GRANT)


async def serve(path: str) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_unix_server(Relay, path)
    stop = asyncio.Event()
    loop.add_signal_handler(15, stop.set)
    loop.add_signal_handler(2, stop.set)
    async with server:
        await stop.wait()


def build() -> Path:
    """A folder holding this module compiled (mypyc), importable as ``py_ring``."""
    source = Path(__file__)
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    folder = Path(tempfile.gettempdir()) / "kiwi-bench-bin" / f"py_ring-{digest}"
    if not folder.exists():
        partial = folder.with_suffix(".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        shutil.copy(source, partial / "py_ring.py")
        subprocess.run([sys.executable, "-m", "mypyc", "py_ring.py"], cwd=partial, check=True,
                       stdout=subprocess.DEVNULL)
        (partial / "py_ring.py").unlink()  # only the extension is imported
        partial.rename(folder)
    return folder


def main() -> None:
    """Serve on the socket named on the command line, compiled (built first if need be)."""
    sys.path.insert(0, str(build()))
    import uvloop

    compiled = __import__("py_ring")
    uvloop.run(compiled.serve(sys.argv[1]))


if __name__ == "__main__":
    main()
