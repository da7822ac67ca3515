"""What each request does: the node's side of every session, calling the scheduler.

``Requests`` is shared by all sessions of one daemon. Each ``_on_<op>`` takes a session, the
checked message, its seq and the time, calls the scheduler, and returns an ``Outcome``; what it
changes of the session (a hello's features, a registration, a position told) is in the outcome,
for the session to take. Values a peer chose are checked against ``nodeside.limits`` before the
scheduler sees them. Nothing here does I/O; logging is the only thing it says to the world.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from nodeside import __version__, limits
from nodeside import protocol as p
from nodeside.daemon.documents import StatusDocuments, StatusMeter
from nodeside.daemon.lograte import RateLimitedLog
from nodeside.daemon.memory_reports import Figures, MemoryReports, standing
from nodeside.daemon.peer import is_admin
from nodeside.daemon.registration import Registrations
from nodeside.daemon.session import Outcome, Rules, Session
from nodeside.daemon.tier_requests import TierRequests, byte_figure, said_seconds
from nodeside.daemon.working_sets import WorkingSetDamper
from nodeside.evict.evictor import CheckpointEvictor
from nodeside.evict.lines import EvictionLines
from nodeside.model import MemoryFigures
from nodeside.names import label
from nodeside.scheduler.core import (
    Action,
    ClientRecord,
    Drop,
    Grant,
    Pause,
    Released,
    Resume,
    Scheduler,
    SchedulerError,
)
from nodeside.scheduler.gpu_state import EVICT_MODES
from nodeside.scheduler.residency import check_claim

log = logging.getLogger("kiwi.daemon")

#: Requests after which the scheduler's next deadline cannot have moved.
_NO_RESCHEDULE = frozenset({p.HELLO, p.REGISTER, p.STATUS, p.PING, p.WORKING_SET, p.INTENT})
#: Requests after which the status document reads the same (every other one may change it:
#: a client came, asked, gave back, or the mode or TQ moved). A working set (or memory) report
#: says so itself when the scheduler heard it (memory_reports.py, working_sets.py).
#: An intent says so itself when the scheduler acted on it (tier_requests.py).
_NO_CHANGE = frozenset({p.HELLO, p.STATUS, p.PING, p.WORKING_SET, p.INTENT})


class Requests(Rules):
    def __init__(self, scheduler: Scheduler, admin_gid: int | None,
                 memory_used: Callable[[], Mapping[int, int | None]] = dict,
                 evictor: CheckpointEvictor | None = None,
                 namespace_of: Callable[[int | None], str | None] | None = None) -> None:
        self.scheduler = scheduler
        self.admin_gid = admin_gid
        self.memory_used = memory_used
        self.warnings = RateLimitedLog(log)
        self.registrations = Registrations(scheduler, namespace_of)
        #: What the scheduler hears of working sets and memory figures: rate-limited and
        #: damped per client.
        self.working_sets = WorkingSetDamper()
        self.memory_reports = MemoryReports()
        #: A working set waits in the damper: the shell arms its timer at the turn's end.
        self.working_sets_waiting = False
        #: Who moves each process's memory off the GPU: it answers ``register`` with the
        #: evictor chosen, and its lines may hold a grant back until a restore.
        self.evictor = evictor
        self.lines: EvictionLines | None = evictor.lines if evictor is not None else None
        #: The status document, kept between requests while nothing it shows changed, and
        #: what building it costs each uid.
        self.documents = StatusDocuments(scheduler, memory_used, self.lines)
        self.meter = StatusMeter()
        #: The pod of each peer pid that asked for a status without registering.
        self._pods: dict[int | None, str | None] = {}
        #: Bumped whenever something the status document shows may have changed: a request
        #: that changes it (here), and what the shell notes (``Timers.note_change``).
        self.generation = 0
        #: Asks for NVML's per-process figures to be read again soon (process_memory.py): a
        #: client reported less than NVML last counted for it, an eviction's progress.
        self.nvml_soon: Callable[[], None] | None = None
        #: The ``tiers`` feature's requests and figures.
        self.tiers = TierRequests(scheduler, self.is_admin)
        #: Each request's handler, looked up once rather than by name on every request.
        self._handlers: dict[str, Callable[[Session, dict[str, Any], int | None, float],
                                           Outcome]] = {
            op: getattr(self.tiers if op in (p.TIER_MOVED, p.INTENT) else self, f"_on_{op}")
            for op in p.REQUESTS}

    def dispatch(self, session: Session, op: str, msg: dict[str, Any], seq: int | None,
                 now: float) -> Outcome:
        # A handoff's two requests by direct calls (compiled: C calls); a call through the
        # table is a generic Python call that boxes and parses its arguments again.
        if op == p.RELEASE:
            outcome = self._on_release(session, msg, seq, now)
        elif op == p.ACQUIRE:
            outcome = self._acquire(session, seq, now)
        else:
            outcome = self._handlers[op](session, msg, seq, now)
        if op not in _NO_RESCHEDULE:
            outcome.reschedule = True
        if op not in _NO_CHANGE:
            outcome.changed = True
        if outcome.changed:
            self.generation += 1
        return outcome

    def handoff(self, session: Session, op: str, seq: int, now: float) -> Outcome:
        # Both may move the deadline and change what the status shows (see dispatch).
        outcome = self._release(session, seq, now) if op == p.RELEASE \
            else self._acquire(session, seq, now)
        outcome.reschedule = True
        outcome.changed = True
        self.generation += 1
        return outcome

    def complain(self, session: Session, exc: p.ProtocolError) -> None:
        """One line per bad request, and not even that when the same peer repeats itself."""
        if exc.code == p.E_PERMISSION:
            return  # _require_admin said it in the words admins look for
        what = "Closing connection from" if exc.fatal else "Refused a request from"
        self.warnings.warning((session.peer.uid, exc.code), "%s %s (uid %s) [FD=%d]: %s",
                              what, session.label, session.peer.uid, session.peer.fd,
                              exc.message)

    def trouble(self, session: Session, exc: Exception) -> None:
        """A request failed on a fault of the daemon's own: one line, the traceback on DEBUG."""
        if self.warnings.warning(("bug", type(exc).__name__), "Could not answer a request from "
                                 "%s [FD=%d]: %s: %s", session.label, session.peer.fd,
                                 type(exc).__name__, exc):
            log.debug("The failure in full:", exc_info=exc)

    # -- the handshake --------------------------------------------------------------------

    def _on_hello(self, session: Session, msg: dict[str, Any], seq: int | None,
                  now: float) -> Outcome:
        if msg["version"] != p.VERSION:
            raise p.ProtocolError(p.E_VERSION, f"this daemon speaks protocol version "
                                  f"{p.VERSION}, not {msg['version']}")
        if session.greeted:
            raise p.ProtocolError(p.E_MALFORMED, "hello was already said")
        asked = msg.get("features") or []
        features = frozenset(f for f in asked if isinstance(f, str)) & p.FEATURES
        return Outcome([p.encode(p.WELCOME, seq=seq, version=p.VERSION,
                                 daemon=f"kiwi-scheduler {__version__}",
                                 max_message=p.MAX_REQUEST_BYTES, mode=self.scheduler.mode,
                                 tq=self.scheduler.tq,
                                 features=sorted(features) if asked else None)],
                       features=features)

    def _on_register(self, session: Session, msg: dict[str, Any], seq: int | None,
                     now: float) -> Outcome:
        if session.client_id is not None:
            raise SchedulerError(p.E_STATE, "this connection is already registered")
        memory = p.FEATURE_MEMORY in session.features
        if msg.get("evict") == "vmm" and not memory:
            raise SchedulerError(p.E_INVALID, "evict vmm needs the memory feature (hello)")
        if memory:  # refused before anything is kept: no more than its GPU has
            gpu = self.scheduler.gpus.get(self.registrations.placement(msg))
            if gpu is not None:
                check_claim(gpu, byte_figure(msg, "resident"), "register.resident")
        peer = session.peer
        asked = msg.get("evict")
        choice = None
        # What it can carry out, not merely what was asked; an evictor nobody knows goes to the
        # scheduler as asked, which refuses it.
        if self.evictor is not None and (asked is None or asked in EVICT_MODES):
            choice = self.evictor.choose(peer.pid, peer.uid, self.registrations.name(peer, msg),
                                         asked, peer.identity)
        client = self.registrations.register(peer, msg, now, self.is_admin(session),
                                             evict=None if choice is None else choice.evict)
        if self.evictor is not None and choice is not None:
            self.evictor.keep(client, choice, peer.identity)
        if memory:
            self.scheduler.track_memory(
                client.id, MemoryFigures(byte_figure(msg, "resident"), self._host(msg, "host"),
                                         self._host(msg, "shadow")),
                checkpointable=self.lines is not None and client.id in self.lines.records)
        tiered = self.tiers.registered(client.id, msg) \
            if memory and p.FEATURE_TIERS in session.features else []
        log.info("Registered %s as %s (pid %s, pool %s, priority %s, GPU %d) [FD=%d]",
                 label(client.name, client.display_name, client.user), client.id, client.pid,
                 client.pool, client.priority, client.gpu, session.peer.fd)
        if client.warning:  # the access policy downgraded its claim
            log.warning("%s (%s, uid %s): %s", client.name, client.id, client.uid,
                        client.warning)
        return Outcome([p.encode(p.REGISTERED, seq=seq, client=client.id, gpu=client.gpu,
                                 mode=self.scheduler.mode, tq=self.scheduler.tq_for(client.gpu),
                                 pool=client.pool if client.warning else None,
                                 priority=client.priority if client.warning else None,
                                 warning=client.warning, evict=client.evict,
                                 pin_budget=self.tiers.pin_budget(client.id) if memory
                                 else None), *tiered],
                       client_id=client.id, label=client.name)

    def forget(self, client_id: str) -> None:
        """The client's connection is gone (the shell unregisters it from the scheduler)."""
        self.registrations.forget(client_id)
        self.working_sets.forget(client_id)
        self.memory_reports.forget(client_id)
        self.tiers.forget(client_id)

    # -- the GPU --------------------------------------------------------------------------

    def _on_acquire(self, session: Session, msg: dict[str, Any], seq: int | None,
                    now: float) -> Outcome:
        return self._acquire(session, seq, now)

    def _acquire(self, session: Session, seq: int | None, now: float) -> Outcome:
        client_id = _registered(session)
        fresh = self.tiers.host_memory_if_stale(now)  # the acquire may plan with the budget
        actions = self.scheduler.acquire(now, client_id)
        reply, position = self._granted_or_waiting(client_id, actions, seq, now)
        out: list[bytes | Action] = [reply, *fresh]
        out.extend(actions)
        return Outcome(out, gpus=(self.scheduler.clients[client_id].gpu,), told=True,
                       position=position)

    def _on_release(self, session: Session, msg: dict[str, Any], seq: int | None,
                    now: float) -> Outcome:
        client_id = _registered(session)
        # Only op and seq (every handoff's release): no field to look up.
        if len(msg) <= (1 if seq is None else 2):
            return self._release(session, seq, now)
        gpus = (self.scheduler.clients[client_id].gpu,)
        evict_first = msg.get("evict_first") is True
        requeue = msg.get("requeue") is True
        if msg.get("evicting") is True and p.FEATURE_MEMORY in session.features:
            if evict_first or requeue:
                raise SchedulerError(p.E_INVALID, "evicting ends the hold; evict_first "
                                     "and requeue do not go with it")
            ended = self.scheduler.release(now, client_id, evicting=True)
            return Outcome([*ended, p.released_line(True, seq)], handoff=True, gpus=gpus)
        if requeue:
            if evict_first:
                raise SchedulerError(p.E_INVALID, "requeue asks for the GPU again at once; "
                                     "evict_first is for leaving it")
            # One request, one reply: what acquire would answer. The releaser's "released"
            # is not sent (its action goes out to the evictor only); the next holder's grant
            # goes first.
            handed: list[Action] = self.scheduler.release(now, client_id)
            again = self.scheduler.acquire(now, client_id)
            reply, position = self._granted_or_waiting(client_id, again, seq, now)
            # A pause (taking turns) for the caller follows the grant it pauses.
            own = [a for a in again if isinstance(a, (Pause, Resume)) and a.client == client_id]
            others = [a for a in again if a not in own]
            return Outcome([*handed, *others, reply, *own], handoff=True, gpus=gpus, told=True,
                           position=position)
        return self._release(session, seq, now, evict_first)

    def _release(self, session: Session, seq: int | None, now: float,
                 evict_first: bool = False) -> Outcome:
        """Give the GPU back (or cancel a wait): every handoff's release, and evict_first's."""
        client_id = _registered(session)
        gpus = (self.scheduler.clients[client_id].gpu,)
        actions = self.scheduler.release(now, client_id, evict_first=evict_first)
        out: list[bytes | Action] = []
        released: list[bytes | Action] = []
        for action in actions:
            if isinstance(action, Released) and action.client == client_id:
                # The action goes first (it sends nothing, but a checkpoint it starts must
                # come before the next grant); the reply after the next holder's grant.
                out.insert(0, action)
                released.append(p.released_line(action.evict, seq))
            elif isinstance(action, Drop) and action.client == client_id:
                # With evict_first the releaser may keep the GPU until its memory is out: the
                # drop is the reply, so it carries seq.
                log.debug("%s gives GPU %d back once its memory is out (grace %.1f s)",
                          session.label, action.gpu, action.grace)
                out.append(p.drop_line(action.gpu, action.reason, action.evict, action.grace,
                                       seq))
            else:
                out.append(action)
        # The next holder hears first: it is the one waiting, the releaser has moved on.
        out.extend(released)
        return Outcome(out, handoff=True, gpus=gpus)

    def _granted_or_waiting(self, client_id: str, actions: list[Action], seq: int | None,
                            now: float) -> tuple[bytes, int | None]:
        """The reply to an acquire and the position it tells (None: granted); removes the
        caller's own grant from ``actions``."""
        for i, action in enumerate(actions):
            if isinstance(action, Grant) and action.client == client_id:
                if self.lines is not None and self.lines.hold_back(action):
                    # It is restored (or its GPU freed) first; the grant follows as an event.
                    return p.waiting_line(1, seq), 1
                del actions[i]
                return p.grant_line(action.gpu, action.quantum, seq), None
        position = self.scheduler.queue_position(client_id, now)
        return p.waiting_line(position, seq), position

    def _on_working_set(self, session: Session, msg: dict[str, Any], seq: int | None,
                        now: float) -> Outcome:
        client_id = _registered(session)
        nbytes = limits.byte_count(msg["bytes"], "working_set.bytes")
        evictable = msg.get("evictable")
        if evictable is not None:
            evictable = limits.byte_count(evictable, "working_set.evictable")
        client = self.scheduler.clients[client_id]
        figures: Figures | None = None
        if p.FEATURE_MEMORY in session.features:
            figures = (byte_figure(msg, "resident"), self._host(msg, "host"),
                       self._host(msg, "shadow"))
            if figures == (None, None, None):
                figures = None
            else:  # a claim of more than the GPU has is refused here, not damped
                check_claim(self.scheduler.gpus[client.gpu], figures[0], "working_set.resident")
                self._check_nvml_soon(client, figures[0])
            if p.FEATURE_TIERS in session.features:
                self.tiers.figures(client, msg, now)
        damper = self.working_sets
        heard = damper.report(client_id, nbytes, evictable, now)
        if heard is None:  # it waits (or changes nothing): the shell arms the damper's timer
            self.working_sets_waiting = True
            if damper.flaps(client_id) == 1:
                self.warnings.warning((session.peer.uid, "working_set"),
                                      "%s (%s, uid %s) reports its working set up and down "
                                      "faster than the scheduler follows; the larger one "
                                      "stands until a smaller one holds %g s [FD=%d]",
                                      session.label, client_id, session.peer.uid, damper.hold,
                                      session.peer.fd)
        if figures is not None:
            figures = self.memory_reports.report(client_id, figures, standing(client), now)
            if figures is None:
                self.working_sets_waiting = True
        if heard is None and figures is None:
            # Nothing the scheduler has moves: no scheduling pass, no new status document.
            return Outcome([p.encode(p.OK, seq=seq)])
        if heard is None:
            heard = (client.working_set if client.working_set is not None else nbytes,
                     client.evictable)
        actions = self._tell(client, heard, figures, now)
        return Outcome([p.encode(p.OK, seq=seq), *actions], reschedule=True, changed=True)

    def _tell(self, client: ClientRecord, heard: tuple[int, int | None], figures: Figures | None,
              now: float) -> list[Action]:
        """Tell the scheduler a working set and, when some came, memory figures (a restore
        that ended comes back as ``Restored``, for the metrics)."""
        if figures is None:
            return self.scheduler.report_working_set(now, client.id, heard[0],
                                                     evictable=heard[1])
        return self.scheduler.report_working_set(now, client.id, heard[0],
                                                 MemoryFigures(*figures), evictable=heard[1])

    def reports_next_due(self) -> float | None:
        """When the first working set or memory report that waits is due (None: none)."""
        due = [t for t in (self.working_sets.next_due(), self.memory_reports.next_due())
               if t is not None]
        return min(due) if due else None

    def working_sets_due(self, now: float) -> list[Action]:
        """The working sets and memory figures that waited long enough, told to the scheduler
        now (the shell's timer, ``Timers.arm_working_sets``)."""
        actions: list[Action] = []
        clients = self.scheduler.clients
        working_sets = dict(self.working_sets.due(now))
        for client_id, figures in self.memory_reports.due(now):
            client = clients.get(client_id)
            if client is not None:
                heard = working_sets.pop(client_id, None) or (
                    client.working_set or 0, client.evictable)
                actions += self._tell(client, heard, figures, now)
        for client_id, heard in working_sets.items():
            client = clients.get(client_id)
            if client is not None:
                actions += self._tell(client, heard, None, now)
        return actions

    def _on_evicted(self, session: Session, msg: dict[str, Any], seq: int | None,
                    now: float) -> Outcome:
        client_id = _registered(session)
        if p.FEATURE_MEMORY not in session.features:
            raise SchedulerError(p.E_STATE, "evicted needs the memory feature (hello)")
        failed = msg.get("failed")
        failed = None if failed is None else limits.short_text(failed, "evicted.failed")
        client = self.scheduler.clients[client_id]
        figures = (byte_figure(msg, "resident"), self._host(msg, "host"), self._host(msg, "shadow"))
        self._check_nvml_soon(client, figures[0])
        took = said_seconds(msg.get("seconds"))  # as the client measured its way out
        actions = self.scheduler.evicted(now, client_id, MemoryFigures(
                                             *figures, disk=byte_figure(msg, "disk")),
                                         failed=failed, seconds=took,
                                         moved=byte_figure(msg, "moved"))
        self.memory_reports.heard(client_id, figures, now)
        if failed is not None:
            log.warning("%s (%s) could not evict: %s",
                        label(client.name, client.display_name, client.user), client_id, failed)
        return Outcome([p.encode(p.OK, seq=seq), *actions], gpus=(client.gpu,))

    def _host(self, msg: dict[str, Any], key: str) -> int | None:
        """A host memory figure a client says: no more than the host has (issue 40, N3)."""
        value = byte_figure(msg, key)
        total = self.documents.host_total
        return value if value is None or total is None else min(value, total)

    def _check_nvml_soon(self, client: ClientRecord, resident: int | None) -> None:
        nvml = client.nvml_bytes
        if nvml is not None and resident is not None and resident < nvml and \
                self.nvml_soon is not None:
            self.nvml_soon()

    # -- looking and steering -------------------------------------------------------------

    def _on_status(self, session: Session, msg: dict[str, Any], seq: int | None,
                   now: float) -> Outcome:
        uid = session.peer.uid
        viewer = (self.is_admin(session), uid)
        kept = self.documents.kept(viewer, seq, now, self.generation)
        if kept is not None:  # nothing it shows changed: it costs nothing, whoever asks
            return Outcome([kept])
        group = (uid, self._pod(session))
        wait = self.meter.owed(group, now)
        if wait > 0:  # its group (or all) took more than their share: it waits its turn
            self.warnings.warning((uid, p.STATUS), "Status requests of uid %s take more than "
                                  "their share of the daemon's time; they wait %.1f s [FD=%d]",
                                  uid, wait, session.peer.fd)
            return Outcome(wait=wait)
        line, cost, built = self.documents.build(viewer, seq, now, self.generation)
        self.meter.charge(group, cost, now, built)
        return Outcome([line])

    def _pod(self, session: Session) -> str | None:
        """The pod a session asks from: its registration's, else its process's (read once per
        pid, from its cgroup), else None."""
        if session.client_id is not None:
            owner = self.registrations.owner.get(session.client_id)
            return owner[1] if owner is not None else None
        pid = session.peer.pid
        pods = self._pods
        if pid not in pods:
            if len(pods) >= 4096:
                pods.clear()
            pods[pid] = self.registrations.pod_of(pid)
        return pods[pid]

    def status(self, now: float, viewer: Session | None = None) -> dict[str, Any]:
        """The status document as ``viewer`` may see it (None: everything), built now."""
        if viewer is None:
            return self.documents.document(now)
        return self.documents.document(now, (self.is_admin(viewer), viewer.peer.uid))

    def _on_ping(self, session: Session, msg: dict[str, Any], seq: int | None,
                 now: float) -> Outcome:
        return Outcome([p.encode(p.PONG, seq=seq)])

    def _on_set_mode(self, session: Session, msg: dict[str, Any], seq: int | None,
                     now: float) -> Outcome:
        mode = str(msg["mode"]).lower()
        log.info("Received SCHED_%s from %s [FD=%d]", limits.short_text(mode, "mode").upper(),
                 session.label, session.peer.fd)
        self._require_admin(session, "change the scheduler's mode")
        if mode not in p.MODES:
            raise SchedulerError(p.E_INVALID, f"mode must be one of {', '.join(p.MODES)}")
        actions = self.scheduler.set_mode(now, mode)
        log.info("Scheduler status changed to %s, broadcasting it ...", mode.upper())
        return self._changed(seq, actions)

    def _on_set_tq(self, session: Session, msg: dict[str, Any], seq: int | None,
                   now: float) -> Outcome:
        seconds, gpu = limits.tq_seconds(msg["tq"]), msg.get("gpu")
        log.info("Received SET_TQ(%g%s) from %s [FD=%d]", seconds,
                 "" if gpu is None else f", GPU {gpu}", session.label, session.peer.fd)
        self._require_admin(session, "change the TQ")
        actions = self.scheduler.set_tq(now, seconds, gpu)
        where = "" if gpu is None else f" on GPU {gpu}"
        log.info("Scheduler TQ changed to %g seconds%s, broadcasting it ...", seconds, where)
        return self._changed(seq, actions)

    def _changed(self, seq: int | None, actions: list[Action]) -> Outcome:
        mode, tq = self.scheduler.mode, self.scheduler.tq
        return Outcome([p.encode(p.OK, seq=seq, mode=mode, tq=tq), *actions],
                       broadcast=p.encode(p.MODE, mode=mode, tq=tq),
                       gpus=tuple(self.scheduler.gpus))

    def is_admin(self, session: Session) -> bool:
        return is_admin(session.peer, self.admin_gid)

    def _require_admin(self, session: Session, what: str) -> None:
        if not self.is_admin(session):
            self.warnings.warning((session.peer.uid, p.E_PERMISSION, what),
                                  "Refused: uid %s may not %s [FD=%d]", session.peer.uid, what,
                                  session.peer.fd)
            raise SchedulerError(p.E_PERMISSION, f"Permission denied: only root, the "
                                 f"scheduler's user and the admin group may {what}")


def _registered(session: Session) -> str:
    if session.client_id is None:
        raise SchedulerError(p.E_STATE, "register first")
    return session.client_id

