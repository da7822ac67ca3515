"""The daemon's asyncio shell: its parts wired once, and its life (start, reload, stop).

Each connection (``connection.py``) feeds its bytes to a ``Session`` (``session.py``), whose
requests ``Requests`` (``requests.py``) answers by calling the scheduler; the ``Shell``
(``shell.py``), the router every connection talks to, carries out what they return, through
``Delivery`` (``delivery.py``) for the scheduler's actions and the checkpoint evictor's lines
(``nodeside.evict``), and arms the timers (``timers.py``). This file makes those parts, each
given what it needs when it is made, listens on the socket, handles signals and reloads the
config. Nothing here decides who gets a GPU or what a peer may say.
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
from nodeside.config import ConfigError
from nodeside.config import load as load_config
from nodeside.daemon.admission import Admission
from nodeside.daemon.connection import DaemonConnection
from nodeside.daemon.kube import PodNamespaces
from nodeside.daemon.listen import listen
from nodeside.daemon.lograte import RateLimitedLog
from nodeside.daemon.options import DaemonOptions
from nodeside.daemon.pause_watch import Note
from nodeside.daemon.pause_watch import watch as watch_pauses
from nodeside.daemon.peer import resolve_group
from nodeside.daemon.process_memory import watch as watch_process_memory
from nodeside.daemon.requests import Requests
from nodeside.daemon.shell import Shell
from nodeside.daemon.state_file import StateFile
from nodeside.evict.evictor import CheckpointEvictor
from nodeside.evict.lines import EvictionLines
from nodeside.formats import size
from nodeside.scheduler.core import Action, Scheduler

log = logging.getLogger("kiwi.daemon")

#: File descriptors kept for the daemon itself (state file, metrics, NVML, the log).
_RESERVED_FDS = 64


class Daemon:
    def __init__(self, options: DaemonOptions) -> None:
        self.options = options
        self.socket_path = Path(options.socket)
        self.state = StateFile(options.state_file)
        self.loop = asyncio.get_running_loop()
        #: The loop's clock, asked several times a request: its own method, no frame between.
        #: asyncio's own loop.time is a Python method that returns time.monotonic(): that is
        #: called directly instead (a C function, no frame); another loop's (uvloop's, or a
        #: test's virtual time) is kept.
        self.now: Callable[[], float] = time.monotonic \
            if type(self.loop).time is asyncio.BaseEventLoop.time else self.loop.time
        config = self.state.apply(options.config)
        self.scheduler = Scheduler(config, options.gpus, self.now())
        # Nobody has registered yet: nothing follows that the shell would carry out.
        self.state.restore_gpu_tq(self.scheduler, self.now())
        #: Suspends and resumes processes registered with evict "checkpoint"; every action
        #: passes its lines on the way out, so a grant waits until the GPU is really free.
        self.evictor = CheckpointEvictor(EvictionLines(self.scheduler), self.loop,
                                         options.cuda_library,
                                         lambda: self.scheduler.config.grace,
                                         options.memory_used,
                                         lambda: self.scheduler.config.checkpoint_timeout)
        self.pods = PodNamespaces(options.pods, options.proc_root)
        self.requests = Requests(self.scheduler, resolve_group(config.admin_group),
                                 options.memory_used, self.evictor, self.pods.of)
        self.requests.tiers.meminfo = options.meminfo
        # Nobody has registered yet: nothing follows that the shell would carry out.
        self.requests.tiers.read_host_memory(self.now())
        self.admission = Admission(config.connections, _connection_cap())
        #: What every connection talks to (``DaemonConnection(daemon.router)``).
        self.router = Shell(self.requests, self.now, self.loop, self.admission, self.state,
                            self.evictor)
        self.delivery = self.router.delivery
        self.timers = self.router.timers
        #: Called with the seconds between a release arriving and the next grant being sent.
        self.handoff_observers = self.delivery.handoff_observers
        #: Called with every list of actions carried out and the time (metrics).
        self.action_observers = self.delivery.action_observers
        #: Called on close (the metrics server).
        self.closers: list[Callable[[], None]] = []
        self.stopped = asyncio.Event()
        self._server: asyncio.AbstractServer | None = None
        #: What was said about namespaces being off: "info" at start, "warning" once rules
        #: name namespaces; never more than that, however often the config is reloaded.
        self._pods_off_said: str | None = None
        #: Paused holders seen working (pause_watch.py): read from NVML while one is paused.
        self.pauses = self.requests.documents.pauses
        self._pause_watch: asyncio.Task[None] | None = None
        self._memory_watch: asyncio.Task[None] | None = None
        self._pause_log = RateLimitedLog(logging.getLogger("kiwi.pauses"), 60.0, self.now)

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        # Handlers first: a SIGHUP sent the moment the socket answers must reload, not kill.
        for signum, handler in ((signal.SIGTERM, self.stop), (signal.SIGINT, self.stop),
                                (signal.SIGHUP, self.reload)):
            self.loop.add_signal_handler(signum, handler)
        path = self.socket_path
        router = self.router
        self._server = await listen(self.loop, path, self.scheduler.config,
                                    lambda: DaemonConnection(router))
        # "GPU 0 (logical GPU, size unknown)", not "GPUs 0 (...)", which reads as none.
        gpus = ", ".join(f"GPU {g.index} ({g.name}, {_size(g.memory_total)})"
                         for g in self.options.gpus)
        log.info("kiwi-scheduler %s listening on %s: mode %s, TQ %s seconds, %s",
                 __version__, path, self.scheduler.mode.upper(), f"{self.scheduler.tq:g}", gpus)
        self._warn_about_pools()
        self.timers.arm_deadline()
        self.pods.start()
        self._say_if_namespaces_are_off()
        self.start_watches()

    def start_watches(self) -> None:
        """Read the host's memory from now on, and NVML's per-process figures where the options
        give readers."""
        self.timers.arm_host_reads()
        read = self.options.process_utilization
        if read is not None:
            self._pause_watch = self.loop.create_task(
                watch_pauses(self.pauses, self.scheduler, read, self.now, self._paused_working))
        read_memory = self.options.process_memory
        if read_memory is not None:
            soon = asyncio.Event()
            self.requests.nvml_soon = soon.set
            self._memory_watch = self.loop.create_task(
                watch_process_memory(self.scheduler, read_memory, self.now, self._nvml_memory,
                                     soon))

    async def serve_forever(self) -> None:
        await self.start()
        await self.stopped.wait()
        await self.close()

    def stop(self) -> None:
        log.info("Shutting down")
        self.stopped.set()

    async def close(self) -> None:
        self.timers.close()
        for task in (self._pause_watch, self._memory_watch):
            if task is not None:
                task.cancel()
        for close in self.closers:
            close()
        await self.pods.close()
        if self._server is not None:
            self._server.close()
        for endpoint in list(self.router.endpoints):
            if endpoint.transport is not None:
                endpoint.transport.close()
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
        self.delivery.apply(self.requests.tiers.read_host_memory(self.now()))
        self.delivery.apply(self.state.restore_gpu_tq(self.scheduler, self.now()))
        log.info("Config reloaded from %s", self.options.config_file or "defaults")
        self.timers.note_change()  # pools, TQ or mode may read otherwise now
        self._warn_about_pools()
        self._say_if_namespaces_are_off()

    # -- helpers --------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return self.requests.status(self.now())

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

    def _nvml_memory(self, actions: list[Action]) -> None:
        """What NVML's per-process figures moved: the core's decisions, and the document."""
        self.delivery.apply(actions)
        self.timers.note_change()

    def _paused_working(self, notes: list[Note]) -> None:
        for n in notes:
            self._pause_log.warning(
                n.client, "%s (%s, pid %d) works on GPU %d while paused: %d %% of its SMs "
                "%.1f s into its pause, %d pause(s) so far; it says pausable but does not "
                "pause (status: pause_ignored)", n.name, n.client, n.pid, n.gpu, n.sm,
                n.into_pause, n.count)
        self.timers.note_change()  # the document's pause_ignored moved

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
    return "size unknown" if nbytes is None else size(nbytes)
