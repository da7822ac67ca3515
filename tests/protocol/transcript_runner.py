"""Runs the protocol's conformance transcripts against a client implementation.

A transcript (``transcripts/*.jsonl``) is one JSON object a line, each a step:

    {"call": "ask", "sent": [{"op": "acquire", "seq": "$a"}], "state": "ASKING"}
    {"receive": {"op": "waiting", "seq": "$a", "position": 2}, "state": "WAITING",
     "position": 2}
    {"include": "ready.jsonl"}

- ``call``: the client's caller does something: ``connect`` (a new connection; the client
  says hello), ``lost`` (the connection ended), ``ask`` (wants the GPU), ``release`` (gives it
  back, or takes back a request), ``cancel`` (takes back a request and waits for the answer;
  the shim gives a hold back only through ``release``, so transcripts cancel requests only),
  ``yield`` (releases of its own accord with ``evict_first``), ``requeue``; and for the
  ``memory`` feature: ``report`` (says its working set and where its memory is),
  ``release_evicting`` (gives a hold back on a drop with ``evict``, the memory on its way out),
  ``evicted`` (a move out ended); for ``tiers``: ``spilled`` and ``fetched`` (a move to disk,
  or back to host memory, ended), ``intent`` (the Jupyter server's hint).
- ``receive``: one line from the daemon, written as the object it encodes. A string value
  ``"$name"`` is a seq bound earlier; when the client sent that request without a seq, the key
  is left out, as the daemon would.
- ``sent``: the lines the client sends in this step, in order; none when absent. Each is a
  pattern: every key must be there with that value, ``"$name"`` binds (or must equal) the
  seq the client chose, ``null`` means the key must be absent, ``"*"`` any value, and
  ``"...": true`` lets the line carry keys the pattern does not name (hello and register, whose
  fields differ from client to client). A ``seq`` the pattern does not name may be there or
  not: the C client numbers every request, the Python one not all.
- ``state``: the hold's state after the step (``nodeside.protocol.hold.Hold``'s names);
  ``position`` and ``paused``: what the client reports after it, when given.
- ``include``: the steps of another transcript, here.

``run`` takes any ``Implementation``: ``PythonSession`` drives ``ClientSession``, ``ShimSession``
the shim's C client through the conformance entry points docs/protocol.md ("Conformance")
names, in a process of its own:

    python tests/protocol/transcript_runner.py --shim LIBRARY [TRANSCRIPT...]

and, with ``--decode LIBRARY``, the lines on its stdin through the shim's decoder alone; with
``--handles LIBRARY``, two clients on handles of their own, driven apart.
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path
from typing import Any, Protocol

from nodeside.protocol import encode
from nodeside.protocol.client_session import ClientSession
from nodeside.protocol.hold import Hold

HERE = Path(__file__).parent / "transcripts"
#: What ``connect`` registers with, for implementations that take it from the runner: where its
#: memory is, as the shim does (a daemon that does not serve ``memory`` must not hear it).
REGISTRATION = {"name": "transcript", "kind": "client", "working_set": 0, "resident": 0,
                "host": 0}


class Implementation(Protocol):
    def call(self, name: str) -> None: ...
    def receive(self, line: bytes) -> None: ...
    def take_sent(self) -> list[dict[str, Any]]: ...
    def state(self) -> str: ...
    def position(self) -> int | None: ...
    def paused(self) -> bool: ...


class PythonSession:
    """``ClientSession``, registering, asking for position events like ``Client``; and for
    ``memory``, as the shim does (the transcripts' daemon does not serve it: both clients then
    speak without it, which is what they hold); ``tiers`` where a transcript's hello asks for
    it (``asked_features``)."""

    def __init__(self, features: tuple[str, ...] = ("position", "memory")) -> None:
        self.session = ClientSession(features=features)

    def call(self, name: str) -> None:
        session = self.session
        calls = {"connect": lambda: session.connect(dict(REGISTRATION)),
                 "lost": session.connection_lost, "ask": session.ask,
                 "release": session.release, "cancel": session.cancel,
                 "yield": session.release_evicting_first, "requeue": session.requeue,
                 "report": lambda: session.report_working_set(0, resident=0, host=0, disk=0,
                                                              pinned=0),
                 "release_evicting": lambda: session.release(evicting=True),
                 "evicted": lambda: session.evicted(resident=0, host=0, moved=0, seconds=0.0),
                 "spilled": lambda: session.tier_moved("disk", host=0, disk=0),
                 "fetched": lambda: session.tier_moved("host", host=0, disk=0),
                 "restored": lambda: session.report_working_set(0, resident=0, host=0, disk=0,
                                                                pinned=0),
                 "intent": lambda: session.intent("transcript")}
        calls[name]()

    def receive(self, line: bytes) -> None:
        self.session.receive_data(line)

    def take_sent(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.session.data_to_send().splitlines()]

    def state(self) -> str:
        return self.session.state.name

    def position(self) -> int | None:
        return self.session.position

    def paused(self) -> bool:
        return self.session.paused


class TranscriptFailed(AssertionError):
    pass


#: What the shim's C client must export for the transcripts (docs/protocol.md, "Conformance").
SHIM_ENTRY_POINTS = ("kiwi_conformance_reset", "kiwi_conformance_call",
                     "kiwi_conformance_receive", "kiwi_conformance_sent", "kiwi_hold_state",
                     "kiwi_conformance_position", "kiwi_conformance_paused")


class ShimSession:
    """The shim's C client, loaded with ctypes; only ever in a process of its own (``main``)."""

    def __init__(self, library: str) -> None:
        lib = self.lib = ctypes.CDLL(library)
        lib.kiwi_conformance_call.argtypes = [ctypes.c_char_p]
        lib.kiwi_conformance_receive.argtypes = [ctypes.c_char_p]
        lib.kiwi_conformance_sent.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        lib.kiwi_conformance_sent.restype = ctypes.c_size_t
        lib.kiwi_conformance_reset()

    def call(self, name: str) -> None:
        if self.lib.kiwi_conformance_call(name.encode()) != 0:
            raise TranscriptFailed(f"the shim knows no call {name!r}")

    def receive(self, line: bytes) -> None:
        self.lib.kiwi_conformance_receive(line.rstrip(b"\n"))

    def take_sent(self) -> list[dict[str, Any]]:
        out = ctypes.create_string_buffer(1 << 16)
        length = self.lib.kiwi_conformance_sent(out, len(out))
        if length >= len(out):
            raise TranscriptFailed(f"the shim sent {length} bytes in one step")
        return [json.loads(line) for line in out.value.splitlines()]

    def state(self) -> str:
        return list(Hold)[self.lib.kiwi_hold_state()].name  # protocol.h's enum, in Hold's order

    def position(self) -> int | None:
        return self.lib.kiwi_conformance_position() or None

    def paused(self) -> bool:
        return bool(self.lib.kiwi_conformance_paused())


def steps(name: str) -> list[tuple[str, int, dict[str, Any]]]:
    """The transcript's steps, includes expanded, each with where it is written."""
    out = []
    for number, text in enumerate((HERE / name).read_text().splitlines(), 1):
        if not text.strip():
            continue
        step = json.loads(text)
        if "include" in step:
            out += steps(step["include"])
        else:
            out.append((name, number, step))
    return out


def calls(name: str) -> set[str]:
    """The calls the transcript's steps make."""
    return {step["call"] for _, _, step in steps(name) if "call" in step}


def asked_features(name: str) -> tuple[str, ...]:
    """The features the transcript's first hello asks for."""
    for _, _, step in steps(name):
        for pattern in step.get("sent", []):
            if pattern.get("op") == "hello":
                return tuple(pattern.get("features") or ())
    return ()


def run(name: str, implementation: Implementation) -> None:
    bound: dict[str, int | None] = {}
    for where, number, step in steps(name):
        try:
            _step(step, implementation, bound)
        except TranscriptFailed as failed:
            raise TranscriptFailed(f"{where}:{number}: {failed}\n  step: {json.dumps(step)}") \
                from None


def _step(step: dict[str, Any], implementation: Implementation,
          bound: dict[str, int | None]) -> None:
    if "call" in step:
        implementation.call(step["call"])
    if "receive" in step:
        implementation.receive(_line(step["receive"], bound))
    sent = implementation.take_sent()
    patterns = step.get("sent", [])
    if len(sent) != len(patterns):
        raise TranscriptFailed(f"sent {sent}, expected {len(patterns)} line(s): {patterns}")
    for message, pattern in zip(sent, patterns, strict=True):
        _match(message, pattern, bound)
    if "state" in step and implementation.state() != step["state"]:
        raise TranscriptFailed(f"state {implementation.state()}, expected {step['state']}")
    if "position" in step and implementation.position() != step["position"]:
        raise TranscriptFailed(f"position {implementation.position()}, expected "
                               f"{step['position']}")
    if "paused" in step and implementation.paused() != step["paused"]:
        raise TranscriptFailed(f"paused {implementation.paused()}, expected {step['paused']}")


def _line(message: dict[str, Any], bound: dict[str, int | None]) -> bytes:
    fields = {}
    for key, value in message.items():
        if isinstance(value, str) and value.startswith("$"):
            if value not in bound:
                raise TranscriptFailed(f"{value} is not bound")
            value = bound[value]  # None: the request had no seq, so neither has its answer
        fields[key] = value
    return encode(fields.pop("op"), **fields)


def _match(message: dict[str, Any], pattern: dict[str, Any],
           bound: dict[str, int | None]) -> None:
    loose = pattern.get("...") is True
    for key, want in pattern.items():
        if key == "...":
            continue
        have = message.get(key)
        if want is None:
            if key in message:
                raise TranscriptFailed(f"{message} has {key!r}, which it must not")
        elif want == "*":
            if key not in message:
                raise TranscriptFailed(f"{message} lacks {key!r}")
        elif isinstance(want, str) and want.startswith("$"):
            if want in bound and bound[want] != have:
                raise TranscriptFailed(f"{message}: {key} is {have}, {want} was {bound[want]}")
            bound[want] = have
        elif have != want or key not in message:
            raise TranscriptFailed(f"{message}: {key} is {have!r}, expected {want!r}")
    extra = set(message) - set(pattern) - {"seq"}
    if extra and not loose:
        raise TranscriptFailed(f"{message} carries {sorted(extra)} besides the pattern's keys")


def main(argv: list[str]) -> int:
    """``--shim LIBRARY [TRANSCRIPT...]``: run the transcripts (all, when none is named)
    against the shim, each from a fresh reset, printing ``ok NAME`` or ``FAILED NAME: why`` for
    each; exit 1 if one fails, 3 if the library lacks the entry points."""
    library, names = argv[1], argv[2:] or [p.name for p in sorted(HERE.glob("*.jsonl"))]
    exported = ctypes.CDLL(library)
    missing = [name for name in SHIM_ENTRY_POINTS if not hasattr(exported, name)]
    if missing:
        print(f"the shim exports none of {missing}", file=sys.stderr)
        return 3
    failed = 0
    for name in names:
        try:
            run(name, ShimSession(library))
        except TranscriptFailed as failure:
            failed += 1
            print(f"FAILED {name}: {failure}", flush=True)
        else:
            print(f"ok {name}", flush=True)
    return 1 if failed else 0


#: kiwi_conformance_decode's answers (enum kiwi_decoded, protocol.h).
DECODED = ("decoded", "malformed", "unknown_op")


def decode_lines(library: str) -> int:
    """``--decode LIBRARY``: each line of stdin through the shim's decoder alone, printing its
    verdict (``DECODED``) and what it read, a tab between."""
    lib = ctypes.CDLL(library)
    lib.kiwi_conformance_decode.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    out = ctypes.create_string_buffer(1024)
    for line in sys.stdin.buffer.read().split(b"\n"):
        if line:
            verdict = lib.kiwi_conformance_decode(line, out, len(out))
            print(f"{DECODED[verdict]}\t{out.value.decode()}", flush=True)
    return 0


def two_handles(library: str) -> int:
    """``--handles LIBRARY``: two clients on handles of their own, driven apart
    (``kiwi_conformance_two_handles``); prints how many of its checks failed."""
    lib = ctypes.CDLL(library)
    lib.kiwi_conformance_reset()
    print(f"failed {lib.kiwi_conformance_two_handles()}", flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--decode"] and len(sys.argv) == 3:
        sys.exit(decode_lines(sys.argv[2]))
    if sys.argv[1:2] == ["--handles"] and len(sys.argv) == 3:
        sys.exit(two_handles(sys.argv[2]))
    if sys.argv[1:2] != ["--shim"] or len(sys.argv) < 3:
        sys.exit("usage: transcript_runner.py --shim LIBRARY [TRANSCRIPT...] | --decode LIBRARY "
                 "| --handles LIBRARY")
    sys.exit(main(sys.argv[1:]))
