"""The daemon's timers: the scheduler's next deadline, the connection deadlines, and the rounds
of queue-position and ``changed`` events.

Six timers on the event loop, five armed from a sans-I/O answer: the scheduler's
``next_deadline`` (a quantum's end, a drop's grace), ``Admission.next_check`` (hello and idle
limits), ``WorkingSetDamper.next_due`` (a working set that waited its turn), ``PositionNotices``
and ``ChangeNotices`` (when the next round of events is due), and the host's memory read every
``HOST_READ_EVERY`` seconds. When one fires, this file asks the
same object what is due and sends it through the router. The
time is the daemon's clock (the loop's), so a test on a virtual-time loop runs them all in
milliseconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from nodeside import protocol as p
from nodeside.daemon.admission import Admission
from nodeside.daemon.changes import CHANGED_LINE, ChangeNotices
from nodeside.daemon.delivery import Delivery
from nodeside.daemon.positions import INTERVAL as POSITION_INTERVAL
from nodeside.daemon.positions import PositionNotices
from nodeside.daemon.requests import Requests
from nodeside.daemon.router import CHANGED_EVENT, POSITION_EVENT, Router
from nodeside.scheduler.core import Scheduler
from nodeside.scheduler.tiers import HOST_READ_EVERY


class Timers:
    def __init__(self, loop: asyncio.AbstractEventLoop, now: Callable[[], float],
                 scheduler: Scheduler, router: Router, delivery: Delivery,
                 admission: Admission, requests: Requests) -> None:
        self.loop = loop
        self.requests = requests
        self.now = now
        self.scheduler = scheduler
        self.router = router
        self.delivery = delivery
        self.admission = admission
        self.warnings = requests.warnings
        self.positions = PositionNotices()
        self.changes = ChangeNotices()
        self._deadline: asyncio.TimerHandle | None = None
        self._deadline_at: float | None = None
        self._sweep: asyncio.TimerHandle | None = None
        self._sweep_at: float | None = None
        self._working_sets: asyncio.TimerHandle | None = None
        self._working_sets_at: float | None = None
        self._host_reads: asyncio.TimerHandle | None = None

    def close(self) -> None:
        for timer in (self._deadline, self._sweep, self._working_sets, self._host_reads):
            if timer is not None:
                timer.cancel()

    # -- the host's memory --------------------------------------------------------------------

    def arm_host_reads(self) -> None:
        """Read MemAvailable every ``HOST_READ_EVERY`` seconds: the measured host budget follows
        what the host's other tenants take (tiers.py)."""
        self._host_reads = self.loop.call_later(HOST_READ_EVERY, self._on_host_read)

    def _on_host_read(self) -> None:
        budget = self.scheduler.host_budget
        actions = self.requests.tiers.read_host_memory(self.now())
        self.delivery.apply(actions)
        self.arm_deadline()
        if actions:
            self.queues_moved(self.scheduler.gpus)
        if actions or self.scheduler.host_budget != budget:
            self.note_change()
        self.arm_host_reads()

    # -- the scheduler's deadline -------------------------------------------------------------

    def arm_deadline(self) -> None:
        self.arm_deadline_at(self.now())

    def arm_deadline_at(self, now: float) -> None:
        """Arm the timer for the scheduler's next deadline as it stands at ``now``."""
        deadline = self.scheduler.next_deadline(now)
        if self._deadline_at is not None and (deadline is None or self._deadline_at <= deadline):
            # The armed timer fires first: it ticks (a tick with nothing due does nothing) and
            # arms the next one then. Moving it later on every handoff (each grant starts a
            # quantum) would cancel and make a timer per handoff for a wake-up a TQ away.
            return
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline_at = deadline
        self._deadline = None if deadline is None \
            else self.loop.call_at(deadline, self._on_deadline)

    def _on_deadline(self) -> None:
        self._deadline = self._deadline_at = None
        actions = self.scheduler.tick(self.now())
        self.delivery.apply(actions)
        self.arm_deadline()
        if actions:
            self.queues_moved(self.scheduler.gpus)
            self.note_change()

    # -- working sets that waited (``working_sets.py``) -------------------------------------

    def arm_working_sets(self) -> None:
        due = self.requests.reports_next_due()
        if due is None or (self._working_sets_at is not None and self._working_sets_at <= due):
            return
        if self._working_sets is not None:
            self._working_sets.cancel()
        self._working_sets_at = due
        self._working_sets = self.loop.call_at(due, self._on_working_sets)

    def _on_working_sets(self) -> None:
        self._working_sets = self._working_sets_at = None
        actions = self.requests.working_sets_due(self.now())
        self.delivery.apply(actions)
        self.arm_working_sets()
        self.arm_deadline()
        self.queues_moved(self.scheduler.gpus)
        self.note_change()

    # -- connection deadlines -----------------------------------------------------------------

    def arm_sweep(self) -> None:
        due = self.admission.next_check()
        if due is not None and (self._sweep_at is None or due < self._sweep_at):
            if self._sweep is not None:
                self._sweep.cancel()
            self._sweep_at = due
            self._sweep = self.loop.call_at(due, self._on_sweep)

    def _on_sweep(self) -> None:
        self._sweep = self._sweep_at = None
        for session, reason in self.admission.expired(self.now()):
            if session in self.router.by_session:
                message = "Closing connection [FD=%d] of uid %s: %s"
                self.warnings.warning(message, message, session.peer.fd, session.peer.uid,
                                      reason)
                self.router.refuse(session, p.E_LIMIT, f"closed: {reason}")
        self.arm_sweep()

    # -- rounds of events -----------------------------------------------------------------------

    def queues_moved(self, gpus: Iterable[int]) -> None:
        """These GPUs' queues may have moved: a round of position events, if none is due."""
        if self.positions.mark(gpus):
            self.loop.call_later(POSITION_INTERVAL, self._tell_positions)

    def _tell_positions(self) -> None:
        router = self.router
        for session, line in self.positions.collect(self.scheduler, router.session_of,
                                                    self.now()):
            router.send_event_to(session, POSITION_EVENT, line)

    def note_change(self) -> None:
        """Something the status document shows changed: a round of ``changed`` events."""
        self.requests.generation += 1  # kept status documents are built again
        now = self.now()
        due = self.changes.mark(now)
        if due is None:
            return
        if due <= now:  # after this turn: the grant that changed things is written first
            self.loop.call_soon(self._tell_changes)
        else:
            self.loop.call_at(due, self._tell_changes)

    def _tell_changes(self) -> None:
        for session in self.changes.collect(self.now()):
            self.router.send_event_to(session, CHANGED_EVENT, CHANGED_LINE)
