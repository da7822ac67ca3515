"""What ``ClientSession`` tells its shell after reading the daemon's lines.

Each event carries the message it came from. The session has already moved its own state (the
hold, the queue position, the mode); an event says what the shell may have to do about it: wake
a waiter, answer a future, set ``drop_requested``, evict. Plain classes with slots, not
dataclasses: one or two are made for every line a client reads, and a client imports them.
"""

from __future__ import annotations

from typing import Any


class Event:
    __slots__ = ("message",)

    def __init__(self, message: dict[str, Any]) -> None:
        self.message = message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r})"


class Ready(Event):
    """The connection is usable: welcomed, and registered when the session registers.
    ``message`` is the welcome; ``registered`` the reply to register, if any."""

    __slots__ = ("registered",)

    def __init__(self, message: dict[str, Any],
                 registered: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.registered = registered


class Refused(Event):
    """The daemon refused the hello or the register (an error): the connection is no use."""

    __slots__ = ()


class Reply(Event):
    """The answer to a request made with ``ClientSession.request`` (an error included)."""

    __slots__ = ("seq",)

    def __init__(self, message: dict[str, Any], seq: int) -> None:
        super().__init__(message)
        self.seq = seq


class Granted(Event):
    """The GPU is this client's now (or again: a drop was withdrawn)."""

    __slots__ = ()


class Queued(Event):
    """Waiting, at ``position`` (1-based): the answer to the acquire, or a position event."""

    __slots__ = ("position",)

    def __init__(self, message: dict[str, Any], position: int | None) -> None:
        super().__init__(message)
        self.position = position


class DropAsked(Event):
    """The daemon wants the GPU back (``message`` has reason, evict, grace). ``answer``: it is
    the answer to a release with ``evict_first``: evict, then release."""

    __slots__ = ("answer",)

    def __init__(self, message: dict[str, Any], answer: bool = False) -> None:
        super().__init__(message)
        self.answer = answer


class EvictAsked(Event):
    """Feature ``memory``: the daemon asks this idle client to move its memory to host memory
    now (``message`` has gpu, bytes and ``for``, who needs the room). The client reports as it
    goes and ends with ``evicted``."""

    __slots__ = ()

    @property
    def nbytes(self) -> int:
        nbytes = self.message.get("bytes")
        return nbytes if isinstance(nbytes, int) and not isinstance(nbytes, bool) else 0

    @property
    def for_name(self) -> str:
        return str(self.message.get("for") or "")


class SpillAsked(Event):
    """Feature ``tiers``: the daemon asks this idle evicted client to move its host copy to
    its spill files (``message`` has gpu, and bytes where not all of it); it reports as it goes
    and ends with ``tier_moved``."""

    __slots__ = ()

    @property
    def nbytes(self) -> int | None:
        nbytes = self.message.get("bytes")
        return nbytes if isinstance(nbytes, int) and not isinstance(nbytes, bool) else None


class FetchAsked(Event):
    """Feature ``tiers``: a hint that this idle client is about to work: bring its memory to
    ``tier`` ("host": from disk, ending in ``tier_moved``; "gpu": on to the GPU, ending in a
    ``working_set`` with ``host`` 0)."""

    __slots__ = ()

    @property
    def tier(self) -> str:
        return str(self.message.get("tier") or "")


class PinBudgetSet(Event):
    """Feature ``tiers``: the most host memory this client may keep pinned from now on
    (``ClientSession.pin_budget`` has it)."""

    __slots__ = ()


class Revoked(Event):
    """The daemon took the GPU back. ``held``: the session held it until now (otherwise the
    revocation crossed a release of ours, and changes nothing)."""

    __slots__ = ("held",)

    def __init__(self, message: dict[str, Any], held: bool) -> None:
        super().__init__(message)
        self.held = held


class Released(Event):
    """The daemon's ``released``: to a cancel or release this session waited for (``answer``),
    or to a release it did not wait for. ``evict`` true after a hold was handed over means the
    next holder needed the room (a daemon that predates ``evict_first``)."""

    __slots__ = ("answer",)

    def __init__(self, message: dict[str, Any], answer: bool = False) -> None:
        super().__init__(message)
        self.answer = answer

    @property
    def evict(self) -> bool:
        return self.message.get("evict") is True


class AskRefused(Event):
    """The daemon answered the acquire with an error, or ended the wait with an ``error`` event
    whose code is ``room`` (the room it needs cannot be made): nothing is asked any more."""

    __slots__ = ()


class TurnPaused(Event):
    """A holder beside this one has its turn: start no GPU work until resumed."""

    __slots__ = ()


class TurnResumed(Event):
    """This holder's turn: GPU work may go on."""

    __slots__ = ()


class ModeChanged(Event):
    """The scheduler's mode or TQ changed (``ClientSession.mode``, ``.tq`` have them)."""

    __slots__ = ()


class StatusChanged(Event):
    """The status document reads otherwise now (feature ``changes``)."""

    __slots__ = ()


class DaemonError(Event):
    """An error that answers nothing of ours: a line the daemon could not read, or a fatal
    complaint before it closes the connection."""

    __slots__ = ()
