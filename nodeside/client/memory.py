"""A client that moves its own memory between the GPU and host memory (feature ``memory``).

Such a client tells the daemon where its memory is (``register`` and ``working_set`` carry
``resident`` and ``host``), and the daemon may then ask it, while it is idle, to move out so
that another client's grant has room (``evict``); it reports as it goes and ends with
``evicted``. A holder told ``drop`` with ``evict`` gives the GPU back with ``release``
``evicting`` and moves out the same way. docs/protocol.md, "Where memory is", has the rules.

``Client(pages=...)`` speaks the feature for what it is given: a ``PagesItself``, which knows
its figures and does the moving. The CUDA shim is the other client that speaks it, in C.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class MemoryFigures:
    """Where a client's memory is now, in bytes."""

    #: All it needs on the GPU to work: what is there and what was moved out.
    working_set: int
    #: On the GPU now.
    resident: int
    #: In host memory now (moved out).
    host: int


class PagesItself(Protocol):
    """Memory a client keeps on its GPU and moves to host memory and back by itself."""

    def figures(self) -> MemoryFigures:
        """Where the memory is now."""
        ...

    def evict_asked(self, nbytes: int, for_name: str) -> None:
        """The daemon asks for ``nbytes`` of room, for the client named ``for_name``: move out
        now, reporting as it goes (``Client.report_memory``), and end with ``Client.evicted``.
        Called on a thread of its own, which it may keep as long as the move takes."""
        ...
