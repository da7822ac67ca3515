"""The Kiwi server extension: its options, its endpoints and the embedded scheduler's lifetime.

Enabled on install (jupyter-config/); configure with ``c.KiwiExtension.<option>`` in a Jupyter
config file or ``--KiwiExtension.<option>=`` on the command line.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import os
import sysconfig
from pathlib import Path
from typing import Any

from jupyter_server.extension.application import ExtensionApp
from traitlets import Bool, Enum, Float, List, Unicode, default, validate

from kiwi_jupyter.kernel.identity import NOTEBOOK_ROOT_ENV
from kiwi_jupyter.server.embedded import (
    EmbeddedScheduler,
    EmbeddedSchedulerError,
    daemon_answers,
    default_command,
)
from kiwi_jupyter.server.handlers import (
    IntentHandler,
    NvmlHandler,
    SchedulerHandler,
    StatusHandler,
)
from kiwi_jupyter.server.intents import FrontHints, hinting
from kiwi_jupyter.server.link import ServerDaemonLink
from kiwi_jupyter.server.nvml import GpuReadings
from kiwi_jupyter.server.terminals import keep_on_terminal_path, with_on_path
from kiwi_jupyter.server.watch import StatusWatch
from nodeside.client.backoff import Backoff
from nodeside.protocol import DEFAULT_SOCKET, MODES


class KiwiExtension(ExtensionApp):
    """Serves the Kiwi GPU panel's endpoints and, where no daemon runs, a scheduler of its own."""

    name = "kiwi_jupyter"
    # Nothing to open in a browser: the panel is a JupyterLab extension.
    load_other_extensions = True

    # What initialize_settings makes, None until it has: the server stops its extensions even
    # when one failed to load, and a stop must then end what was started, never raise.
    embedded: EmbeddedScheduler | None = None
    #: Why the embedded scheduler is not running: its failed start, for the panel and the log.
    embedded_failure: str | None = None
    link: ServerDaemonLink | None = None
    watch: StatusWatch | None = None
    nvml: GpuReadings | None = None
    _watcher: asyncio.Task[None] | None = None
    _embedded_gave_up = False
    _saved_root_env: str | None = None
    _root_env_set = False

    embedded_scheduler = Bool(
        config=True,
        help="""Start a kiwi-scheduler of this server's own when nothing answers at `socket`.
        It listens on a socket private to this server; every kernel the server starts is given
        its path in KIWI_SOCKET. Default: on, except inside Kubernetes (KUBERNETES_SERVICE_HOST
        set), where the node's DaemonSet runs the scheduler.""",
    )

    @default("embedded_scheduler")
    def _default_embedded(self) -> bool:
        return "KUBERNETES_SERVICE_HOST" not in os.environ

    publish_socket = Bool(
        True,
        config=True,
        help="""Publish the embedded scheduler's socket for this user, as a symlink at
        $XDG_RUNTIME_DIR/kiwi/scheduler.sock (else in Jupyter's runtime directory), so that
        `kiwictl` finds it with no --socket. Removed when the server stops.""",
    )

    scripts_on_path = Bool(
        True,
        config=True,
        help="""Put the folder of this Python's commands (a venv's bin: kiwictl,
        kiwi-scheduler) first on PATH for the kernels and terminals this server starts, so
        `kiwictl` works in JupyterLab's terminal although the venv was never activated. A
        terminal that starts a login shell (the server runs without a terminal of its own)
        gets it back after the shell's profile has set PATH.""",
    )

    socket = Unicode(
        config=True,
        help="""Path of the node daemon's Unix socket. Default: $KIWI_SOCKET, else
        /var/run/kiwi/scheduler.sock.""",
    )

    @default("socket")
    def _default_socket(self) -> str:
        return os.environ.get("KIWI_SOCKET") or DEFAULT_SOCKET

    tq = Float(
        None,
        allow_none=True,
        config=True,
        help="Time quantum in seconds for the embedded scheduler (--tq). None: its default, 30.",
    )
    mode = Enum(
        list(MODES),
        None,
        allow_none=True,
        config=True,
        help="Mode of the embedded scheduler (--mode on|off|auto). None: its default, on.",
    )
    config_file = Unicode(
        "",
        config=True,
        help="YAML or TOML file with tq, mode and pools for the embedded scheduler (--config).",
    )
    scheduler_command = List(
        Unicode(),
        config=True,
        help="""Command that runs the scheduler; `--socket PATH` and the options above are
        appended. Default: the kiwi-scheduler installed beside this Python.""",
    )

    @default("scheduler_command")
    def _default_command(self) -> list[str]:
        return default_command()

    scheduler_args = List(
        Unicode(),
        config=True,
        help="""More arguments for the embedded scheduler, e.g. ["--gpu-memory", "16GiB"]. On
        the command line, as the list written out (--KiwiExtension.scheduler_args=
        '["--gpu-memory", "16GiB"]', also without the quotes a shell takes off) or as the
        option repeated once per argument.""",
    )

    @validate("scheduler_args")
    def _written_as_a_list(self, proposal: Any) -> list[str]:
        # Jupyter's command line gives an extension's list option written out as a list as one
        # string, ``["--gpu-memory", "16GiB"]``, or, after a shell took its quotes,
        # ``[--gpu-memory,16GiB]``: either is read as the list it says.
        args = [str(arg) for arg in proposal["value"]]
        if len(args) == 1:
            return list_written_out(args[0]) or args
        return args
    watch_interval = Float(
        0.5,
        config=True,
        help="Seconds between two checks that the embedded scheduler still runs.",
    )
    status_max_age = Float(
        0.1,
        config=True,
        help="""Seconds a status document is reused across requests. However many browsers
        poll (every 500 ms by default, the panel's refresh rate setting), the daemon sees at
        most one status request per this interval.""",
    )
    long_poll_timeout = Float(
        25.0,
        config=True,
        help="""Seconds a long-poll of the panel (`GET kiwi/api/status?after=TAG`) waits for a
        change before it answers with a fresh document anyway: under the idle timeouts of the
        proxies in front of Jupyter (JupyterHub's, a load balancer's), and often enough that a
        browser notices a server that went away.""",
    )
    daemon_timeout = Float(
        5.0,
        config=True,
        help="Seconds to wait for the daemon's answer before reporting it unreachable.",
    )
    hint_on_execute = Bool(
        True,
        config=True,
        help="""Tell the daemon when a cell is sent to a kernel (request `intent`, reason
        `execute`), as the server forwards it, so that the daemon starts bringing the
        kernel's memory back from host memory or disk before the cell's first GPU call. The
        hint never waits for the daemon nor holds the cell back.""",
    )

    def initialize_settings(self) -> None:
        self._saved_socket_env = os.environ.get("KIWI_SOCKET")
        self._saved_path = os.environ.get("PATH")
        if self.scripts_on_path:
            os.environ["PATH"] = with_on_path(self.scripts, os.environ.get("PATH", ""))
        socket_path = self.socket
        if self.embedded_scheduler and not daemon_answers(socket_path):
            # Runtime changes (the panel's mode and TQ) survive the child's restarts; the file
            # lives as long as this server, next to its own runtime files.
            assert self.serverapp is not None  # settings are initialized inside a server
            state_file = Path(self.serverapp.runtime_dir) / f"kiwi-scheduler-{os.getpid()}.json"
            self.embedded = EmbeddedScheduler(self.scheduler_command, self._scheduler_options(),
                                              publish=self.publish_socket,
                                              state_file=state_file)
            socket_path = self.embedded.socket_path
            try:
                self.embedded.start()
            except EmbeddedSchedulerError as exc:
                # The server runs on without it: the panel says why, and the kernels wait for
                # it at its socket, where a restart (not after a bad command line) brings it.
                self._embedded_failed(exc)
            else:
                self.log.info("Kiwi: embedded scheduler listening on %s", socket_path)
                if self.embedded.published is not None:
                    self.log.info("Kiwi: published it at %s for kiwictl",
                                  self.embedded.published)
        else:
            self.log.info("Kiwi: using the scheduler at %s", socket_path)
        # Kernels inherit the server's environment: this is how every kernel this server
        # starts finds the scheduler, embedded or not, and names its notebook as the Lab does.
        os.environ["KIWI_SOCKET"] = socket_path
        self._saved_root_env = os.environ.get(NOTEBOOK_ROOT_ENV)
        if self.serverapp is not None:
            os.environ[NOTEBOOK_ROOT_ENV] = os.path.abspath(self.serverapp.root_dir)
            self._root_env_set = True
        self.link = ServerDaemonLink(
            socket_path, max_age=self.status_max_age, timeout=self.daemon_timeout,
            absent_reason=lambda: self.embedded_failure,
        )
        # The panel's long-polls wait on this one connection, which hears the daemon's changes.
        self.watch = StatusWatch(socket_path, timeout=self.daemon_timeout,
                                 max_age=self.status_max_age)
        self.nvml = GpuReadings()
        self.settings.update({"kiwi_link": self.link, "kiwi_watch": self.watch,
                              "kiwi_long_poll_timeout": self.long_poll_timeout,
                              "kiwi_nvml": self.nvml, "kiwi_extension": self,
                              "kiwi_front_hints": FrontHints(self.link)})
        connection_class = self.settings.get("kernel_websocket_connection_class")
        if self.hint_on_execute and connection_class is not None:
            # Whichever class the server uses (its own, a gateway's, a user's): a cell's
            # execute_request passes through it on its way to the kernel.
            self.settings["kernel_websocket_connection_class"] = hinting(connection_class,
                                                                         self.link)

    @property
    def scripts(self) -> str:
        """Where this Python's commands are installed (kiwictl beside jupyter)."""
        return sysconfig.get_path("scripts")

    def initialize_handlers(self) -> None:
        self.handlers.extend(
            [
                (r"/kiwi/api/status", StatusHandler),
                (r"/kiwi/api/scheduler", SchedulerHandler),
                (r"/kiwi/api/nvml", NvmlHandler),
                (r"/kiwi/api/intent", IntentHandler),
            ]
        )

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        if self.scripts_on_path:
            keep_on_terminal_path(serverapp.web_app.settings.get("terminal_manager"),
                                  self.scripts, configured=bool(
                                      serverapp.terminado_settings.get("shell_command")))
        if self.embedded is not None and not self._embedded_gave_up:
            self._watcher = asyncio.ensure_future(self._watch_embedded())

    async def stop_extension(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        if self.watch is not None:
            await self.watch.stop()
        if self.link is not None:
            self.link.close()
        if self.nvml is not None:
            self.nvml.close()
        if self.embedded is not None:
            self.embedded.stop()
            self.embedded = None
            _restore_env("KIWI_SOCKET", self._saved_socket_env)
        if self.scripts_on_path:
            _restore_env("PATH", self._saved_path)
        if self._root_env_set:
            _restore_env(NOTEBOOK_ROOT_ENV, self._saved_root_env)

    async def _watch_embedded(self) -> None:
        """Restart the embedded scheduler whenever it dies, backing off if it keeps dying."""
        restarts, extra = Backoff(1.0, 30.0), 0.0
        while self.embedded is not None:
            await asyncio.sleep(self.watch_interval + extra)
            try:
                if await self.embedded.restart_if_dead():
                    extra = restarts.next()
                    self.embedded_failure = None
                    self.log.info("Kiwi: embedded scheduler restarted (pid %s)", self.embedded.pid)
                else:
                    restarts.reset()
                    extra = 0.0
            except EmbeddedSchedulerError as exc:
                self._embedded_failed(exc)
                if exc.final:
                    return
                extra = restarts.next()
            except Exception:  # noqa: BLE001 - keep watching: the next round tries again
                self.log.exception("Kiwi: could not restart the embedded scheduler")
                extra = restarts.next()

    def _embedded_failed(self, exc: EmbeddedSchedulerError) -> None:
        self.embedded_failure = f"the embedded scheduler could not start: {exc}"
        self._embedded_gave_up = exc.final
        if exc.final:
            self.log.error("Kiwi: %s. Not trying again: fix the options and restart the "
                           "server.", self.embedded_failure)
        else:
            self.log.error("Kiwi: %s; trying again", self.embedded_failure)

    def _scheduler_options(self) -> list[str]:
        options: list[str] = []
        if self.tq is not None:
            options += ["--tq", repr(self.tq)]
        if self.mode is not None:
            options += ["--mode", self.mode]
        if self.config_file:
            options += ["--config", self.config_file]
        return options + list(self.scheduler_args)


def list_written_out(text: str) -> list[str] | None:
    """The arguments of a list written out in one string: ``["--gpu-memory", "16GiB"]`` (JSON
    or Python), or ``[--gpu-memory,16GiB]`` as a shell leaves it; None when ``text`` is no
    list."""
    text = text.strip()
    if not (text.startswith("[") and text.endswith("]")):
        return None
    try:
        parsed = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return [item.strip().strip("'\"") for item in text[1:-1].split(",") if item.strip()]
    if isinstance(parsed, list) and all(isinstance(item, str) for item in parsed):
        return parsed
    return None


def _restore_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
