"""The daemon's asyncio shell: sockets and timers around the sans-I/O scheduler.

Each connection is an ``asyncio.Protocol`` that splits its bytes into protocol messages and
hands them to ``Daemon.handle``. The daemon calls the scheduler with the loop's monotonic clock,
carries out the actions it returns (send a grant, a drop, a revocation) and arms one timer for
the scheduler's next deadline. Nothing here decides who gets a GPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodeside import __version__
from nodeside import protocol as p
from nodeside.config import ConfigError, SchedulerConfig
from nodeside.config import load as load_config
from nodeside.daemon.connection import Connection
from nodeside.daemon.peer import is_admin, resolve_group
from nodeside.daemon.state import StateFile
from nodeside.evict.evictor import CheckpointEvictor
from nodeside.scheduler.core import (
    Action,
    Drop,
    GpuSpec,
    Grant,
    Released,
    Revoke,
    Scheduler,
    SchedulerError,
)
from nodeside.scheduler.status import build_status

log = logging.getLogger("kiwi.daemon")



class DaemonError(Exception):
    """The daemon cannot start; the message says why."""


@dataclass
class DaemonOptions:
    socket: str
    config: SchedulerConfig
    gpus: list[GpuSpec]
    memory_used: Callable[[], dict[int, int | None]] = dict
    config_file: str | None = None
    #: The command line's settings, laid over the config file again on every reload.
    overrides: dict[str, Any] = field(default_factory=dict)
    state_file: str | None = None
    #: The driver whose checkpoint API suspends processes registered with evict "checkpoint".
    cuda_library: str = "libcuda.so.1"


class Daemon:
    def __init__(self, options: DaemonOptions) -> None:
        self.options = options
        self.socket_path = Path(options.socket)
        self.state = StateFile(options.state_file)
        self.connections: set[Connection] = set()
        self.by_client: dict[str, Connection] = {}
        self.loop = asyncio.get_running_loop()
        config = self._with_state(options.config)
        self.scheduler = Scheduler(config, options.gpus, self.now())
        self._restore_gpu_tq()
        self.admin_gid = resolve_group(config.admin_group)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._grant_lines: dict[tuple[int, float | None, type], bytes] = {}
        self._server: asyncio.AbstractServer | None = None
        self.stopped = asyncio.Event()
        #: Called with the seconds between a release arriving and the next grant being sent.
        self.handoff_observers: list[Callable[[float], None]] = []
        #: Called with every list of actions carried out and the time (metrics).
        self.action_observers: list[Callable[[list[Action], float], None]] = []
        #: Called on close (the metrics server).
        self.closers: list[Callable[[], None]] = []
        self.evict = CheckpointEvictor(self, options.cuda_library,
                                       lambda: self.scheduler.config.grace, options.memory_used)

    def now(self) -> float:
        return self.loop.time()

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        path = self.socket_path
        if len(os.fsencode(path)) >= 104:
            raise DaemonError(f"socket path is too long for a Unix socket: {path}")
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            if _answers(path):
                raise DaemonError(f"another kiwi-scheduler is already listening on {path}")
            path.unlink()
        # Handlers first: a SIGHUP sent the moment the socket answers must reload, not kill.
        for signum, handler in ((signal.SIGTERM, self.stop), (signal.SIGINT, self.stop),
                                (signal.SIGHUP, self.reload)):
            self.loop.add_signal_handler(signum, handler)
        config = self.scheduler.config
        socket_gid = resolve_group(config.socket_group)
        # Bind under a tight umask so the socket is never reachable by others, not even for
        # the moment between bind and chmod.
        old_umask = os.umask(0o177)
        try:
            self._server = await self.loop.create_unix_server(
                lambda: Connection(self), path=str(path))
        finally:
            os.umask(old_umask)
        os.chmod(path, config.socket_mode)
        if socket_gid is not None:
            os.chown(path, -1, socket_gid)
        gpus = ", ".join(f"{g.index} ({g.name}, {_size(g.memory_total)})"
                         for g in self.options.gpus)
        log.info("kiwi-scheduler %s listening on %s: mode %s, TQ %s seconds, GPUs %s",
                 __version__, path, self.scheduler.mode.upper(), f"{self.scheduler.tq:g}", gpus)
        self._warn_about_pools()
        self._arm_timer()

    async def serve_forever(self) -> None:
        await self.start()
        await self.stopped.wait()
        await self.close()

    def stop(self) -> None:
        log.info("Shutting down")
        self.stopped.set()

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for close in self.closers:
            close()
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
            config = self._with_state(config.with_runtime(**self.options.overrides))
        except ConfigError as exc:
            log.error("Config reload failed, keeping the running config: %s", exc)
            return
        self.admin_gid = resolve_group(config.admin_group)
        self.apply(self.scheduler.reconfigure(config, self.now()))
        self._restore_gpu_tq()
        log.info("Config reloaded from %s", self.options.config_file or "defaults")
        self._warn_about_pools()

    # -- messages ---------------------------------------------------------------------------

    def handle(self, conn: Connection, line: bytes) -> None:
        seq = None
        try:
            message = p.decode(line)
            seq = message.get("seq")
            p.check_request(message)
            op = message["op"]
            if not conn.greeted and op != p.HELLO:
                raise p.ProtocolError(p.E_VERSION, "the first message must be hello")
            getattr(self, f"_on_{op}")(conn, message, seq)
        except p.ProtocolError as exc:
            conn.fail(exc, seq)
        except SchedulerError as exc:
            conn.fail(p.ProtocolError(exc.code, str(exc)), seq)
        self._arm_timer()

    def _on_hello(self, conn: Connection, msg: dict[str, Any], seq: int | None) -> None:
        if msg["version"] != p.VERSION:
            raise p.ProtocolError(p.E_VERSION, f"this daemon speaks protocol version "
                                  f"{p.VERSION}, not {msg['version']}")
        if conn.greeted:
            raise p.ProtocolError(p.E_MALFORMED, "hello was already said")
        conn.greeted = True
        conn.send(p.encode(p.WELCOME, seq=seq, version=p.VERSION,
                           daemon=f"kiwi-scheduler {__version__}",
                           max_message=p.MAX_REQUEST_BYTES, mode=self.scheduler.mode,
                           tq=self.scheduler.tq))

    def _on_register(self, conn: Connection, msg: dict[str, Any], seq: int | None) -> None:
        if conn.client_id is not None:
            raise SchedulerError(p.E_STATE, "this connection is already registered")
        labels = msg.get("labels") or {}
        client = self.scheduler.register(
            self.now(),
            name=msg.get("name") or f"pid-{conn.peer.pid}",
            gpu=msg.get("gpu") or 0,
            pool=msg.get("pool") or "default",
            priority=(msg.get("priority") or "NORMAL").upper(),
            pid=conn.peer.pid, uid=conn.peer.uid,
            kind=msg.get("kind") or "client",
            labels={str(k): str(v) for k, v in labels.items()},
            working_set=msg.get("working_set"),
        )
        conn.client_id = client.id
        conn.label = client.name
        self.by_client[client.id] = conn
        evict = self.evict.register(client, msg.get("evict"))
        log.info("Registered %s as %s (pid %s, pool %s, priority %s, GPU %d) [FD=%d]",
                 client.name, client.id, client.pid, client.pool, client.priority, client.gpu,
                 conn.peer.fd)
        conn.send(p.encode(p.REGISTERED, seq=seq, client=client.id, gpu=client.gpu,
                           mode=self.scheduler.mode, tq=self.scheduler.tq_for(client.gpu),
                           evict=evict))

    def _on_acquire(self, conn: Connection, msg: dict[str, Any], seq: int | None) -> None:
        client_id = self._registered(conn)
        now = self.now()
        actions = self.scheduler.acquire(now, client_id)
        own = next((a for a in actions if isinstance(a, Grant) and a.client == client_id), None)
        if own is not None and not self.evict.hold_back(own):
            conn.send(p.encode(p.GRANT, seq=seq, gpu=own.gpu, quantum=own.quantum))
            actions = [a for a in actions if a is not own]
        else:
            conn.send(p.encode(p.WAITING, seq=seq,
                               position=self.scheduler.queue_position(client_id, now) or 1))
        self.apply(actions)

    def _on_release(self, conn: Connection, msg: dict[str, Any], seq: int | None) -> None:
        client_id = self._registered(conn)
        started = time.perf_counter()
        actions = self.scheduler.release(self.now(), client_id,
                                         evict_first=msg.get("evict_first") is True)
        # With evict_first, the scheduler may answer with a drop instead: the releaser keeps
        # the GPU until it has moved its memory out. That drop is the reply, so it carries seq.
        drain = next((a for a in actions if isinstance(a, Drop) and a.client == client_id), None)
        if drain is not None:
            log.debug("%s gives GPU %d back once its memory is out (grace %.1f s)",
                      self._name(client_id), drain.gpu, drain.grace)
            self.apply(actions, reply=(drain, seq))
            return
        # The next holder hears first: it is the one waiting, the releaser has moved on.
        self.apply(actions, handoff_started=started)
        for action in actions:
            if isinstance(action, Released):
                conn.send(p.encode(p.RELEASED, seq=seq, evict=action.evict))

    def _on_working_set(self, conn: Connection, msg: dict[str, Any], seq: int | None) -> None:
        client_id = self._registered(conn)
        actions = self.scheduler.report_working_set(self.now(), client_id, msg["bytes"],
                                                    msg.get("evictable"))
        conn.send(p.encode(p.OK, seq=seq))
        self.apply(actions)

    def _on_status(self, conn: Connection, msg: dict[str, Any], seq: int | None) -> None:
        conn.send(p.encode(p.STATUS_REPLY, seq=seq, status=self.status()))

    def _on_ping(self, conn: Connection, msg: dict[str, Any], seq: int | None) -> None:
        conn.send(p.encode(p.PONG, seq=seq))

    def _on_set_mode(self, conn: Connection, msg: dict[str, Any], seq: int | None) -> None:
        mode = str(msg["mode"]).lower()
        log.info("Received SCHED_%s from %s [FD=%d]", mode.upper(), conn.label, conn.peer.fd)
        self._require_admin(conn, "change the scheduler's mode")
        if mode not in p.MODES:
            raise SchedulerError(p.E_INVALID, f"mode must be one of {', '.join(p.MODES)}")
        actions = self.scheduler.set_mode(self.now(), mode)
        log.info("Scheduler status changed to %s, broadcasting it ...", mode.upper())
        self._save_state()
        conn.send(p.encode(p.OK, seq=seq, mode=self.scheduler.mode, tq=self.scheduler.tq))
        self._broadcast_mode()
        self.apply(actions)

    def _on_set_tq(self, conn: Connection, msg: dict[str, Any], seq: int | None) -> None:
        seconds, gpu = float(msg["tq"]), msg.get("gpu")
        log.info("Received SET_TQ(%g%s) from %s [FD=%d]", seconds,
                 "" if gpu is None else f", GPU {gpu}", conn.label, conn.peer.fd)
        self._require_admin(conn, "change the TQ")
        actions = self.scheduler.set_tq(self.now(), seconds, gpu)
        where = "" if gpu is None else f" on GPU {gpu}"
        log.info("Scheduler TQ changed to %g seconds%s, broadcasting it ...", seconds, where)
        self._save_state()
        conn.send(p.encode(p.OK, seq=seq, mode=self.scheduler.mode, tq=self.scheduler.tq))
        self._broadcast_mode()
        self.apply(actions)

    def lost(self, conn: Connection) -> None:
        self.connections.discard(conn)
        if conn.client_id is None:
            return
        self.by_client.pop(conn.client_id, None)
        self.evict.forget(conn.client_id)
        client = self.scheduler.clients.get(conn.client_id)
        if client is not None and client.state != "idle":
            log.info("Client %s (%s) went away while %s; freeing it [FD=%d]", conn.label,
                     conn.client_id, client.state, conn.peer.fd)
        else:
            log.info("Client %s (%s) disconnected [FD=%d]", conn.label, conn.client_id,
                     conn.peer.fd)
        self.apply(self.scheduler.unregister(self.now(), conn.client_id),
                   handoff_started=time.perf_counter())
        self._arm_timer()

    # -- carrying out ---------------------------------------------------------------------

    def apply(self, actions: list[Action], handoff_started: float | None = None,
              reply: tuple[Drop, int | None] | None = None) -> None:
        """Carry out actions. ``reply``: a drop that answers a request, so it carries its seq."""
        if actions:
            for notify in self.action_observers:
                notify(actions, self.now())
        for action in self.evict.filter(actions):
            conn = self.by_client.get(action.client)
            if isinstance(action, Grant):
                if conn is not None:
                    conn.send(self._grant_line(action))
                if handoff_started is not None:
                    elapsed = time.perf_counter() - handoff_started
                    for observe in self.handoff_observers:
                        observe(elapsed)
            elif isinstance(action, Drop):
                log.debug("Asking %s to drop GPU %d (%s, evict=%s)", action.client, action.gpu,
                          action.reason, action.evict)
                if action.reason == p.REASON_PREEMPT:
                    log.info("Preempting %s on GPU %d for a non-preemptible request",
                             self._name(action.client), action.gpu)
                if conn is not None:
                    seq = reply[1] if reply is not None and reply[0] is action else None
                    conn.send(p.encode(p.DROP, seq=seq, gpu=action.gpu, reason=action.reason,
                                       evict=action.evict, grace=action.grace))
            elif isinstance(action, Revoke):
                log.warning("Revoked GPU %d from %s (%s): it ignored a drop request for "
                            "%.1f seconds", action.gpu, self._name(action.client),
                            action.client, action.ignored_for)
                if conn is not None:
                    conn.send(p.encode(p.REVOKED, gpu=action.gpu, reason=action.reason))

    def _grant_line(self, grant: Grant) -> bytes:
        # The same few bytes every time: encoding them is work in the middle of a handoff.
        key = (grant.gpu, grant.quantum, type(grant.quantum))  # 30 and 30.0 encode apart
        line = self._grant_lines.get(key)
        if line is None:
            if len(self._grant_lines) >= 64:  # TQ changes would grow it without end
                self._grant_lines.clear()
            line = self._grant_lines[key] = p.encode(p.GRANT, gpu=grant.gpu,
                                                     quantum=grant.quantum)
        return line

    def _arm_timer(self) -> None:
        deadline = self.scheduler.next_deadline(self.now())
        if deadline == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = None if deadline is None else self.loop.call_at(deadline, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = self._timer_at = None
        self.apply(self.scheduler.tick(self.now()))
        self._arm_timer()

    # -- helpers --------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return self.evict.annotate(
            build_status(self.scheduler, self.now(), self.options.memory_used()))

    def _registered(self, conn: Connection) -> str:
        if conn.client_id is None:
            raise SchedulerError(p.E_STATE, "register first")
        return conn.client_id

    def _require_admin(self, conn: Connection, what: str) -> None:
        if not is_admin(conn.peer, self.admin_gid):
            log.warning("Refused: uid %s may not %s [FD=%d]", conn.peer.uid, what, conn.peer.fd)
            raise SchedulerError(p.E_PERMISSION, f"Permission denied: only root, the "
                                 f"scheduler's user and the admin group may {what}")

    def _broadcast_mode(self) -> None:
        message = p.encode(p.MODE, mode=self.scheduler.mode, tq=self.scheduler.tq)
        for conn in self.connections:
            if conn.greeted:
                conn.send(message)

    def _name(self, client_id: str) -> str:
        client = self.scheduler.clients.get(client_id)
        return client.name if client else client_id

    def _with_state(self, config: SchedulerConfig) -> SchedulerConfig:
        saved = self.state.load()
        changes: dict[str, Any] = {}
        if saved.get("mode") in p.MODES:
            changes["mode"] = saved["mode"]
        if isinstance(saved.get("tq"), (int, float)) and saved["tq"] > 0:
            changes["tq"] = float(saved["tq"])
        if changes:
            log.info("Restored runtime settings from %s: %s", self.state.path,
                     ", ".join(f"{k} {v}" for k, v in changes.items()))
        return config.with_runtime(**changes)

    def _restore_gpu_tq(self) -> None:
        for index, seconds in (self.state.load().get("gpu_tq") or {}).items():
            if str(index).isdigit() and int(index) in self.scheduler.gpus:
                self.scheduler.gpus[int(index)].tq_override = float(seconds)

    def _save_state(self) -> None:
        overrides = {str(i): g.tq_override for i, g in self.scheduler.gpus.items()
                     if g.tq_override is not None}
        try:
            self.state.save({"mode": self.scheduler.mode, "tq": self.scheduler.tq,
                             "gpu_tq": overrides})
        except OSError as exc:
            log.error("Could not save runtime settings to %s: %s", self.state.path, exc)

    def _warn_about_pools(self) -> None:
        reason = self.scheduler.preemption_off_reason
        if reason:
            log.warning("%s%s", reason[0].upper(), reason[1:])


def _answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            return False
        return True


def _size(nbytes: int | None) -> str:
    return "memory unknown" if nbytes is None else f"{nbytes / 2**30:.1f} GiB"
