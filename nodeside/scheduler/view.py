"""What a scheduling policy sees of the node: a read-only view, and the events it learns from.

A policy (choosing.py, interactive.py) decides who goes next; it never changes the node. It reads
six things through ``PolicyView``: a pool's rules, each pool's share of a GPU's time, a GPU's TQ,
whether any pool has a maximum, the settings and the mode. The GPUs and clients it is asked about
come as arguments. What happens to holds comes as events to ``observe``: a grant, a holder
keeping the GPU at its quantum's end, a hold ending, a pause and a resume while holders take
turns, a client gone. A policy that remembers nothing (round robin) is sent none.

The node's state (node.py) is the one view there is; it names ``PolicyView`` as its base so that
the compiled core calls it directly rather than by name.
"""

from __future__ import annotations

from typing import Protocol, final

from nodeside.config import SchedulerConfig
from nodeside.model import Pool
from nodeside.scheduler.gpu_state import ClientRecord, GpuState

__all__ = ["Event", "Gone", "Granted", "HoldEnded", "Kept", "Paused", "PolicyView", "Resumed"]


class PolicyView(Protocol):
    """The node as a policy may read it. A policy never writes through it: the two attributes
    are attributes only so that the compiled core reads them as cheaply as the rules do."""

    #: ``on``, ``off`` or ``auto``, as the admin set it.
    mode: str
    #: Does any pool have a maximum below the whole GPU? (Most nodes have none, and then no
    #: share needs measuring to know that a pool is below it.)
    capped: bool

    @property
    def settings(self) -> SchedulerConfig:
        """The daemon's settings: read each time, as a reload (SIGHUP) replaces them."""
        ...

    def pool(self, name: str) -> Pool:
        """The named pool's guarantee, weight and maximum (a pool the config does not name has
        guarantee 0 and weight 1)."""
        ...

    def tq_for(self, gpu: int) -> float:
        """The TQ on GPU ``gpu``: its own where the admin set one, else the node's."""
        ...

    def shares(self, gpu: int, now: float) -> dict[str, float]:
        """Each contending pool's share of GPU ``gpu``'s time over the share window."""
        ...


class Event:
    """Something that happened on ``gpu`` to ``client`` at ``now``, told to the policy."""

    def __init__(self, gpu: GpuState, client: ClientRecord, now: float) -> None:
        self.gpu = gpu
        self.client = client
        self.now = now


@final
class Granted(Event):
    """``client`` was granted the GPU: out of the waiters, its hold open, and its
    ``requested_at`` still saying when it asked (a request that went on after a drop is told
    from a new one by that, not by when it was granted)."""


@final
class Kept(Event):
    """``client``'s quantum ended with others waiting, and it won again at the tail."""


@final
class HoldEnded(Event):
    """``client``'s hold ends now; its ``hold`` still says how (the drop's reason, if any)."""


@final
class Paused(Event):
    """``client`` holds on, paused while a holder beside it has its turn (taking_turns.py)."""


@final
class Resumed(Event):
    """``client``'s turn: it works again."""


@final
class Gone(Event):
    """``client`` left the node: whatever the policy keeps of it can go."""
