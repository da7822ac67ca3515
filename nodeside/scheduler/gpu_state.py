"""What the scheduler knows of each GPU: its holders and waiters, its meter and its quanta.

The clients and their hold state are ``clients.py``; the waiters' order is ``queue.py``. The
names are all here too, as the rest of the core and the daemon import them from this module.
"""

from __future__ import annotations

from dataclasses import dataclass

from nodeside.scheduler.clients import TRANSITIONS, ClientRecord, Hold, HoldState, IllegalTransition
from nodeside.scheduler.history import HolderHistory
from nodeside.scheduler.ledger import Ledger
from nodeside.scheduler.pools import ShareMeter
from nodeside.scheduler.queue import PRIORITY_RANK, WaitQueue

__all__ = ["EVICT_MODES", "PRIORITY_RANK", "TRANSITIONS", "ClientRecord", "GpuSpec", "GpuState",
           "Hold", "HoldState", "IllegalTransition", "WaitQueue"]

EVICT_MODES = ("managed", "checkpoint", "vmm")


@dataclass(frozen=True)
class GpuSpec:
    index: int
    name: str = "GPU"
    uuid: str | None = None
    memory_total: int | None = None


class GpuState:
    def __init__(self, spec: GpuSpec, tq_override: float | None, now: float) -> None:
        self.spec = spec
        self.holders: dict[str, ClientRecord] = {}  # in grant order
        #: What fits in its memory: the idle memory clients' bytes and the one fit function.
        self.ledger = Ledger(spec.memory_total, self.holders)
        self.waiters = WaitQueue()
        self.meter = ShareMeter(0.0, now)
        #: Recent holds, whole and named, for the status document's timeline (history.py).
        self.history = HolderHistory()
        #: How often the TQ override changed: a next deadline computed since still holds.
        self.tq_changes = 0
        self._tq_override = tq_override
        #: The waiter a leaving holder was dropped for; served first by the next schedule.
        self.promised: str | None = None
        #: Holders paused for another's turn (taking_turns.py): with none, and turns off, a
        #: handoff never looks at turns.
        self.paused = 0
        #: GPU seconds of ended holds, by pool, since start: metrics count them as counters
        #: that must not fall when a client goes away. See Scheduler.pool_gpu_seconds.
        self.pool_seconds: dict[str, float] = {}
        #: Clients on this GPU that speak the ``memory`` feature (residency.py): their resident
        #: memory counts in every "does it fit" (booked in the ledger). Empty, the rules are
        #: those of holders only.
        self.memory_clients: dict[str, ClientRecord] = {}
        #: Evictions asked on this GPU, by reason: ``room`` (for a grant), ``release`` (a holder
        #: released ``evicting``), ``timeout``, ``failed``, ``checkpoint`` and ``idle``
        #: (checkpoints after no progress, a failed eviction, a failed checkpoint, a long idle
        #: spell), for the metrics; and those for room by the priority of who asked.
        self.evictions: dict[str, int] = {}
        self.evictions_by: dict[str, int] = {}
        #: A waiter for room may ask idle clients to evict again then (fair_eviction.py's
        #: intervals); None: nothing waits for that.
        self.evict_retry_at: float | None = None

    @property
    def tq_override(self) -> float | None:
        """This GPU's own TQ, where the admin set one."""
        return self._tq_override

    @tq_override.setter
    def tq_override(self, seconds: float | None) -> None:
        self._tq_override = seconds
        self.tq_changes += 1
