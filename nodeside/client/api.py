"""``Client``: what a process that holds a GPU does with its connection (docs/interfaces.md 4).

``acquire`` can be interrupted (Ctrl-C in a notebook) and then cancels its request. It also comes
in two halves, ``request`` and ``wait_for_grant``, for callers that have work to do while the
request travels (the notebook kernel asks when a cell starts and waits in the cell's first
statement). ``position`` is the queue position the daemon last told us, kept up to date by its
``waiting`` events: nobody needs to fetch the status document to show it.

Holds do not survive a daemon restart: while disconnected the client holds nothing; a client
that wanted the GPU when the daemon went away asks for it again as soon as it is back.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from nodeside import limits
from nodeside import protocol as p
from nodeside.client.common import (
    Commands,
    KiwiError,
    default_name,
    env_priority,
    pod_labels,
)
from nodeside.client.connection import Connection
from nodeside.client.memory import PagesItself
from nodeside.names import shorten_to_bytes
from nodeside.protocol import events as ev
from nodeside.protocol.hold import Hold

#: A name for people to see in place of ``name`` (a notebook's path); the Kiwi kernel sets it.
DISPLAY_NAME_ENV = "KIWI_DISPLAY_NAME"


class Client(Connection, Commands):
    """A connection to the node daemon that can hold one GPU.

    Arguments left as None come from the environment: ``KIWI_SOCKET`` (unset: the node's socket,
    else one a Jupyter server published, see ``discovery``), ``KIWI_CLIENT_NAME``,
    ``KIWI_DISPLAY_NAME``, ``KIWI_POOL``, ``KIWI_PRIORITY``, ``KIWI_GPU`` (default 0).
    ``register=False`` makes a control-only connection that holds nothing. ``reconnect_timeout``
    bounds how long a call waits for an unreachable daemon before it fails with ConnectionError.
    ``pages``: memory this client moves to host memory and back by itself (``memory``): the
    client then speaks the ``memory`` feature for it.
    """

    def __init__(self, socket_path: str | None = None, *, name: str | None = None,
                 pool: str | None = None, priority: str | None = None, gpu: int | None = None,
                 register: bool = True, kind: str = "client",
                 labels: dict[str, str] | None = None, display_name: str | None = None,
                 reconnect_timeout: float = 30.0, request_timeout: float = 10.0,
                 pages: PagesItself | None = None) -> None:
        self.name = name or default_name()
        self.display_name = display_name or os.environ.get(DISPLAY_NAME_ENV) or None
        self.pool = pool or os.environ.get("KIWI_POOL") or p.DEFAULT_POOL
        self.priority = env_priority(priority)
        # In Kubernetes the device plugin sets KIWI_GPU to the host index of the pod's GPU
        # (inside the container that GPU is CUDA device 0, but the node daemon counts host GPUs).
        self.gpu = gpu if gpu is not None else int(os.environ.get("KIWI_GPU") or 0)
        self.kind = kind
        self.labels = labels if labels is not None else pod_labels()
        self.pages = pages
        features = (p.FEATURE_POSITION, p.FEATURE_MEMORY) if pages else (p.FEATURE_POSITION,)
        super().__init__(socket_path, register=register, reconnect_timeout=reconnect_timeout,
                         request_timeout=request_timeout, features=features)

    @property
    def holding(self) -> bool:
        return self._session.holds

    def acquire(self, timeout: float | None = None) -> None:
        """Block until this client holds its GPU. TimeoutError on timeout; ConnectionError if
        the daemon cannot be reached within the timeout (or ``reconnect_timeout``)."""
        self.request()
        if self.wait_for_grant(timeout):
            return
        connected = self._connected
        position = self.position if connected else None
        self._cancel()  # the GPU is never granted to a caller that stopped waiting
        if not connected:
            raise ConnectionError(self._unreachable())
        raise TimeoutError(f"no GPU within the timeout (queue position "
                           f"{'unknown' if position is None else position})")

    def request(self) -> None:
        """Ask for the GPU and return at once: ``acquire`` in two halves, "ask now, wait later".

        ``wait_for_grant`` waits for the answer, ``release`` withdraws the request. A caller
        with work to do before it needs the GPU (a kernel compiling a cell) overlaps the round
        trip to the daemon with that work. A no-op while holding or already asking; while the
        daemon is away, the request goes out when it is back.
        """
        self._must_register()
        with self._cond:
            if self._session.holds or self._session.wanted:
                return
            self._refusal = None
            self._session.ask()
            # A send that fails means the connection is going: the session asks again on the
            # next one, because we still want the GPU.
            self._flush_quietly()

    def wait_for_grant(self, timeout: float | None = None) -> bool:
        """After ``request``: block until the GPU is held (True) or ``timeout`` passes (False;
        the request stays queued, or goes out when an absent daemon is back). An interrupt, a
        refusal (KiwiError) or a daemon unreachable for longer than ``reconnect_timeout``
        (ConnectionError) withdraws the request."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            with self._cond:
                try:
                    return self._wait_for_grant_locked(deadline)
                finally:
                    self._return_socket()
        except BaseException:
            # Take the request back, so the GPU is never granted to a caller that stopped
            # waiting.
            self._cancel()
            raise

    def release(self) -> None:
        """Give the GPU back, or cancel a pending request. A no-op when neither."""
        with self._cond:
            if self._session.holds:
                # No answer to wait for: nothing the daemon sends can undo the release of a
                # hold, and not waiting keeps this process off the CPU while the GPU changes
                # hands. A cancelled wait is different: see _cancel.
                self._session.release()
                self._flush_quietly()
                return
        self._cancel()

    def requeue(self) -> None:
        """Give the GPU back and ask for it again, in one request (a holder asked to drop that
        still has work). Returns at once; ``wait_for_grant`` waits for the new grant. Without a
        hold it is ``request``."""
        self._must_register()
        with self._cond:
            if self._session.holds or not self._session.wanted:
                self._refusal = None
            # Its answer is acquire's; a daemon that predates requeue answers "released",
            # and the session then asks the plain way.
            self._session.requeue()
            self._flush_quietly()

    def report_working_set(self, nbytes: int, evictable: int | None = None) -> None:
        limits.byte_count(nbytes, "working set")
        deadline = time.monotonic() + self.request_timeout
        with self._cond:  # against _connect: either it sends this, or the session does
            seq = self._session.report_working_set(nbytes, evictable)
            if seq is None:
                return  # kept for the register of the next connection
            self._flush()
        self._await_reply(seq, p.WORKING_SET, deadline)

    @property
    def speaks_memory(self) -> bool:
        """The daemon serves ``memory`` to this client: it hears where its memory is."""
        return self.pages is not None and p.FEATURE_MEMORY in self.features

    def report_memory(self) -> None:
        """Tell the daemon where the memory of ``pages`` is now: its working set, and what is
        on the GPU and in host memory (the progress of a move out or back in; ``host`` 0 ends
        a move back in)."""
        if self.pages is None:
            raise RuntimeError("a client without pages has no memory figures to report")
        figures = self.pages.figures()
        limits.byte_count(figures.working_set, "working set")
        deadline = time.monotonic() + self.request_timeout
        with self._cond:
            seq = self._session.report_working_set(figures.working_set,
                                                   resident=figures.resident, host=figures.host)
            if seq is None:
                return  # the next register carries them
            self._flush()
        self._await_reply(seq, p.WORKING_SET, deadline)

    def release_evicting(self) -> None:
        """Give the GPU back on a ``drop`` with ``evict``, the memory still on its way out:
        the hold ends now; ``report_memory`` and then ``evicted`` say how the move goes.
        Without the feature it is a plain ``release``."""
        with self._cond:
            if self._session.holds:
                self._session.release(evicting=True)
                self._flush_quietly()
                return
        self._cancel()

    def evicted(self, *, moved: int, seconds: float, failed: str | None = None) -> None:
        """A move out ended (asked with ``evict``, after ``release_evicting``, or of this
        client's own accord): the figures of ``pages`` now, what moved and how long it took,
        or why it could not move (``failed``). Nothing is sent to a daemon without the
        feature."""
        if not self.speaks_memory:
            return
        assert self.pages is not None
        figures = self.pages.figures()
        if failed is not None:
            self._request(p.EVICTED, failed=failed)
            return
        self._request(p.EVICTED, resident=figures.resident, host=figures.host, moved=moved,
                      seconds=round(max(seconds, 0.0), 6))

    def ping(self) -> float:
        """Round trip to the daemon, in seconds."""
        start = time.perf_counter()
        self._request(p.PING)
        return time.perf_counter() - start

    @contextlib.contextmanager
    def hold(self, timeout: float | None = None) -> Iterator[Client]:
        self.acquire(timeout)
        try:
            yield self
        finally:
            self.release()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------------

    def _registration(self) -> dict[str, Any]:
        fields = {"name": self.name, "pool": self.pool, "priority": self.priority,
                  "gpu": self.gpu, "kind": self.kind, "labels": self.labels or None,
                  "display_name": _fit(self.display_name)}
        if self.pages is not None:
            # Where the memory is already: a daemon restart learns it from the register.
            figures = self.pages.figures()
            self._session.working_set = figures.working_set
            fields.update(resident=figures.resident, host=figures.host)
        return fields

    def _evict_asked(self, event: ev.EvictAsked) -> None:
        # On the connection thread, under the lock: the move runs on a thread of its own, so
        # that this one goes on reading (the move's own reports wait for their replies).
        if self.pages is not None:
            threading.Thread(target=self.pages.evict_asked, args=(event.nbytes, event.for_name),
                             name="kiwi-evict", daemon=True).start()

    def _must_register(self) -> None:
        if not self._register:
            raise RuntimeError("a control-only client (register=False) cannot hold a GPU")

    def _wait_for_grant_locked(self, deadline: float | None) -> bool:
        """Wait with self._cond held; False on timeout."""
        while not self._session.holds:
            if self._closed:
                raise ConnectionError("the client was closed")
            if self._refusal is not None:
                refused, self._refusal = self._refusal, None
                raise KiwiError(refused.get("code", "?"), refused.get("message", "refused"))
            if not self._session.wanted:
                raise RuntimeError("no request to wait for: call request() first, "
                                   "or the request was withdrawn")
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            if not self._connected and self._down_too_long():
                raise ConnectionError(self._unreachable())
            if self._connected and self._session.queued:
                # Queued (the answer to our acquire came, and it was not a grant): from here
                # the grant comes as an event, best read by this thread. Not earlier: the
                # wake-up this costs the connection thread is better spent while another
                # holds the GPU than while it changes hands, and an immediate grant needs no
                # socket.
                self._borrow_socket()
            self._wait(0.1 if remaining is None else min(remaining, 0.1))
        return True

    def _cancel(self) -> None:
        """Take back a request. Waits for the daemon's answer: a grant that crossed the
        cancel arrives before it, and the session ignores it, since it is releasing."""
        deadline = time.monotonic() + self.request_timeout
        with self._cond:
            if self._closed or self._session.cancel() is None:
                return
            try:
                self._flush()
            except ConnectionError:
                return
            generation = self._session.generation
            while self._session.state is Hold.RELEASING and self._connected and \
                    self._session.generation == generation and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._wait(min(remaining, 0.5))

    def _call(self, op: str, **fields: Any) -> dict[str, Any]:
        return self._request(op, **fields)


def _fit(display_name: str | None) -> str | None:
    """A display name the daemon accepts: within its bound, cut with an ellipsis if longer."""
    if display_name is None:
        return None
    return shorten_to_bytes(display_name, limits.MAX_NAME_BYTES)
