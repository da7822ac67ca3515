"""What the waiting line says, and when it asks the scheduler for the status document.

The queue position comes from the client itself (``Place``): the daemon tells a waiting client
its position in the ``waiting`` reply and, where it serves the ``position`` feature, in an event
whenever it changes. The status document (who holds the GPU, how long that quantum has left) is
asked for only when the line appears, when the position changes and when the holder's quantum
should have ended; the seconds count down from the document between two. Against a daemon that
sends no position events the line asks on every refresh, as it must. So it does, from a daemon
that keeps resident memory, while this kernel is next: when the holder leaves, the grant may
first wait for another kernel to move its memory out (``waiting_for``), which no position event
tells, and the line follows that move until the grant.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from kiwi_jupyter.kernel.status_view import NAME_WIDTH, Document
from nodeside.formats import seconds
from nodeside.memory_words import (
    keeps_memory,
    tier_failed_words,
    tier_words,
    waiting_for_words,
)
from nodeside.names import current_user, names_by_id

#: Where this kernel stands, asked for while the line is shown: a status document, or None when
#: the scheduler did not answer.
StatusSource = Callable[[], "Document | None"]


@dataclass(frozen=True)
class Place:
    """This kernel's place in the queue as its scheduling client knows it, without asking."""

    position: int | None  # 1-based; None: not known
    live: bool            # the daemon sends an event on every change: no need to ask for one
    #: The scheduler refused the last ask for want of room (its words), and the client asks
    #: again in ``retry_in`` seconds; None while it is not refused.
    refused: str | None = None
    retry_in: float = 0.0


PlaceSource = Callable[[], Place]


def no_place() -> Place:
    return Place(None, live=False)


def describe_refusal(refused: str, waited: float, retry_in: float) -> str:
    """The waiting line while the scheduler says the room this kernel needs cannot be made."""
    again = f"asking again in {retry_in:.0f} s" if retry_in >= 0.5 else "asking again now"
    return (f"kiwi: waiting for room on the GPU ({waited:.0f} s): the scheduler cannot make "
            f"it now: {refused} · {again}")


def describe_wait(document: Document | None, me: str | None, waited: float,
                  position: int | None = None, aged: float = 0.0) -> str:
    """The waiting line's text for one status document. ``position``: the client's own, newer
    than the document's; ``aged``: seconds since the document was read, taken off the quantum."""
    prefix = f"kiwi: waiting for the GPU ({seconds(round(waited))})"
    if document is None and position is None:
        return f"{prefix}, the scheduler did not say where this kernel is"
    document = document or {}
    mine, gpu = _mine_and_gpu(document, me)
    parts = [prefix]
    if position is None and mine:
        position = mine.get("queue_position")
    queue = len(gpu.get("queue", [])) if gpu else 0
    if position is not None:
        parts.append(f"position {position} of {max(queue, position)} in the queue")
    viewer = current_user()
    waiting = waiting_for_words(mine, document, NAME_WIDTH, viewer) if mine else None
    if waiting is not None:
        parts.append(waiting)
    tier = tier_words(mine) if mine else None
    if tier is not None and mine and mine.get("tier") != "gpu":
        parts.append(f"its memory is {tier}")
    failed = tier_failed_words(mine) if mine else None
    if failed is not None:
        parts.append(failed)
    names = names_by_id(document, NAME_WIDTH, viewer)
    holders = [names.get(h, h) for h in gpu.get("holders", [])] if gpu else []
    if holders:
        held = f"held by {', '.join(holders)}"
        left = gpu.get("quantum_remaining") if gpu else None
        if left is not None and left - aged > 0.05:
            held += f", {seconds(left - aged)} left in its quantum"
        elif left is not None:  # not "0.0 s left" while the holder winds its work down
            held += ", its quantum is over and it is giving the GPU back"
        parts.append(held)
    elif gpu is not None:
        parts.append("the GPU is being handed over")
    return " · ".join(parts)


class WaitView:
    """What the line shows, and when to ask the scheduler again: on a change of position, when
    the holder's quantum should have ended, or every look when the position is not live."""

    def __init__(self, status: StatusSource, place: PlaceSource) -> None:
        self._status = status
        self._place = place
        self.document: Document | None = None
        self.asked = 0  # status documents asked for, for tests and benchmarks
        self._read_at = 0.0
        self._position: int | None = None
        self._quantum_end: float | None = None

    def forget(self) -> None:
        """A new wait: the next look asks afresh."""
        self.document = None
        self._read_at = 0.0

    def text(self, me: str | None, waited: float) -> str:
        place = self._place()
        if place.refused is not None:  # its own words: no document needed
            return describe_refusal(place.refused, waited, place.retry_in)
        now = time.monotonic()
        if (self._read_at == 0.0 or not place.live or place.position != self._position
                or (self._quantum_end is not None and now >= self._quantum_end)
                or _moving(self.document, me)):
            self.asked += 1
            self.document = self._status()
            self._read_at, self._position = now, place.position
            self._quantum_end = _quantum_end(self.document, me, now)
        return describe_wait(self.document, me, waited, place.position, now - self._read_at)


def _quantum_end(document: Document | None, me: str | None, now: float) -> float | None:
    """When (monotonic) the holder's quantum on this kernel's GPU ends, if the document says."""
    if document is None:
        return None
    _, gpu = _mine_and_gpu(document, me)
    if gpu is None or gpu.get("quantum_remaining") is None:
        return None
    return now + float(gpu["quantum_remaining"])


def _moving(document: Document | None, me: str | None) -> bool:
    """The last document says this kernel waits for memory to move, or is next where that may
    begin at any time: what it waits for changes without its position changing."""
    if document is None or not keeps_memory(document):
        return False
    mine, _ = _mine_and_gpu(document, me)
    return mine is not None and (bool(mine.get("waiting_for")) or mine.get("queue_position") == 1)


def _mine_and_gpu(document: Document, me: str | None) -> tuple[Document | None, Document | None]:
    """This kernel's client entry and the GPU it waits for (GPU 0 when it is not listed)."""
    mine = next((c for c in document.get("clients", []) if c["id"] == me), None)
    index = mine.get("gpu", 0) if mine else 0
    gpu = next((g for g in document.get("gpus", []) if g.get("index") == index), None)
    return mine, gpu
