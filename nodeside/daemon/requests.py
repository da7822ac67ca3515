"""What each request does: the node's side of every session, calling the scheduler.

``Requests`` is shared by all sessions of one daemon. Each ``_on_<op>`` takes a session, the
checked message, its seq and the time, calls the scheduler, and returns an ``Outcome``. Values a
peer chose are checked against ``nodeside.limits`` before the scheduler sees them. Nothing here
does I/O; logging is the only thing it says to the world.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any

from nodeside import __version__, limits
from nodeside import protocol as p
from nodeside.daemon.lograte import RateLimitedLog
from nodeside.daemon.peer import groups_of, is_admin, user_name
from nodeside.daemon.session import Outcome, Session
from nodeside.daemon.status_line import status_line
from nodeside.scheduler.core import Action, Drop, Grant, Released, Scheduler, SchedulerError
from nodeside.scheduler.status import build_status

log = logging.getLogger("kiwi.daemon")

#: Requests after which the scheduler's next deadline cannot have moved.
_NO_RESCHEDULE = frozenset({p.HELLO, p.REGISTER, p.STATUS, p.PING})


class Requests:
    def __init__(self, scheduler: Scheduler, admin_gid: int | None,
                 memory_used: Callable[[], Mapping[int, int | None]] = dict) -> None:
        self.scheduler = scheduler
        self.admin_gid = admin_gid
        self.memory_used = memory_used
        self.warnings = RateLimitedLog(log)
        #: Label bytes per registered client, and their sum (limits.MAX_LABEL_BYTES_TOTAL).
        self.label_bytes: dict[str, int] = {}
        self.label_bytes_total = 0
        self.by_uuid = {g.spec.uuid: i for i, g in scheduler.gpus.items() if g.spec.uuid}
        # Keywords the scheduler and the status builder take that older versions did not: passed
        # only where accepted, so this shell runs on the scheduler of either side of a merge.
        self._register_takes = set(inspect.signature(scheduler.register).parameters)
        self._status_takes = set(inspect.signature(build_status).parameters)

    def dispatch(self, session: Session, op: str, msg: dict[str, Any], seq: int | None,
                 now: float) -> Outcome:
        outcome: Outcome = getattr(self, f"_on_{op}")(session, msg, seq, now)
        if op not in _NO_RESCHEDULE:
            outcome.reschedule = True
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
        session.features = frozenset(f for f in asked if isinstance(f, str)) & p.FEATURES
        session.greeted = True
        return Outcome([p.encode(p.WELCOME, seq=seq, version=p.VERSION,
                                 daemon=f"kiwi-scheduler {__version__}",
                                 max_message=p.MAX_REQUEST_BYTES, mode=self.scheduler.mode,
                                 tq=self.scheduler.tq,
                                 features=sorted(session.features) if asked else None)])

    def _on_register(self, session: Session, msg: dict[str, Any], seq: int | None,
                     now: float) -> Outcome:
        if session.client_id is not None:
            raise SchedulerError(p.E_STATE, "this connection is already registered")
        if len(self.scheduler.clients) >= limits.MAX_CLIENTS:
            raise limits.LimitError(f"this node already has {limits.MAX_CLIENTS} clients")
        peer = session.peer
        labels = {k: _label_text(v) for k, v in (msg.get("labels") or {}).items()}
        working_set = msg.get("working_set")
        evict = msg.get("evict")
        options: dict[str, Any] = {
            "name": limits.short_text(msg.get("name") or f"pid-{peer.pid}", "name"),
            "gpu": self._gpu(msg.get("gpu") or 0, msg.get("gpu_uuid")),
            "pool": limits.short_text(msg.get("pool") or "default", "pool"),
            "priority": limits.short_text(msg.get("priority") or "NORMAL", "priority").upper(),
            "pid": peer.pid, "uid": peer.uid,
            "kind": limits.short_text(msg.get("kind") or "client", "kind"),
            "labels": limits.labels(labels),
            "working_set": None if working_set is None
            else limits.byte_count(working_set, "working_set"),
        }
        takes = self._register_takes
        extras = {"display_name": msg.get("display_name"), "evict": evict,
                  "gids": groups_of(peer) if "gids" in takes else None,
                  "user": user_name(peer.uid) if "user" in takes else None}
        for key in ("display_name", "evict"):
            if extras[key] is not None:
                limits.short_text(extras[key], key)
        options.update({k: v for k, v in extras.items()
                        if v is not None and k in self._register_takes})
        label_bytes = sum(len(k.encode()) + len(v.encode()) for k, v in options["labels"].items())
        if self.label_bytes_total + label_bytes > limits.MAX_LABEL_BYTES_TOTAL:
            raise limits.LimitError(f"labels: the node's clients already carry "
                                    f"{self.label_bytes_total} bytes of labels, and "
                                    f"{limits.MAX_LABEL_BYTES_TOTAL} is the most")
        client = self.scheduler.register(now, **options)
        self.label_bytes[client.id] = label_bytes
        self.label_bytes_total += label_bytes
        session.client_id = client.id
        session.label = client.name
        log.info("Registered %s as %s (pid %s, pool %s, priority %s, GPU %d) [FD=%d]",
                 client.name, client.id, client.pid, client.pool, client.priority, client.gpu,
                 peer.fd)
        return Outcome([p.encode(p.REGISTERED, seq=seq, client=client.id, gpu=client.gpu,
                                 mode=self.scheduler.mode, tq=self.scheduler.tq_for(client.gpu))])

    def forget(self, client_id: str) -> None:
        """The client's connection is gone (the shell unregisters it from the scheduler)."""
        self.label_bytes_total -= self.label_bytes.pop(client_id, 0)

    def _gpu(self, index: int, uuid: str | None) -> int:
        # A process's CUDA_VISIBLE_DEVICES renumbers GPUs; a UUID names one GPU everywhere. An
        # unknown UUID (a MIG instance, whose UUID NVML's device list does not carry, or a
        # daemon on logical GPUs) leaves the index to decide, so it is resolved here and not
        # passed on: the scheduler would refuse a UUID it does not know.
        if uuid is not None:
            limits.short_text(uuid, "gpu_uuid")
            return self.by_uuid.get(uuid, index)
        return index

    # -- the GPU --------------------------------------------------------------------------

    def _on_acquire(self, session: Session, msg: dict[str, Any], seq: int | None,
                    now: float) -> Outcome:
        client_id = _registered(session)
        actions = self.scheduler.acquire(now, client_id)
        out: list[bytes | Action] = [self._granted_or_waiting(session, actions, seq, now)]
        out.extend(actions)
        return Outcome(out, gpus=(self.scheduler.clients[client_id].gpu,))

    def _on_release(self, session: Session, msg: dict[str, Any], seq: int | None,
                    now: float) -> Outcome:
        client_id = _registered(session)
        evict_first = msg.get("evict_first") is True
        gpus = (self.scheduler.clients[client_id].gpu,)
        if msg.get("requeue") is True:
            if evict_first:
                raise SchedulerError(p.E_INVALID, "requeue asks for the GPU again at once; "
                                     "evict_first is for leaving it")
            # One request, one reply: what acquire would answer. The releaser's "released"
            # is not sent; the next holder's grant goes first.
            handed: list[Action] = [a for a in self.scheduler.release(now, client_id)
                                    if not isinstance(a, Released)]
            again = self.scheduler.acquire(now, client_id)
            reply = self._granted_or_waiting(session, again, seq, now)
            return Outcome([*handed, *again, reply], handoff=True, gpus=gpus)
        actions = self.scheduler.release(now, client_id, evict_first=evict_first)
        out: list[bytes | Action] = []
        released: list[bytes | Action] = []
        for action in actions:
            if isinstance(action, Released) and action.client == client_id:
                released.append(p.encode(p.RELEASED, seq=seq, evict=action.evict))
            elif isinstance(action, Drop) and action.client == client_id:
                # With evict_first the releaser may keep the GPU until its memory is out: the
                # drop is the reply, so it carries seq.
                log.debug("%s gives GPU %d back once its memory is out (grace %.1f s)",
                          session.label, action.gpu, action.grace)
                out.append(p.encode(p.DROP, seq=seq, gpu=action.gpu, reason=action.reason,
                                    evict=action.evict, grace=action.grace))
            else:
                out.append(action)
        # The next holder hears first: it is the one waiting, the releaser has moved on.
        out.extend(released)
        return Outcome(out, handoff=True, gpus=gpus)

    def _granted_or_waiting(self, session: Session, actions: list[Action], seq: int | None,
                            now: float) -> bytes:
        """The reply to an acquire; removes the caller's own grant from ``actions``."""
        client_id = session.client_id
        for i, action in enumerate(actions):
            if isinstance(action, Grant) and action.client == client_id:
                del actions[i]
                session.told_position = None
                return p.encode(p.GRANT, seq=seq, gpu=action.gpu, quantum=action.quantum)
        position = self.scheduler.queue_position(client_id or "", now)
        session.told_position = position
        return p.encode(p.WAITING, seq=seq, position=position)

    def _on_working_set(self, session: Session, msg: dict[str, Any], seq: int | None,
                        now: float) -> Outcome:
        client_id = _registered(session)
        nbytes = limits.byte_count(msg["bytes"], "working_set.bytes")
        evictable = msg.get("evictable")
        if evictable is not None:
            evictable = limits.byte_count(evictable, "working_set.evictable")
        actions = self.scheduler.report_working_set(now, client_id, nbytes, evictable)
        return Outcome([p.encode(p.OK, seq=seq), *actions])

    # -- looking and steering -------------------------------------------------------------

    def _on_status(self, session: Session, msg: dict[str, Any], seq: int | None,
                   now: float) -> Outcome:
        return Outcome([status_line(self.status(now, session), seq)])

    def status(self, now: float, viewer: Session | None = None) -> dict[str, Any]:
        """The status document as ``viewer`` may see it (None: everything, for metrics)."""
        extra: dict[str, Any] = {}
        if viewer is not None and "viewer_admin" in self._status_takes:
            extra["viewer_admin"] = self.is_admin(viewer)
        if viewer is not None and "viewer_uid" in self._status_takes:
            extra["viewer_uid"] = viewer.peer.uid
        return build_status(self.scheduler, now, self.memory_used(), **extra)

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
            self.warnings.warning((session.peer.uid, p.E_PERMISSION),
                                  "Refused: uid %s may not %s [FD=%d]", session.peer.uid, what,
                                  session.peer.fd)
            raise SchedulerError(p.E_PERMISSION, f"Permission denied: only root, the "
                                 f"scheduler's user and the admin group may {what}")


def _registered(session: Session) -> str:
    if session.client_id is None:
        raise SchedulerError(p.E_STATE, "register first")
    return session.client_id


def _label_text(value: Any) -> Any:
    # Older clients sent numbers as label values; they were always shown as text.
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return value
