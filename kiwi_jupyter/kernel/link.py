"""The kernel's connection to the node daemon, and what happens when the daemon is gone.

A kernel outlives daemons: the daemon may be restarted (a new DaemonSet pod, a config change)
while notebooks stay open. The ``Client`` already reconnects and registers again by itself; this
module adds what the kernel needs on top: one client per kernel, made again when the kernel
changes pool or priority (the daemon takes those at registration only), a quick answer to "is
the scheduler there right now?" that never blocks a cell, and one error type,
``SchedulerUnreachable``, for callers to apply the failure policy to.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from nodeside.client import Client, find_socket
from nodeside.client.memory import PagesItself

T = TypeVar("T")

Listener = Callable[[dict[str, Any]], None]

#: A client connects in the background; a cell that comes this soon after the client was made
#: (the kernel just started, or changed pool) waits for the first connection instead of running
#: unarbitrated. Later, "not connected" means the daemon is away, and the answer is immediate.
FIRST_CONNECT_GRACE = 2.0


class SchedulerUnreachable(ConnectionError):
    """The node daemon could not be reached (not running, restarting, or the socket is wrong)."""

    def __init__(self, socket_path: str, reason: str) -> None:
        super().__init__(f"the Kiwi scheduler at {socket_path} is unreachable ({reason})")
        self.socket_path = socket_path
        self.reason = reason


class KernelDaemonLink:
    """The kernel's one scheduling client, registered under the kernel's name."""

    def __init__(self, name: str | None, *, socket_path: str | None = None,
                 reconnect_timeout: float = 30.0, register: bool = True,
                 display_name: str | None = None) -> None:
        self.name = name
        self.display_name = display_name  # what people see: the notebook's path
        self.register = register  # False: a control-only connection, holding nothing
        self._explicit_socket = socket_path
        self.socket_path = find_socket(socket_path)
        self.pool: str | None = None      # None: KIWI_POOL, read by the Client
        self.priority: str | None = None  # None: KIWI_PRIORITY
        self._reconnect_timeout = reconnect_timeout
        self._listeners: list[Listener] = []
        self._client: Client | None = None
        self._made_at = 0.0
        #: Memory the kernel's client moves itself (the stand-in GPU): None until served.
        self.pages: PagesItself | None = None

    @property
    def client(self) -> Client:
        """The client, made on first use. It connects in the background and never raises here."""
        if self._client is None:
            self._client = Client(self._explicit_socket, name=self.name, pool=self.pool,
                                  priority=self.priority, kind="kernel", register=self.register,
                                  display_name=self.display_name,
                                  reconnect_timeout=self._reconnect_timeout, pages=self.pages)
            self.socket_path = self._client.socket_path
            self._made_at = time.monotonic()
            for listener in self._listeners:
                self._client.add_listener(listener)
        return self._client

    @property
    def reconnect_timeout(self) -> float:
        """How long a waiting ``acquire`` keeps its request while the daemon is away."""
        return self._reconnect_timeout

    @reconnect_timeout.setter
    def reconnect_timeout(self, seconds: float) -> None:
        self._reconnect_timeout = seconds
        if self._client is not None:
            self._client.reconnect_timeout = seconds

    @property
    def current(self) -> Client | None:
        """The client if one was made; never makes one."""
        return self._client

    @property
    def client_id(self) -> str | None:
        """The daemon's id for this kernel while registered (it changes on reconnection)."""
        return None if self._client is None else self._client.id

    def add_listener(self, listener: Listener) -> None:
        """Hear the daemon's events (drop, revoked, mode) on this and every later client."""
        self._listeners.append(listener)
        if self._client is not None:
            self._client.add_listener(listener)

    def check(self) -> None:
        """Raise SchedulerUnreachable unless the client is connected right now."""
        client = self.client
        while not client.connected and time.monotonic() - self._made_at < FIRST_CONNECT_GRACE:
            time.sleep(0.002)
        if not client.connected:
            raise SchedulerUnreachable(self.socket_path, client.last_error or "not connected")

    def call(self, action: Callable[[Client], T]) -> T:
        """Run a request on the client; a lost or absent daemon is SchedulerUnreachable."""
        client = self.client
        try:
            return action(client)
        except (ConnectionError, TimeoutError) as exc:
            if isinstance(exc, SchedulerUnreachable):
                raise
            raise SchedulerUnreachable(self.socket_path, str(exc) or type(exc).__name__) \
                from exc

    def regroup(self, *, pool: str | None = None, priority: str | None = None) -> None:
        """Join another pool or priority: a fresh registration, as the daemon requires."""
        if pool is not None:
            self.pool = pool
        if priority is not None:
            self.priority = priority
        self.close()

    def serve(self, pages: PagesItself) -> None:
        """Speak the ``memory`` feature for ``pages`` from now on: a fresh registration, since
        the feature is asked for in hello."""
        self.pages = pages
        self.close()

    def rejoin(self, *, pool: str | None, priority: str | None) -> None:
        """Register again as before a ``regroup`` the daemon refused (None: from the
        environment), instead of retrying a registration it will never take."""
        self.pool, self.priority = pool, priority
        self.close()

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()

