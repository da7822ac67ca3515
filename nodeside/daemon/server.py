"""The daemon's asyncio shell: the socket, signals and timers around the sans-I/O rules.

Each connection (``connection.py``) feeds its bytes to a ``Session`` (``session.py``), whose
requests ``Requests`` (``requests.py``) answers by calling the scheduler; this file carries out
what they return: it sends the actions to the clients they name, arms one timer for the
scheduler's next deadline, one for the connection deadlines (``admission.py``), one for
queue-position events (``positions.py``) and one for status-change events (``changes.py``).
Nothing here decides who gets a GPU or what a peer may say.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nodeside import __version__
from nodeside import protocol as p
from nodeside.config import ConfigError
from nodeside.config import load as load_config
from nodeside.daemon.admission import Admission
from nodeside.daemon.changes import CHANGED_LINE, ChangeNotices
from nodeside.daemon.connection import Connection
from nodeside.daemon.delivery import Delivery
from nodeside.daemon.kube import PodNamespaces
from nodeside.daemon.listen import listen
from nodeside.daemon.options import DaemonOptions
from nodeside.daemon.peer import resolve_group
from nodeside.daemon.positions import INTERVAL as POSITION_INTERVAL
from nodeside.daemon.positions import PositionNotices
from nodeside.daemon.requests import Requests
from nodeside.daemon.session import Outcome, Session
from nodeside.daemon.state import StateFile
from nodeside.evict.evictor import CheckpointEvictor
from nodeside.scheduler.core import Scheduler

log = logging.getLogger("kiwi.daemon")

#: File descriptors kept for the daemon itself (state file, metrics, NVML, the log).
_RESERVED_FDS = 64


class Daemon:
    def __init__(self, options: DaemonOptions) -> None:
        self.options = options
        self.socket_path = Path(options.socket)
        self.state = StateFile(options.state_file)
        self.connections: set[Connection] = set()
        self.loop = asyncio.get_running_loop()
        #: The loop's clock, asked several times a request: its own method, no frame between.
        #: asyncio's own loop.time is a Python method that returns time.monotonic(): that is
        #: called directly instead (a C function, no frame); another loop's (uvloop's) is kept.
        self.now: Callable[[], float] = time.monotonic \
            if type(self.loop).time is asyncio.BaseEventLoop.time else self.loop.time
        config = self.state.apply(options.config)
        self.scheduler = Scheduler(config, options.gpus, self.now())
        self.state.restore_gpu_tq(self.scheduler)
        self.requests = Requests(self.scheduler, resolve_group(config.admin_group),
                                 options.memory_used)
        self.admission = Admission(config.connections, _connection_cap())
        self.positions = PositionNotices()
        self.changes = ChangeNotices()
        self.by_session: dict[Session, Connection] = {}
        self._sweep: asyncio.TimerHandle | None = None
        self._sweep_at: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._reschedule = False
        self._timer_at: float | None = None
        self._server: asyncio.AbstractServer | None = None
        self.stopped = asyncio.Event()
        self.delivery = Delivery(self.scheduler, self.now)
        self.by_client = self.delivery.by_client
        #: Called with the seconds between a release arriving and the next grant being sent.
        self.handoff_observers = self.delivery.handoff_observers
        #: Called with every list of actions carried out and the time (metrics).
        self.action_observers = self.delivery.action_observers
        #: Called on close (the metrics server).
        self.closers: list[Callable[[], None]] = []
        #: Suspends and resumes processes registered with evict "checkpoint"; every action
        #: passes it on the way out, so a grant waits until the GPU is really free.
        self.evictor = CheckpointEvictor(self.delivery, options.cuda_library,
                                         lambda: self.scheduler.config.grace,
                                         options.memory_used)
        self.delivery.gate = self.evictor.filter
        self.requests.evictor = self.evictor
        self.pods = PodNamespaces(options.pods, options.proc_root)
        self.requests.registrations.namespace_of = self.pods.of
        #: What was said about namespaces being off: "info" at start, "warning" once rules
        #: name namespaces; never more than that, however often the config is reloaded.
        self._pods_off_said: str | None = None

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        # Handlers first: a SIGHUP sent the moment the socket answers must reload, not kill.
        for signum, handler in ((signal.SIGTERM, self.stop), (signal.SIGINT, self.stop),
                                (signal.SIGHUP, self.reload)):
            self.loop.add_signal_handler(signum, handler)
        path = self.socket_path
        self._server = await listen(self.loop, path, self.scheduler.config,
                                    lambda: Connection(self))
        # "GPU 0 (logical GPU, memory unknown)", not "GPUs 0 (...)", which reads as none.
        gpus = ", ".join(f"GPU {g.index} ({g.name}, {_size(g.memory_total)})"
                         for g in self.options.gpus)
        log.info("kiwi-scheduler %s listening on %s: mode %s, TQ %s seconds, %s",
                 __version__, path, self.scheduler.mode.upper(), f"{self.scheduler.tq:g}", gpus)
        self._warn_about_pools()
        self._arm_timer()
        self.pods.start()
        self._say_if_namespaces_are_off()

    async def serve_forever(self) -> None:
        await self.start()
        await self.stopped.wait()
        await self.close()

    def stop(self) -> None:
        log.info("Shutting down")
        self.stopped.set()

    async def close(self) -> None:
        for timer in (self._timer, self._sweep):
            if timer is not None:
                timer.cancel()
        for close in self.closers:
            close()
        await self.pods.close()
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        if self._server is not None:
            await self._server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    def reload(self) -> None:
        """SIGHUP: read the config file again; keep every client and every runtime change."""
        try:
            config = load_config(self.options.config_file)
            config = self.state.apply(config.with_runtime(**self.options.overrides))
        except ConfigError as exc:
            log.error("Config reload failed, keeping the running config: %s", exc)
            return
        self.requests.admin_gid = resolve_group(config.admin_group)
        self.admission.limits = config.connections
        self.delivery.apply(self.scheduler.reconfigure(config, self.now()))
        self.state.restore_gpu_tq(self.scheduler)
        log.info("Config reloaded from %s", self.options.config_file or "defaults")
        self._note_change()  # pools, TQ or mode may read otherwise now
        self._warn_about_pools()
        self._say_if_namespaces_are_off()

    # -- connections ----------------------------------------------------------------------

    def opened(self, conn: Connection) -> None:
        verdict = self.admission.admit(conn.session, self.now())
        for victim in verdict.evicted:
            old = self.by_session.get(victim)
            if old is not None:
                self._limited("Closing idle unregistered connection [FD=%d] of uid %s to "
                              "make room for a new one", old.session.peer.fd, victim.peer.uid)
                old.refuse(p.E_LIMIT, "closed to make room: this connection never registered")
        if not verdict.accepted:
            self._limited("Refused a connection from uid %s: %s", conn.session.peer.uid,
                          verdict.reason)
            conn.refuse(p.E_LIMIT, verdict.reason)
            return
        self.connections.add(conn)
        self.by_session[conn.session] = conn
        self._arm_sweep()

    def carry_out(self, conn: Connection, outcome: Outcome) -> None:
        """Send a session's replies and carry out the scheduler's actions, in their order."""
        started = time.perf_counter() if outcome.handoff and self.handoff_observers else None
        delivery = self.delivery  # called on, not bound: see Connection._take_turn
        for item in outcome.out:
            if type(item) is bytes:
                conn.send(item)
            else:
                delivery.deliver(item, started)  # type: ignore[arg-type]
        if self.action_observers:  # metrics: the list is made only for them
            actions = [i for i in outcome.out if not isinstance(i, bytes)]
            if actions:
                self.delivery.observe(actions)
        if not conn.settled:
            self._settle(conn)
        if outcome.broadcast is not None:
            self.state.save_from(self.scheduler)
            self._broadcast(outcome.broadcast)
        if outcome.close:
            conn.close()
        if outcome.reschedule:
            self._reschedule = True  # once per turn (end_turn), not once per request
        # Nobody listening (the usual case): not even a call to say so.
        if outcome.gpus and self.positions.listeners and self.positions.mark(outcome.gpus):
            self.loop.call_later(POSITION_INTERVAL, self._tell_positions)
        if outcome.changed and self.changes.listeners:
            self._note_change()

    def _settle(self, conn: Connection) -> None:
        """Note a connection's client and the events it asked for, once it has said them."""
        session = conn.session
        if session.client_id is not None and session.client_id not in self.by_client:
            self.by_client[session.client_id] = conn
            self.admission.registered(session)
        if session.greeted and not conn.counted_as_listener:
            conn.counted_as_listener = True
            if p.FEATURE_POSITION in session.features:
                self.positions.listeners += 1
            if p.FEATURE_CHANGES in session.features:
                self.changes.listeners.add(session)
        # Both said: nothing more to note for this connection, on any later request.
        conn.settled = conn.counted_as_listener and session.client_id is not None

    def end_turn(self) -> None:
        """A connection's batch of requests is answered: recompute the next deadline if needed."""
        if self._reschedule:
            self._reschedule = False
            self._arm_timer()

    def lost(self, conn: Connection) -> None:
        self.connections.discard(conn)
        session = conn.session
        self.by_session.pop(session, None)
        self.admission.gone(session)
        if conn.counted_as_listener and p.FEATURE_POSITION in session.features:
            self.positions.listeners -= 1
        self.changes.listeners.discard(session)
        if session.client_id is None:
            return
        self._note_change()  # a client gone: its row, and what it held or waited for
        self.by_client.pop(session.client_id, None)
        self.requests.forget(session.client_id)
        self.evictor.forget(session.client_id)
        client = self.scheduler.clients.get(session.client_id)
        if client is not None and client.state != "idle":
            log.info("Client %s (%s) went away while %s; freeing it [FD=%d]", session.label,
                     session.client_id, client.state, session.peer.fd)
        else:
            log.info("Client %s (%s) disconnected [FD=%d]", session.label, session.client_id,
                     session.peer.fd)
        gpu = client.gpu if client is not None else None
        self.delivery.apply(self.scheduler.unregister(self.now(), session.client_id),
                            handoff_started=time.perf_counter())
        self._arm_timer()
        if gpu is not None and self.positions.mark((gpu,)):
            self.loop.call_later(POSITION_INTERVAL, self._tell_positions)

    # -- carrying out ---------------------------------------------------------------------

    def _arm_timer(self) -> None:
        deadline = self.scheduler.next_deadline(self.now())
        if self._timer_at is not None and (deadline is None or self._timer_at <= deadline):
            # The armed timer fires first: it ticks (a tick with nothing due does nothing) and
            # arms the next one then. Moving it later on every handoff (each grant starts a
            # quantum) would cancel and make a timer per handoff for a wake-up a TQ away.
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = None if deadline is None else self.loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = self._timer_at = None
        actions = self.scheduler.tick(self.now())
        self.delivery.apply(actions)
        self._arm_timer()
        if actions and self.positions.mark(self.scheduler.gpus):
            self.loop.call_later(POSITION_INTERVAL, self._tell_positions)
        if actions:
            self._note_change()

    def _tell_positions(self) -> None:
        for session, line in self.positions.collect(self.scheduler, self._session_of,
                                                    self.now()):
            self.by_session[session].send(line)

    def _note_change(self) -> None:
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
            conn = self.by_session.get(session)
            if conn is not None:
                conn.send(CHANGED_LINE)

    def _session_of(self, client_id: str) -> Session | None:
        conn = self.by_client.get(client_id)
        return conn.session if conn is not None else None

    def _arm_sweep(self) -> None:
        due = self.admission.next_check()
        if due is not None and (self._sweep_at is None or due < self._sweep_at):
            if self._sweep is not None:
                self._sweep.cancel()
            self._sweep_at = due
            self._sweep = self.loop.call_at(due, self._on_sweep)

    def _on_sweep(self) -> None:
        self._sweep = self._sweep_at = None
        for session, reason in self.admission.expired(self.now()):
            conn = self.by_session.get(session)
            if conn is not None:
                self._limited("Closing connection [FD=%d] of uid %s: %s", session.peer.fd,
                              session.peer.uid, reason)
                conn.refuse(p.E_LIMIT, f"closed: {reason}")
        self._arm_sweep()

    def _limited(self, message: str, *args: Any) -> None:
        self.requests.warnings.warning(message, message, *args)

    # -- helpers --------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return self.requests.status(self.now())

    def _broadcast(self, line: bytes) -> None:
        for conn in self.connections:
            if conn.session.greeted:
                conn.send(line)

    def _say_if_namespaces_are_off(self) -> None:
        """One line when the namespaces of peers' pods cannot be verified (fail closed: rules
        by namespace match nobody): a warning if the policy names namespaces, else an info
        line at start, in a pod only. Never repeated; a reload may only raise info to warning."""
        if self.pods.source is not None or self._pods_off_said == "warning":
            return
        access = self.scheduler.config.access
        reason = self.options.pods_off
        if access is not None and access.names_namespaces:
            log.warning("The access policy names Kubernetes namespaces, but %s: rules by "
                        "namespace match nobody (deploy with the component "
                        "nodeside/deploy/components/namespaces, docs/kubernetes.md)",
                        reason or "the daemon is not in a Kubernetes pod")
            self._pods_off_said = "warning"
        elif reason is not None and self._pods_off_said is None:
            log.info("Namespaces in the access policy are off (%s; the component "
                     "nodeside/deploy/components/namespaces turns them on)", reason)
            self._pods_off_said = "info"

    def _warn_about_pools(self) -> None:
        reason = self.scheduler.preemption_off_reason
        if reason:
            log.warning("%s%s", reason[0].upper(), reason[1:])


def _connection_cap() -> int:
    """Connections the daemon may hold: its file descriptor limit, less some for itself."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 20
    return max(16, soft - _RESERVED_FDS)


def _size(nbytes: int | None) -> str:
    return "memory unknown" if nbytes is None else f"{nbytes / 2**30:.1f} GiB"
