"""What tests of Kiwi drive, shipped with it (trio.testing's shape): the scheduler and the daemon
in this process, on virtual time, with no GPU, no socket file and no other process.

- ``Replay`` (replay.py): the scheduler core driven from event to event by clients that behave
  as the protocol says (ask, work for so many GPU seconds, give the GPU back when dropped); the
  holds and waits it records (``Span``, spans.py) give exact GPU seconds and shares. For the
  scheduling rules and for trying a config: how would these pools share a GPU?
- ``Node`` and ``Peer`` (node.py): the real daemon, every part of it, on a ``VirtualTimeLoop``
  (loop.py), with connections made of bytes in memory; a test writes protocol lines, moves the
  clock and reads what the daemon answers.

What stays out: the fleet simulator (``benchmarks/fleet``: notebook traces, the host link's
model, the reference policies, reports), which is built on ``Replay``; and what only a real
process shows (the shim over the fake CUDA driver, a kernel, a real socket), which the test
suite starts for real (docs/decisions/0012-a-testing-module.md).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nodeside.testing.loop import Stuck, VirtualTimeLoop
    from nodeside.testing.node import Node, Peer
    from nodeside.testing.replay import MemoryMoves, Replay, Worker
    from nodeside.testing.spans import Span, SpanLog

#: Where each name lives: imported on first use, so that a test of the core (``Replay``) does
#: not import the daemon (``Node``) too.
_HOMES = {"Stuck": "loop", "VirtualTimeLoop": "loop", "Node": "node", "Peer": "node",
          "MemoryMoves": "replay", "Replay": "replay", "Worker": "replay", "Span": "spans",
          "SpanLog": "spans"}

__all__ = ["MemoryMoves", "Node", "Peer", "Replay", "Span", "SpanLog", "Stuck",
           "VirtualTimeLoop", "Worker"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
