"""Runs the protocol's conformance transcripts against a client implementation.

A transcript (``transcripts/*.jsonl``) is one JSON object a line, each a step:

    {"call": "ask", "sent": [{"op": "acquire", "seq": "$a"}], "state": "ASKING"}
    {"receive": {"op": "waiting", "seq": "$a", "position": 2}, "state": "WAITING",
     "position": 2}
    {"include": "ready.jsonl"}

- ``call``: the client's caller does something: ``connect`` (a new connection; the client
  says hello), ``lost`` (the connection ended), ``ask`` (wants the GPU), ``release`` (gives it
  back, or takes back a request), ``cancel`` (takes back and waits for the answer), ``yield``
  (releases of its own accord with ``evict_first``), ``requeue``.
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

``run`` takes any ``Implementation``: ``PythonSession`` drives ``ClientSession``; the shim's
comm thread can be driven the same way through ctypes once it exposes what ``Implementation``
needs (docs/protocol.md, "Conformance").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

from nodeside.protocol import encode
from nodeside.protocol.client_session import ClientSession

HERE = Path(__file__).parent / "transcripts"
#: What ``connect`` registers with, for implementations that take it from the runner.
REGISTRATION = {"name": "transcript", "kind": "client"}


class Implementation(Protocol):
    def call(self, name: str) -> None: ...
    def receive(self, line: bytes) -> None: ...
    def take_sent(self) -> list[dict[str, Any]]: ...
    def state(self) -> str: ...
    def position(self) -> int | None: ...
    def paused(self) -> bool: ...


class PythonSession:
    """``ClientSession``, registering, asking for position events like ``Client``."""

    def __init__(self) -> None:
        self.session = ClientSession(features=["position"])

    def call(self, name: str) -> None:
        session = self.session
        calls = {"connect": lambda: session.connect(dict(REGISTRATION)),
                 "lost": session.connection_lost, "ask": session.ask,
                 "release": session.release, "cancel": session.cancel,
                 "yield": session.release_evicting_first, "requeue": session.requeue}
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
