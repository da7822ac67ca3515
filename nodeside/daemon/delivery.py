"""The scheduler's actions, delivered to the clients they name: grants, drops, revocations,
and the pauses and resumes of holders taking turns.

The one place that turns an action into the line its client reads (sent through the router),
logs what admins look for (preemptions, revocations) and feeds the metrics' observers. While
anyone is checkpointed, actions pass the evictor's lines on the way (``nodeside.evict.lines``):
what they let go is sent, the jobs they ask for are started, and what they let go after a job
comes back here. Feature ``memory``: an ``Evict`` is the ``evict`` event, a ``Refuse`` an
``error`` event with code ``room``, an ``Uncounted`` a log line naming the client, and a
``Suspend`` goes to the lines (a checkpoint), whose result goes back to the scheduler
(``Checkpointed``). Feature ``tiers``: ``Spill``, ``Fetch`` and ``PinBudget`` are the ``spill``,
``fetch`` and ``pin_budget`` events; a failed ``TierMoved`` a log line. A grant's line is
cached: it is the same few bytes every time, and encoding it would be work in the middle of a
handoff.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from nodeside import protocol as p
from nodeside.daemon import hostmem
from nodeside.daemon.lograte import RateLimitedLog
from nodeside.daemon.router import TURN_EVENT, Router
from nodeside.evict.evictor import CheckpointEvictor
from nodeside.evict.lines import Checkpoint, Checkpointed, Item, Restore
from nodeside.formats import size
from nodeside.names import label
from nodeside.scheduler.core import (
    Action,
    Drop,
    Evict,
    Evicted,
    Fetch,
    Grant,
    Pause,
    PinBudget,
    Refuse,
    Released,
    Restored,
    Resume,
    Revoke,
    Scheduler,
    Spill,
    Suspend,
    Suspended,
    TierMoved,
    Uncounted,
)

log = logging.getLogger("kiwi.daemon")

#: Seconds between two log lines about one client's refusals for room: a refused kernel asks
#: again (with backoff), and each refusal need not be a line of its own.
REFUSALS_LOGGED_EVERY = 60.0


class Delivery:
    def __init__(self, scheduler: Scheduler, router: Router, clock: Callable[[], float],
                 evictor: CheckpointEvictor | None = None) -> None:
        self.scheduler = scheduler
        self.router = router
        self.clock = clock
        #: Starts the jobs the lines ask for; None: nobody is ever checkpointed.
        self.evictor = evictor
        self.lines = evictor.lines if evictor is not None else None
        #: Called with the seconds between a release arriving and the next grant being sent.
        self.handoff_observers: list[Callable[[float], None]] = []
        #: Called with every list of actions carried out and the time (metrics).
        self.action_observers: list[Callable[[list[Action], float], None]] = []
        #: Each GPU's last grant line, with the quantum it carries: a TQ change replaces it.
        self._grant_lines: dict[int, tuple[float | None, bytes]] = {}
        #: Refusals for room, one line per client (uid and name: a kernel keeps its name when
        #: it connects again) per REFUSALS_LOGGED_EVERY, the next with how many were not.
        self._refusals = RateLimitedLog(log, REFUSALS_LOGGED_EVERY, clock)

    def apply(self, actions: list[Action], handoff_started: float | None = None) -> None:
        """Deliver every action; ``handoff_started``: when the release that led here arrived."""
        if not actions:
            return
        self.observe(actions)
        lines = self.lines
        if lines is None or lines.quiet():
            for action in actions:
                self._send(action, handoff_started)
        else:
            self.carry(lines.take(actions), handoff_started)

    def observe(self, actions: list[Action]) -> None:
        for notify in self.action_observers:
            notify(actions, self.clock())

    def deliver(self, action: Action, handoff_started: float | None = None) -> None:
        """Deliver one action (its observers are told by ``observe``)."""
        lines = self.lines
        if lines is None or lines.quiet():  # nobody is checkpointed: the hot path
            self._send(action, handoff_started)
        else:
            self.carry(lines.take([action]), handoff_started)

    def carry(self, items: list[Item], handoff_started: float | None = None) -> None:
        """Carry out what the evictor's lines let go: send the actions, start the jobs (what
        the lines let go after a job comes back here)."""
        for item in items:
            if isinstance(item, (Checkpoint, Restore)):
                if self.evictor is not None:
                    self.evictor.start(item, self.carry)
            elif isinstance(item, Checkpointed):
                self.apply(self.scheduler.checkpointed(self.clock(), item.client, item.error,
                                                       item.memory_free))
            else:
                self._send(item, handoff_started)

    def _send(self, action: Action, handoff_started: float | None) -> None:
        # A Released sends nothing here: the releaser's reply is its session's; the evictor's
        # lines needed to see it (a checkpoint to take before the next grant).
        if type(action) is Released:
            return
        conn = self.router.by_client.get(action.client)
        if isinstance(action, Grant):
            if conn is not None:
                conn.session.grant_sent()
                conn.send(self._grant_line(action))
            if handoff_started is not None:
                elapsed = time.perf_counter() - handoff_started
                for observe in self.handoff_observers:
                    observe(elapsed)
        elif isinstance(action, Drop):
            log.debug("Asking %s to drop GPU %d (%s, evict=%s)", action.client, action.gpu,
                      action.reason, action.evict)
            if action.evict:  # an evicted working set is charged to the client's cgroup
                self._say_if_no_host_room(action.client)
            if action.reason == p.REASON_PREEMPT:
                log.info("Preempting %s on GPU %d for a non-preemptible request",
                         self.name(action.client), action.gpu)
            if conn is not None:
                conn.send(p.drop_line(action.gpu, action.reason, action.evict, action.grace))
        elif isinstance(action, (Pause, Resume)):
            if conn is not None:  # only the latest matters to a holder that is behind
                conn.send_event(TURN_EVENT, p.encode(
                    p.PAUSE if isinstance(action, Pause) else p.RESUME, gpu=action.gpu))
        elif isinstance(action, Revoke):
            log.warning("Revoked GPU %d from %s (%s): it ignored a drop request for "
                        "%.1f seconds", action.gpu, self.name(action.client),
                        action.client, action.ignored_for)
            if conn is not None:
                conn.send(p.encode(p.REVOKED, gpu=action.gpu, reason=action.reason))
        elif isinstance(action, Evict):
            log.info("Asking %s to move %s to host memory for %s", self.name(action.client),
                     size(action.nbytes), action.for_name)
            self._say_if_no_host_room(action.client)
            if conn is not None:
                conn.send(p.encode(p.EVICT, gpu=action.gpu, bytes=action.nbytes,
                                   **{"for": action.for_name}))
        elif isinstance(action, Refuse):
            client = self.scheduler.clients.get(action.client)
            who = (client.uid, client.name) if client is not None else (None, action.client)
            self._refusals.warning(("room", *who), "Refused %s on GPU %d: %s",
                                   self.name(action.client), action.gpu, action.message)
            if conn is not None:
                conn.send(p.encode(p.ERROR, code=p.E_ROOM, message=action.message))
        elif isinstance(action, Uncounted):
            log.warning("GPU %d: %s (%s) %s; the %d MiB only it says it holds no longer count "
                        "against others' room until it next holds the GPU (its next GPU work "
                        "waits for room)", action.gpu, self.name(action.client), action.client,
                        action.why, action.nbytes >> 20)
        elif isinstance(action, Suspend):
            log.info("Checkpointing idle %s on GPU %d (%s)", self.name(action.client),
                     action.gpu, action.reason)
            lines = self.lines
            if lines is not None:
                self.carry(lines.take([action]))
            else:
                self.carry([Checkpointed(action.client, "no checkpoint evictor runs")])
        elif isinstance(action, Spill):
            log.info("Asking %s to spill %s to disk (%s)", self.name(action.client),
                     "its host memory" if action.nbytes is None else size(action.nbytes),
                     "idle" if action.reason == "idle" else "the host budget runs short")
            if conn is not None:
                conn.send(p.encode(p.SPILL, gpu=action.gpu, bytes=action.nbytes))
        elif isinstance(action, Fetch):
            log.info("Asking %s to bring its memory to the %s (an intent)",
                     self.name(action.client), "GPU" if action.tier == "gpu" else "host")
            if conn is not None:
                conn.send(p.encode(p.FETCH, gpu=action.gpu, tier=action.tier))
        elif isinstance(action, PinBudget):
            if conn is not None:
                conn.send(p.encode(p.PIN_BUDGET, pin_budget=action.nbytes))
        elif isinstance(action, TierMoved):
            if action.failed is not None:
                log.warning("%s could not move its memory to %s: %s", self.name(action.client),
                            action.tier, action.failed)
        elif isinstance(action, (Restored, Evicted, Suspended)):
            pass  # reports: nothing to send (the metrics observe them, ``observe``)

    def name(self, client_id: str) -> str:
        """A client as every view names it (``nodeside.names.label``), for the log."""
        client = self.scheduler.clients.get(client_id)
        return label(client.name, client.display_name, client.user) if client else client_id

    def _say_if_no_host_room(self, client_id: str) -> None:
        client = self.scheduler.clients.get(client_id)
        if client is not None:
            # What its shadows made ahead do not hold yet is the room the eviction takes.
            spare = max(0, client.shadow_bytes - client.host_bytes)
            needed = None if client.evictable is None else max(0, client.evictable - spare)
            shortfall = hostmem.eviction_shortfall(needed, hostmem.room_for(client.pid))
            if shortfall:
                log.warning("Asking %s to evict: %s", self.name(client_id), shortfall)

    def _grant_line(self, grant: Grant) -> bytes:
        quantum = grant.quantum
        cached = self._grant_lines.get(grant.gpu)
        # 30 and 30.0 encode apart: the same quantum is the same value of the same type.
        if cached is not None and cached[0] == quantum and type(cached[0]) is type(quantum):
            return cached[1]
        line = p.grant_line(grant.gpu, quantum)
        self._grant_lines[grant.gpu] = (quantum, line)
        return line
