"""What the scheduler tells the daemon to do, and the error it raises for a request it refuses.

Each action is a value: compared by its fields, shown by them, hashable, never changed after it
is made. Two are made per handoff, so each writes its own ``__init__`` (``init=False``) rather
than take the dataclass's: compiled (mypyc), a generated ``__init__`` stays interpreted and a
frozen one sets each field through ``object.__setattr__``, ten times what the handoff's other
work costs; ``Final`` fields keep them unchangeable instead (mypy here, the compiled class at
run time).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


class SchedulerError(Exception):
    """A request the scheduler cannot honour; ``code`` is a protocol error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(init=False, unsafe_hash=True)
class Grant:
    client: Final[str]
    gpu: Final[int]
    quantum: Final[float | None]  # None in mode off: no quantum runs

    def __init__(self, client: str, gpu: int, quantum: float | None) -> None:
        self.client = client
        self.gpu = gpu
        self.quantum = quantum


@dataclass(init=False, unsafe_hash=True)
class Drop:
    client: Final[str]
    gpu: Final[int]
    reason: Final[str]
    evict: Final[bool]  # the next holder needs the room: move the working set out first
    grace: Final[float]

    def __init__(self, client: str, gpu: int, reason: str, evict: bool, grace: float) -> None:
        self.client = client
        self.gpu = gpu
        self.reason = reason
        self.evict = evict
        self.grace = grace


@dataclass(init=False, unsafe_hash=True)
class Revoke:
    client: Final[str]
    gpu: Final[int]
    reason: Final[str]
    ignored_for: Final[float]

    def __init__(self, client: str, gpu: int, reason: str, ignored_for: float) -> None:
        self.client = client
        self.gpu = gpu
        self.reason = reason
        self.ignored_for = ignored_for


@dataclass(init=False, unsafe_hash=True)
class Released:
    client: Final[str]
    evict: Final[bool]

    def __init__(self, client: str, evict: bool) -> None:
        self.client = client
        self.evict = evict


@dataclass(init=False, unsafe_hash=True)
class Pause:
    """Mode auto, ``interactive.turns``: hold on to the GPU and its memory, but start no GPU
    work until ``Resume``; another holder beside you has its turn (taking_turns.py)."""

    client: Final[str]
    gpu: Final[int]

    def __init__(self, client: str, gpu: int) -> None:
        self.client = client
        self.gpu = gpu


@dataclass(init=False, unsafe_hash=True)
class Resume:
    """Your turn: GPU work may start again."""

    client: Final[str]
    gpu: Final[int]

    def __init__(self, client: str, gpu: int) -> None:
        self.client = client
        self.gpu = gpu


@dataclass(init=False, unsafe_hash=True)
class Evict:
    """Feature ``memory``: an idle client is asked to move ``nbytes`` of its memory to host
    memory now, for ``for_name`` (who needs the room; residency.py)."""

    client: Final[str]
    gpu: Final[int]
    nbytes: Final[int]
    for_name: Final[str]

    def __init__(self, client: str, gpu: int, nbytes: int, for_name: str) -> None:
        self.client = client
        self.gpu = gpu
        self.nbytes = nbytes
        self.for_name = for_name


@dataclass(init=False, unsafe_hash=True)
class Suspend:
    """Feature ``memory``: checkpoint an idle client's process (the daemon's checkpoint
    evictor reaches it): it did not answer an ``Evict`` in time (``reason`` "timeout"), or it
    has been evicted and idle for ``checkpoint_after`` ("idle")."""

    client: Final[str]
    gpu: Final[int]
    reason: Final[str]

    def __init__(self, client: str, gpu: int, reason: str) -> None:
        self.client = client
        self.gpu = gpu
        self.reason = reason


@dataclass(init=False, unsafe_hash=True)
class Refuse:
    """Feature ``memory``: the room a waiter needs cannot be made; it is idle again and is told
    why (an ``error`` event, code ``room``)."""

    client: Final[str]
    gpu: Final[int]
    message: Final[str]

    def __init__(self, client: str, gpu: int, message: str) -> None:
        self.client = client
        self.gpu = gpu
        self.message = message


@dataclass(init=False, unsafe_hash=True)
class Uncounted:
    """Feature ``memory``: an idle client could not evict (``why``) and nobody can checkpoint
    it, so the ``nbytes`` only its claim says it holds (NVML does not vouch for them) no longer
    count against others' room until its next grant; its own next GPU work waits for room."""

    client: Final[str]
    gpu: Final[int]
    nbytes: Final[int]
    why: Final[str]

    def __init__(self, client: str, gpu: int, nbytes: int, why: str) -> None:
        self.client = client
        self.gpu = gpu
        self.nbytes = nbytes
        self.why = why


@dataclass(init=False, unsafe_hash=True)
class Restored:
    """Feature ``memory``: a client granted after an eviction has all its memory back on the
    GPU, ``seconds`` after that grant (the metrics' restore time)."""

    client: Final[str]
    gpu: Final[int]
    seconds: Final[float]

    def __init__(self, client: str, gpu: int, seconds: float) -> None:
        self.client = client
        self.gpu = gpu
        self.seconds = seconds


@dataclass(init=False, unsafe_hash=True)
class Evicted:
    """Feature ``memory``: a client's eviction ended, its memory in host memory: ``nbytes``
    moved, in ``seconds`` as the client measured them (None: it did not say)."""

    client: Final[str]
    gpu: Final[int]
    seconds: Final[float | None]
    nbytes: Final[int]

    def __init__(self, client: str, gpu: int, seconds: float | None, nbytes: int) -> None:
        self.client = client
        self.gpu = gpu
        self.seconds = seconds
        self.nbytes = nbytes


@dataclass(init=False, unsafe_hash=True)
class Suspended:
    """Feature ``memory``: the checkpoint a ``Suspend`` asked for is done; ``nbytes`` of the
    client's memory are in host memory now."""

    client: Final[str]
    gpu: Final[int]
    nbytes: Final[int]

    def __init__(self, client: str, gpu: int, nbytes: int) -> None:
        self.client = client
        self.gpu = gpu
        self.nbytes = nbytes


@dataclass(init=False, unsafe_hash=True)
class Spill:
    """Feature ``tiers``: an idle evicted client is asked to move ``nbytes`` of its host copy
    (None: all of it) to its spill files (tiers.py), because ``reason``: "idle" (past
    ``spill_after``) or "budget" (the host budget runs short)."""

    client: Final[str]
    gpu: Final[int]
    nbytes: Final[int | None]
    reason: Final[str]

    def __init__(self, client: str, gpu: int, nbytes: int | None, reason: str) -> None:
        self.client = client
        self.gpu = gpu
        self.nbytes = nbytes
        self.reason = reason


@dataclass(init=False, unsafe_hash=True)
class Fetch:
    """Feature ``tiers``: an idle client is about to work (an intent): bring its memory to
    ``tier`` ("host": from disk; "gpu": on to the GPU, where it fits now)."""

    client: Final[str]
    gpu: Final[int]
    tier: Final[str]

    def __init__(self, client: str, gpu: int, tier: str) -> None:
        self.client = client
        self.gpu = gpu
        self.tier = tier


@dataclass(init=False, unsafe_hash=True)
class PinBudget:
    """Feature ``tiers``: the most host memory the client may keep pinned from now on."""

    client: Final[str]
    gpu: Final[int]
    nbytes: Final[int]

    def __init__(self, client: str, gpu: int, nbytes: int) -> None:
        self.client = client
        self.gpu = gpu
        self.nbytes = nbytes


@dataclass(init=False, unsafe_hash=True)
class TierMoved:
    """Feature ``tiers``: a move between host memory and disk ended, to ``tier`` (``failed``:
    it could not; its memory stayed where it was): ``nbytes`` in ``seconds`` as the client
    says (the metrics)."""

    client: Final[str]
    gpu: Final[int]
    tier: Final[str]
    nbytes: Final[int]
    seconds: Final[float | None]
    failed: Final[str | None]

    def __init__(self, client: str, gpu: int, tier: str, nbytes: int, seconds: float | None,
                 failed: str | None) -> None:
        self.client = client
        self.gpu = gpu
        self.tier = tier
        self.nbytes = nbytes
        self.seconds = seconds
        self.failed = failed


#: What the core says to do or reports. The last four only report (the metrics observe them):
#: the shell learns what the core changed from them, never by reading its fields.
Action = Grant | Drop | Revoke | Released | Pause | Resume | Evict | Suspend | Refuse | Uncounted \
    | Spill | Fetch | PinBudget | Restored | Evicted | Suspended | TierMoved
