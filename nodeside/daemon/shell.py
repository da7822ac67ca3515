"""The daemon's side of every connection: what a connection opening, its requests and its loss
make the daemon do.

``Shell`` is the ``Router`` connections talk to. Admission decides who may stay; each request's
``Outcome`` is carried out in its order (replies to the peer, the scheduler's actions to the
clients they name through ``Delivery``); a change of mode or TQ is saved and told to every
greeted peer; the timers (``timers.py``) are told when a deadline, a queue or the status
document may have moved. Nothing here decides who gets a GPU or what a peer may say.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from nodeside import protocol as p
from nodeside.daemon.admission import Admission
from nodeside.daemon.delivery import Delivery
from nodeside.daemon.requests import Requests
from nodeside.daemon.router import Endpoint, Router
from nodeside.daemon.session import Outcome
from nodeside.daemon.state_file import StateFile
from nodeside.daemon.timers import Timers
from nodeside.evict.evictor import CheckpointEvictor
from nodeside.limits import MAX_OWED_BYTES_TOTAL
from nodeside.scheduler.core import Scheduler

log = logging.getLogger("kiwi.daemon")


class Shell(Router):
    def __init__(self, requests: Requests, now: Callable[[], float],
                 loop: asyncio.AbstractEventLoop, admission: Admission, state: StateFile,
                 evictor: CheckpointEvictor | None = None) -> None:
        super().__init__(requests, now, loop)
        self.requests = requests
        self.scheduler: Scheduler = requests.scheduler
        self.admission = admission
        self.state = state
        self.evictor = evictor
        # Made here, for they send through this router.
        self.delivery = Delivery(self.scheduler, self, now, evictor)
        self.timers = Timers(loop, now, self.scheduler, self, self.delivery, admission,
                             requests)
        #: A request of this turn may have moved the scheduler's next deadline.
        self._reschedule = False
        #: Peers that stopped reading what they are owed, the one behind longest first.
        self.behind: dict[Endpoint, None] = {}

    # -- connections --------------------------------------------------------------------------

    def opened(self, endpoint: Endpoint) -> None:
        session = endpoint.session
        verdict = self.admission.admit(session, self.now())
        for victim in verdict.evicted:
            old = self.by_session.get(victim)
            if old is not None:
                self._limited("Closing idle unregistered connection [FD=%d] of uid %s to "
                              "make room for a new one", old.session.peer.fd, victim.peer.uid)
                old.refuse(p.E_LIMIT, "closed to make room: this connection never registered")
        if not verdict.accepted:
            self._limited("Refused a connection from uid %s: %s", session.peer.uid,
                          verdict.reason)
            endpoint.refuse(p.E_LIMIT, verdict.reason)
            return
        self.add(endpoint)
        self.timers.arm_sweep()

    def carry_out(self, endpoint: Endpoint, outcome: Outcome) -> None:
        started = time.perf_counter() if outcome.handoff and \
            self.delivery.handoff_observers else None
        delivery = self.delivery  # called on, not bound: see DaemonConnection._take_turn
        for item in outcome.out:
            if type(item) is bytes:
                endpoint.send(item)
            else:
                delivery.deliver(item, started)  # type: ignore[arg-type]
        if delivery.action_observers:  # metrics: the list is made only for them
            actions = [i for i in outcome.out if not isinstance(i, bytes)]
            if actions:
                delivery.observe(actions)
        if not endpoint.settled:
            self._settle(endpoint)
        if outcome.broadcast is not None:
            self.state.save_from(self.scheduler)
            self.broadcast(outcome.broadcast)
        if outcome.close:
            endpoint.close()
        if outcome.reschedule:
            self._reschedule = True  # once per turn (end_turn), not once per request
        timers = self.timers
        # Nobody listening (the usual case): not even a call to say so.
        if outcome.gpus and timers.positions.listeners:
            timers.queues_moved(outcome.gpus)
        if outcome.changed and timers.changes.listeners:
            timers.note_change()

    def _settle(self, endpoint: Endpoint) -> None:
        """Note a connection's client and the events it asked for, once it has said them."""
        session = endpoint.session
        if session.client_id is not None and session.client_id not in self.by_client:
            self.by_client[session.client_id] = endpoint
            self.admission.registered(session)
        if session.greeted and not endpoint.counted_as_listener:
            endpoint.counted_as_listener = True
            if p.FEATURE_POSITION in session.features:
                self.timers.positions.listeners += 1
            if p.FEATURE_CHANGES in session.features:
                self.timers.changes.listeners.add(session)
        # Both said: nothing more to note for this connection, on any later request.
        endpoint.settled = endpoint.counted_as_listener and session.client_id is not None

    def end_turn(self, now: float) -> None:
        """Recompute the next deadline if a request of this turn asked for it."""
        if self._reschedule:
            self._reschedule = False
            self.timers.arm_deadline_at(now)
        # Memory reports ask for the working sets without asking for a new deadline.
        if self.requests.working_sets_waiting:
            self.requests.working_sets_waiting = False
            self.timers.arm_working_sets()

    def lost(self, endpoint: Endpoint) -> None:
        session = endpoint.session
        self.remove(endpoint)
        self.behind.pop(endpoint, None)
        self.admission.gone(session)
        timers = self.timers
        if endpoint.counted_as_listener and p.FEATURE_POSITION in session.features:
            timers.positions.listeners -= 1
        timers.changes.listeners.discard(session)
        client_id = session.client_id
        if client_id is None:
            return
        timers.note_change()  # a client gone: its row, and what it held or waited for
        self.requests.forget(client_id)
        if self.evictor is not None:
            self.delivery.carry(self.evictor.forget(client_id))
        client = self.scheduler.clients.get(client_id)
        if client is not None and client.state != "idle":
            log.info("Client %s (%s) went away while %s; freeing it [FD=%d]", session.label,
                     client_id, client.state, session.peer.fd)
        else:
            log.info("Client %s (%s) disconnected [FD=%d]", session.label, client_id,
                     session.peer.fd)
        gpu = client.gpu if client is not None else None
        self.delivery.apply(self.scheduler.unregister(self.now(), client_id),
                            handoff_started=time.perf_counter())
        timers.arm_deadline()
        if gpu is not None:
            timers.queues_moved((gpu,))

    def stall_timeout(self) -> float:
        return self.admission.limits.stall_timeout

    def stalled(self, endpoint: Endpoint, seconds: float) -> None:
        self.behind.pop(endpoint, None)
        session = endpoint.session
        self.requests.warnings.warning(
            ("stalled", session.peer.uid), "Cutting off %s (uid %s) [FD=%d]: it left what the "
            "daemon owes it unread for %.1f s (connections.stall_timeout)", session.label,
            session.peer.uid, session.peer.fd, seconds)
        endpoint.cut_off()

    def fell_behind(self, endpoint: Endpoint) -> None:
        """Past MAX_OWED_BYTES_TOTAL owed to peers that do not read, the one behind longest
        is cut off (and the next, until the rest fits)."""
        self.behind[endpoint] = None
        owed = sum(behind.owed() for behind in self.behind)
        while owed > MAX_OWED_BYTES_TOTAL and len(self.behind) > 1:
            oldest = next(iter(self.behind))
            owed -= oldest.owed()
            session = oldest.session
            self.requests.warnings.warning(
                ("overflow", session.peer.uid), "Cutting off %s (uid %s) [FD=%d]: the peers "
                "that do not read are owed more than %d MiB together, and it is behind "
                "longest", session.label, session.peer.uid, session.peer.fd,
                MAX_OWED_BYTES_TOTAL >> 20)
            del self.behind[oldest]
            oldest.cut_off()

    def kept_up(self, endpoint: Endpoint) -> None:
        self.behind.pop(endpoint, None)

    def _limited(self, message: str, *args: Any) -> None:
        self.requests.warnings.warning(message, message, *args)
