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
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from nodeside import limits
from nodeside import protocol as p
from nodeside.client.common import (
    Commands,
    KiwiError,
    default_name,
    env_priority,
    pod_labels,
)
from nodeside.client.connection import ClientConnection, Listener
from nodeside.client.memory import PagesItself
from nodeside.names import shorten_to_bytes
from nodeside.protocol import events as ev
from nodeside.protocol.hold import Hold

T = TypeVar("T")

#: A name for people to see in place of ``name`` (a notebook's path); the Kiwi kernel sets it.
DISPLAY_NAME_ENV = "KIWI_DISPLAY_NAME"


class Client:
    """A connection to the node daemon that can hold one GPU.

    Arguments left as None come from the environment: ``KIWI_SOCKET`` (unset: the node's socket,
    else one a Jupyter server published, see ``discovery``), ``KIWI_CLIENT_NAME``,
    ``KIWI_DISPLAY_NAME``, ``KIWI_POOL``, ``KIWI_PRIORITY``, ``KIWI_GPU`` (default 0).
    ``register=False`` makes a control-only connection that holds nothing. ``reconnect_timeout``
    bounds how long a call waits for an unreachable daemon before it fails with ConnectionError.
    ``pages``: memory this client moves to host memory and back by itself (``memory``): the
    client then speaks the ``memory`` feature for it.

    Its parts: who it is (the fields here), the hold (the methods here, over the session's hold
    table), and a ``ClientConnection`` that keeps the daemon reachable and carries requests.
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
        self.drop_requested = threading.Event()
        self._register = register
        self._refusal: dict[str, Any] | None = None  # the daemon's error answer to our acquire
        self.pages = pages  # before the connection: its registration reads it
        features = (p.FEATURE_POSITION, p.FEATURE_MEMORY) if pages else (p.FEATURE_POSITION,)
        self._connection = ClientConnection(
            socket_path, registration=self._registration if register else None,
            reconnect_timeout=reconnect_timeout, request_timeout=request_timeout,
            heard=self._heard, lost=self._lost, features=features)
        self._commands = Commands(self._connection.request)
        self._session = self._connection.session
        self._changed = self._connection.changed

    # -- what the client knows --------------------------------------------------------------

    @property
    def holding(self) -> bool:
        return self._session.holds

    @property
    def connected(self) -> bool:
        return self._connection.connected

    @property
    def position(self) -> int | None:
        """This client's 1-based place in its GPU's queue while it waits, from the daemon's
        ``waiting`` reply and events; None while not waiting (or not known yet)."""
        return self._session.position

    @property
    def features(self) -> frozenset[str]:
        """The optional protocol features the daemon serves us (from its welcome)."""
        return self._session.features

    @property
    def id(self) -> str | None:
        """The daemon's id for this client, once registered."""
        return self._session.client_id

    @property
    def last_drop(self) -> dict[str, Any] | None:
        """The last drop request: {"reason", "evict", "grace"}; None until one comes."""
        return self._session.last_drop

    @property
    def last_error(self) -> str:
        """Why the latest connection attempt failed, for messages to people."""
        return self._connection.last_error

    @property
    def mode(self) -> str | None:
        """The scheduler's mode, as the daemon last said."""
        return self._connection.mode

    @property
    def tq(self) -> float | None:
        """The scheduler's TQ in seconds, as the daemon last said."""
        return self._connection.tq

    @property
    def socket_path(self) -> str:
        """The daemon's socket: the one in use, or the one tried last."""
        return self._connection.socket_path

    @property
    def reconnect_timeout(self) -> float:
        return self._connection.reconnect_timeout

    @reconnect_timeout.setter
    def reconnect_timeout(self, seconds: float) -> None:
        self._connection.reconnect_timeout = seconds

    @property
    def request_timeout(self) -> float:
        return self._connection.request_timeout

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(message)`` for every event received: from the client's thread, or
        from a thread blocked waiting for a grant while it reads the socket itself."""
        self._connection.add_listener(listener)

    def wait_until(self, predicate: Callable[[], T], timeout: float | None = None) -> T:
        """``predicate()`` once it is true, or its value when ``timeout`` passes: checked now
        and again each time the client hears from the daemon or a connection comes or goes,
        for what the client learns by itself (``connected``, ``position``, ``holding``)."""
        with self._changed:
            return self._changed.wait_for(predicate, timeout)

    # -- the hold ---------------------------------------------------------------------------

    def acquire(self, timeout: float | None = None) -> None:
        """Block until this client holds its GPU. TimeoutError on timeout; ConnectionError if
        the daemon cannot be reached within the timeout (or ``reconnect_timeout``)."""
        self.request()
        if self.wait_for_grant(timeout):
            return
        connected = self._connection.connected
        position = self.position if connected else None
        self._cancel()  # the GPU is never granted to a caller that stopped waiting
        if not connected:
            raise ConnectionError(self._connection.unreachable())
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
        with self._changed:
            if self._session.holds or self._session.wanted:
                return
            self._refusal = None
            self._session.ask()
            # A send that fails means the connection is going: the session asks again on the
            # next one, because we still want the GPU.
            self._connection.send_pending_quietly()

    def wait_for_grant(self, timeout: float | None = None) -> bool:
        """After ``request``: block until the GPU is held (True) or ``timeout`` passes (False;
        the request stays queued, or goes out when an absent daemon is back). An interrupt, a
        refusal (KiwiError) or a daemon unreachable for longer than ``reconnect_timeout``
        (ConnectionError) withdraws the request."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            with self._changed:
                try:
                    return self._wait_for_grant_locked(deadline)
                finally:
                    self._connection.return_socket()
        except BaseException:
            # Take the request back, so the GPU is never granted to a caller that stopped
            # waiting.
            self._cancel()
            raise

    def release(self) -> None:
        """Give the GPU back, or cancel a pending request. A no-op when neither."""
        with self._changed:
            if self._session.holds:
                # No answer to wait for: nothing the daemon sends can undo the release of a
                # hold, and not waiting keeps this process off the CPU while the GPU changes
                # hands. A cancelled wait is different: see _cancel.
                self._session.release()
                self._connection.send_pending_quietly()
                return
        self._cancel()

    def requeue(self) -> None:
        """Give the GPU back and ask for it again, in one request (a holder asked to drop that
        still has work). Returns at once; ``wait_for_grant`` waits for the new grant. Without a
        hold it is ``request``."""
        self._must_register()
        with self._changed:
            if self._session.holds or not self._session.wanted:
                self._refusal = None
            # Its answer is acquire's; a daemon that predates requeue answers "released",
            # and the session then asks the plain way.
            self._session.requeue()
            self._connection.send_pending_quietly()

    def report_working_set(self, nbytes: int, evictable: int | None = None) -> None:
        limits.byte_count(nbytes, "working set")
        deadline = time.monotonic() + self.request_timeout
        with self._changed:  # against _connect: either it sends this, or the session does
            seq = self._session.report_working_set(nbytes, evictable)
            if seq is None:
                return  # kept for the register of the next connection
            self._connection.send_pending()
        self._connection.await_reply(seq, p.WORKING_SET, deadline)

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
        with self._changed:
            seq = self._session.report_working_set(figures.working_set,
                                                   resident=figures.resident, host=figures.host)
            if seq is None:
                return  # the next register carries them
            self._connection.send_pending()
        self._connection.await_reply(seq, p.WORKING_SET, deadline)

    def release_evicting(self) -> None:
        """Give the GPU back on a ``drop`` with ``evict``, the memory still on its way out:
        the hold ends now; ``report_memory`` and then ``evicted`` say how the move goes.
        Without the feature it is a plain ``release``."""
        with self._changed:
            if self._session.holds:
                self._session.release(evicting=True)
                self._connection.send_pending_quietly()
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
        deadline = time.monotonic() + self.request_timeout
        with self._changed:
            seq = self._session.evicted(resident=figures.resident, host=figures.host,
                                        moved=moved, seconds=seconds, failed=failed)
            if seq is None:
                return  # the connection went: the next register says where the memory is
            self._connection.send_pending()
        self._connection.await_reply(seq, p.EVICTED, deadline)

    def ping(self) -> float:
        """Round trip to the daemon, in seconds."""
        start = time.perf_counter()
        self._connection.request(p.PING)
        return time.perf_counter() - start

    # -- the daemon's status and controls ---------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The status document (docs/interfaces.md section 5)."""
        return self._commands.status()

    def set_mode(self, mode: str) -> None:
        """``on``, ``off`` or ``auto``; PermissionError when refused."""
        self._connection.note_mode(self._commands.set_mode(mode))

    def set_tq(self, seconds: float, gpu: int | None = None) -> None:
        """The TQ in seconds (of one GPU, or all); PermissionError when refused."""
        self._connection.note_mode(self._commands.set_tq(seconds, gpu))

    def close(self) -> None:
        self._connection.close()

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
            fields.update(working_set=figures.working_set, resident=figures.resident,
                          host=figures.host)
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
        """Wait with the connection's lock held; False on timeout."""
        while not self._session.holds:
            if self._connection.closed:
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
            if not self._connection.connected and self._connection.down_too_long():
                raise ConnectionError(self._connection.unreachable())
            if self._connection.connected and self._session.queued:
                # Queued (the answer to our acquire came, and it was not a grant): from here
                # the grant comes as an event, best read by this thread. Not earlier: the
                # wake-up this costs the connection thread is better spent while another
                # holds the GPU than while it changes hands, and an immediate grant needs no
                # socket.
                self._connection.borrow_socket()
            self._connection.wait(0.1 if remaining is None else min(remaining, 0.1))
        return True

    def _cancel(self) -> None:
        """Take back a request. Waits for the daemon's answer: a grant that crossed the
        cancel arrives before it, and the session ignores it, since it is releasing."""
        deadline = time.monotonic() + self.request_timeout
        with self._changed:
            if self._connection.closed or self._session.cancel() is None:
                return
            try:
                self._connection.send_pending()
            except ConnectionError:
                return
            generation = self._session.generation
            while self._session.state is Hold.RELEASING and self._connection.connected and \
                    self._session.generation == generation and not self._connection.closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._connection.wait(min(remaining, 0.5))

    # The connection's thread calls these two, from the moment it starts (inside the
    # connection's constructor): they use nothing set after it.

    def _heard(self, event: ev.Event) -> None:
        """What the hold's signals do about an event (with the connection's lock held; the
        session has moved the hold already)."""
        if isinstance(event, ev.Granted):
            self.drop_requested.clear()
        elif isinstance(event, ev.DropAsked) or (isinstance(event, ev.Revoked) and event.held):
            self.drop_requested.set()
        elif isinstance(event, ev.AskRefused):
            self._refusal = event.message  # for the caller waiting for the grant
        elif isinstance(event, ev.EvictAsked):
            self._evict_asked(event)

    def _lost(self, wanted: bool) -> None:
        if wanted:
            # The GPU was taken with the connection; the session asks for it back on the
            # next one.
            self.drop_requested.set()


def _fit(display_name: str | None) -> str | None:
    """A display name the daemon accepts: within its bound, cut with an ellipsis if longer."""
    if display_name is None:
        return None
    return shorten_to_bytes(display_name, limits.MAX_NAME_BYTES)
