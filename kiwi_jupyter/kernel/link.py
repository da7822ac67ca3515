"""The kernel's connection to the node daemon, and what happens when the daemon is gone.

A kernel outlives daemons: the daemon may be restarted (a new DaemonSet pod, a config change)
while notebooks stay open. ``DaemonLink`` makes the kernel's ``Client`` when it is first needed,
forgets it when the connection breaks, and makes a fresh one (registering again, since client ids
do not survive a restart) the next time. Every failure to reach the daemon comes out as
``SchedulerUnreachable``, so callers have one error to apply the failure policy to.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

from nodeside.client import Client

T = TypeVar("T")

DEFAULT_SOCKET = "/var/run/kiwi/scheduler.sock"


class SchedulerUnreachable(ConnectionError):
    """The node daemon could not be reached (not running, restarting, or the socket is wrong)."""

    def __init__(self, socket_path: str, reason: str) -> None:
        super().__init__(f"the Kiwi scheduler at {socket_path} is unreachable: {reason}")
        self.socket_path = socket_path
        self.reason = reason


class DaemonLink:
    """The kernel's one scheduling client, remade after the daemon goes away."""

    def __init__(self, name: str | None, *, socket_path: str | None = None,
                 pool: str | None = None, priority: str | None = None) -> None:
        self.name = name
        self.socket_path = socket_path or os.environ.get("KIWI_SOCKET", DEFAULT_SOCKET)
        self.pool = pool            # None: KIWI_POOL, read by the Client
        self.priority = priority    # None: KIWI_PRIORITY
        self._client: Client | None = None

    @property
    def current(self) -> Client | None:
        """The client if one is connected; never connects."""
        return self._client

    @property
    def client_id(self) -> str | None:
        """The daemon's id for this kernel while registered (it changes on reconnection)."""
        return None if self._client is None else _client_id(self._client)

    def client(self) -> Client:
        """The live client, connecting and registering if there is none."""
        if self._client is None:
            try:
                self._client = Client(self.socket_path, name=self.name, pool=self.pool,
                                      priority=self.priority)
            except OSError as exc:  # ConnectionError, FileNotFoundError, PermissionError
                raise SchedulerUnreachable(self.socket_path, _reason(exc)) from exc
        return self._client

    def call(self, action: Callable[[Client], T], *, retry: bool = True) -> T:
        """Run ``action`` on the client; after a broken connection, once more on a fresh one.

        The retry is what makes a daemon restart invisible: the old connection fails on first
        use, and the new daemon is usually already listening.
        """
        try:
            return action(self.client())
        except SchedulerUnreachable:
            raise
        except (ConnectionError, BrokenPipeError, EOFError) as exc:
            self.forget()
            if not retry:
                raise SchedulerUnreachable(self.socket_path, _reason(exc)) from exc
        return self.call(action, retry=False)

    def regroup(self, *, pool: str | None = None, priority: str | None = None) -> None:
        """Join another pool or priority: the daemon takes these at registration only."""
        if pool is not None:
            self.pool = pool
        if priority is not None:
            self.priority = priority
        self.forget()

    def forget(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except OSError:
                pass  # already broken: closing it is all that was left to do

    close = forget


def _client_id(client: Client) -> str | None:
    value: Any = getattr(client, "client_id", None) or getattr(client, "id", None)
    return value if isinstance(value, str) else None


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
