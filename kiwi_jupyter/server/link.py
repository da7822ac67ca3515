"""The server's line to the node daemon: `nodeside.client.ControlClient` calls, run off the loop.

The ControlClient is blocking (one synchronous connection, no thread of its own). Tornado must
never wait on a socket, so every call runs on one worker thread; one thread also means one
connection and requests that never interleave on it. Status requests are coalesced: however many
browser tabs poll, the daemon sees at most one status request per ``max_age`` seconds.

Hints (``intent``: a kernel is about to work) go the same way but are never awaited: ``hint``
only queues one for the worker and returns. At most ``MAX_HINTS_QUEUED`` wait at a time (more
are dropped: a hint is worth something only while it is fresh), and after the daemon could not
be reached hints are dropped for ``HINT_PAUSE`` seconds, so a daemon that is away costs a cell
nothing, not even a connection attempt each.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from nodeside import protocol as p
from nodeside.client import ControlClient
from nodeside.client.common import KiwiError
from nodeside.names import current_user

log = logging.getLogger("kiwi_jupyter")

#: Whose view the panel is: the user this server runs as (``nodeside.names.label``).
_VIEWER = current_user()
#: Hints waiting for the worker at most; one more is dropped.
MAX_HINTS_QUEUED = 16
#: Seconds hints are dropped after the daemon could not be reached.
HINT_PAUSE = 2.0


class DaemonUnavailable(Exception):
    """The daemon could not be reached or did not answer in time; the message says which."""


class ServerDaemonLink:
    """Asynchronous access to one daemon socket for the request handlers."""

    def __init__(
        self,
        socket_path: str,
        *,
        max_age: float = 0.1,
        timeout: float = 5.0,
        client_factory: Callable[[str], Any] | None = None,
        absent_reason: Callable[[], str | None] | None = None,
    ) -> None:
        self.socket_path = socket_path
        #: Why nothing answers, where the server knows better than the socket (an embedded
        #: scheduler that failed to start); None: the connection's own words.
        self._absent_reason = absent_reason
        self.max_age = max_age
        self.timeout = timeout
        self._client_factory = client_factory or self._control_client
        self._client: Any = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kiwi-daemon-link")
        self._inflight: asyncio.Future[dict[str, Any]] | None = None
        self._cached: dict[str, Any] | None = None
        self._cached_at = 0.0
        # Counted by the loop's thread and the worker both.
        self._hints_lock = threading.Lock()
        self._hints_queued = 0
        self._hints_paused_until = 0.0
        #: Hints the daemon took, refused (a kernel it does not know), and dropped (queue
        #: full, daemon away), since the server started.
        self.hints_sent = 0
        self.hints_refused = 0
        self.hints_dropped = 0

    async def status(self) -> dict[str, Any]:
        """The status document with ``reachable`` (and ``reason`` when it is not)."""
        if self._cached is not None and time.monotonic() - self._cached_at < self.max_age:
            return self._cached
        if self._inflight is None or self._inflight.done():
            self._inflight = asyncio.ensure_future(self._fetch_status())
        # shield: a browser that goes away must not cancel the fetch other requests await.
        return await asyncio.shield(self._inflight)

    async def set_mode(self, mode: str) -> None:
        """Raises PermissionError when the daemon refuses, DaemonUnavailable when it is gone."""
        await self._call("set_mode", mode)
        self._cached = None

    async def set_tq(self, seconds: float) -> None:
        await self._call("set_tq", seconds)
        self._cached = None

    def hint(self, name: str, reason: str) -> bool:
        """Tell the daemon, without waiting for it, that the kernel registered as ``name`` is
        about to work (``reason`` ``execute`` or ``front``). False when the hint was dropped."""
        with self._hints_lock:
            if self._hints_queued >= MAX_HINTS_QUEUED or \
                    time.monotonic() < self._hints_paused_until:
                self.hints_dropped += 1
                return False
            self._hints_queued += 1
        try:
            self._executor.submit(self._hint_in_thread, name, reason)
        except RuntimeError:  # the link is closed: the server is stopping
            with self._hints_lock:
                self._hints_queued -= 1
                self.hints_dropped += 1
            return False
        return True

    def close(self) -> None:
        self._executor.submit(self._drop_client)
        self._executor.shutdown(wait=False, cancel_futures=False)

    async def _fetch_status(self) -> dict[str, Any]:
        try:
            document = served_document(await self._call("status"), self.socket_path)
        except DaemonUnavailable as exc:
            known = self._absent_reason() if self._absent_reason is not None else None
            document = {"reachable": False, "reason": known or str(exc),
                        "socket": self.socket_path}
        self._cached, self._cached_at = document, time.monotonic()
        return document

    async def _call(self, method: str, *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._executor, self._call_in_thread, method, args)
        try:
            return await asyncio.wait_for(future, self.timeout)
        except asyncio.TimeoutError:
            raise DaemonUnavailable(
                f"the Kiwi daemon at {self.socket_path} did not answer within {self.timeout:g} s"
            ) from None

    def _call_in_thread(self, method: str, args: tuple[Any, ...],
                        fields: Mapping[str, Any] | None = None) -> Any:
        """Runs on the worker thread: (re)connect as needed and make one call."""
        try:
            if self._client is None:
                self._client = self._client_factory(self.socket_path)
            return getattr(self._client, method)(*args, **(fields or {}))
        except PermissionError:
            raise
        except (OSError, EOFError) as exc:  # ConnectionError and TimeoutError among them
            # The daemon went away (or never was): forget the connection so the next call
            # connects afresh, which is also how a restarted daemon is picked up.
            self._drop_client()
            raise DaemonUnavailable(_describe(exc, self.socket_path)) from exc

    def _hint_in_thread(self, name: str, reason: str) -> None:
        with self._hints_lock:
            self._hints_queued -= 1
        try:
            self._call_in_thread("request", (p.INTENT,), {"name": name, "reason": reason})
        except DaemonUnavailable as exc:
            with self._hints_lock:
                self._hints_paused_until = time.monotonic() + HINT_PAUSE
                self.hints_dropped += 1
            log.debug("Kiwi: no hint for %s: %s", name, exc)
        except KiwiError as exc:  # a kernel the daemon does not know (yet), an older daemon
            with self._hints_lock:
                self.hints_refused += 1
            log.debug("Kiwi: the daemon refused the hint for %s: %s", name, exc)
        else:
            with self._hints_lock:
                self.hints_sent += 1

    def _control_client(self, socket_path: str) -> ControlClient:
        # A control connection: the server observes and steers; it never holds a GPU, so it
        # does not show up as a client in the status document it serves.
        return ControlClient(socket_path, timeout=self.timeout)

    def _drop_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(OSError):
                client.close()


def served_document(status: Mapping[str, Any], socket_path: str) -> dict[str, Any]:
    """The daemon's status document as the server serves it: ``reachable``, ``socket`` and
    ``viewer`` added (the plain endpoint and the long-poll's watch both answer with this)."""
    return {**status, "reachable": True, "socket": socket_path, "viewer": _VIEWER}


def _describe(exc: BaseException, socket_path: str) -> str:
    if isinstance(exc, (TimeoutError, FileNotFoundError, ConnectionRefusedError)) or \
            type(exc) is ConnectionError:
        return str(exc)  # the ControlClient's own words: where it looked and why it failed
    return f"lost the Kiwi daemon at {socket_path}: {exc or type(exc).__name__}"
