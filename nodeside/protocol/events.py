"""What ``ClientSession`` tells its shell after reading the daemon's lines.

Each event carries the message it came from. The session has already moved its own state (the
hold, the queue position, the mode); an event says what the shell may have to do about it: wake
a waiter, answer a future, set ``drop_requested``, evict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Event:
    message: dict[str, Any]


@dataclass(frozen=True)
class Ready(Event):
    """The connection is usable: welcomed, and registered when the session registers.
    ``message`` is the welcome; ``registered`` the reply to register, if any."""

    registered: dict[str, Any] | None = None


@dataclass(frozen=True)
class Refused(Event):
    """The daemon refused the hello or the register (an error): the connection is no use."""


@dataclass(frozen=True)
class Reply(Event):
    """The answer to a request made with ``ClientSession.request`` (an error included)."""

    seq: int = 0


@dataclass(frozen=True)
class Granted(Event):
    """The GPU is this client's now (or again: a drop was withdrawn)."""


@dataclass(frozen=True)
class Queued(Event):
    """Waiting, at ``position`` (1-based): the answer to the acquire, or a position event."""

    position: int | None = None


@dataclass(frozen=True)
class DropAsked(Event):
    """The daemon wants the GPU back (``message`` has reason, evict, grace). ``answer``: it is
    the answer to a release with ``evict_first``: evict, then release."""

    answer: bool = False


@dataclass(frozen=True)
class Revoked(Event):
    """The daemon took the GPU back. ``held``: the session held it until now (otherwise the
    revocation crossed a release of ours, and changes nothing)."""

    held: bool = False


@dataclass(frozen=True)
class Released(Event):
    """The daemon's ``released``: to a cancel or release this session waited for (``answer``),
    or to a release it did not wait for. ``evict`` true after a hold was handed over means the
    next holder needed the room (a daemon that predates ``evict_first``)."""

    answer: bool = False

    @property
    def evict(self) -> bool:
        return self.message.get("evict") is True


@dataclass(frozen=True)
class AskRefused(Event):
    """The daemon answered the acquire with an error: nothing is asked any more."""


@dataclass(frozen=True)
class TurnPaused(Event):
    """A holder beside this one has its turn: start no GPU work until resumed."""


@dataclass(frozen=True)
class TurnResumed(Event):
    """This holder's turn: GPU work may go on."""


@dataclass(frozen=True)
class ModeChanged(Event):
    """The scheduler's mode or TQ changed (``ClientSession.mode``, ``.tq`` have them)."""


@dataclass(frozen=True)
class StatusChanged(Event):
    """The status document reads otherwise now (feature ``changes``)."""


@dataclass(frozen=True)
class DaemonError(Event):
    """An error that answers nothing of ours: a line the daemon could not read, or a fatal
    complaint before it closes the connection."""
