"""The live line a cell shows while it waits for the GPU.

One output, published with a display id and then updated in place (``update_display_data``), so
a long wait is one line that changes rather than a stream of prints. It says where the kernel is
in the queue, who holds the GPU and how long that holder's quantum has left, and it is blanked
when the GPU is granted.

The cell's own thread is blocked in ``Client.acquire`` while it waits, so a ``Watcher`` thread
keeps the line fresh. It publishes into the waiting cell's output because it runs in a copy of
that cell's context (ipykernel keeps the parent message in a context variable).

What the line says, and when the status document is asked for, is ``wait_view``'s.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable

from IPython.display import DisplayHandle, display

from kiwi_jupyter.kernel.wait_view import (
    PlaceSource,
    StatusSource,
    WaitView,
    no_place,
)


class WaitingLine:
    """One updatable output line. Publish from one thread at a time."""

    def __init__(self) -> None:
        self._handle: DisplayHandle | None = None
        self._text: str | None = None
        self.shown = False

    def show(self, text: str) -> None:
        if text == self._text:
            return  # an update per change, not per tick
        self._text = text
        bundle = {"text/plain": text}
        if self._handle is None:
            self._handle = display(bundle, raw=True, display_id=True)
        else:
            self._handle.update(bundle, raw=True)
        self.shown = True

    def remove(self) -> None:
        # A display cannot be deleted, only updated: an empty bundle renders as nothing.
        if self._handle is not None:
            self._handle.update({"text/plain": ""}, raw=True)
            self._handle = self._text = None


class Watcher:
    """A thread that shows, refreshes and removes the waiting line while a cell is blocked.

    ``watch()`` starts a wait and ``stop()`` ends it. The line appears only after ``delay``, so
    a cell whose GPU is free never flickers. Every display message comes from this thread:
    ``stop()`` returns at once and the granted cell starts running while the line is blanked
    behind it (an update finds its display wherever it is, so the order does not matter to a
    frontend). ``flush()``, at the end of the cell, waits until the blanking is out, so it is
    in the cell's output before the kernel goes idle.

    ``watch(probe)`` follows a whole cell instead, for waits that happen out of Python's sight
    (the CUDA shim blocks a GPU call in C): every ``delay`` it asks ``probe()`` whether the cell
    waits right now, shows the line while it does and blanks it when it stops.
    """

    def __init__(self, status: StatusSource, me: Callable[[], str | None], *,
                 delay: float, refresh: float, place: PlaceSource = no_place) -> None:
        self.view = WaitView(status, place)
        self._me = me
        self.delay = delay
        self.refresh = refresh
        self._changed = threading.Condition()
        self._since: float | None = None     # monotonic start of the watch
        self._due = 0.0                      # when to look next
        self._probe: Callable[[], bool] | None = None
        self._wait_began: float | None = None  # following: when the probe first said waiting
        self._context: contextvars.Context | None = None  # the waiting cell's
        self._line: WaitingLine | None = None  # shown, in the context _line_context
        self._line_context: contextvars.Context | None = None
        self._busy = False                   # publishing right now
        self._closed = False
        self._thread: threading.Thread | None = None

    def watch(self, probe: Callable[[], bool] | None = None, *,
              since: float | None = None) -> None:
        """Start watching; ``since``: when the wait began (monotonic), if before now."""
        with self._changed:
            self._since = time.monotonic() if since is None else since
            self._due = self._since + self.delay
            self._probe, self._wait_began = probe, None
            self.view.forget()
            self._context = contextvars.copy_context()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kiwi-waiting-line",
                                                daemon=True)
                self._thread.start()
            self._changed.notify_all()

    @property
    def watching(self) -> bool:
        return self._since is not None

    def stop(self) -> float:
        """End the watch; return how long it lasted. A line shown is blanked soon after."""
        with self._changed:
            since, self._since = self._since, None
            self._changed.notify_all()
        return 0.0 if since is None else time.monotonic() - since

    def flush(self, timeout: float = 2.0) -> None:
        """Wait until no line is left up (nor being drawn)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while (self._line is not None or self._busy) and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._changed.wait(left)

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._since = None
            self._changed.notify_all()

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._closed and self._since is None and self._line is None:
                    self._changed.wait()
                if self._closed:
                    return
                since, context = self._since, self._context
                if since is not None:
                    while (not self._closed and self._since == since
                           and time.monotonic() < self._due):
                        self._changed.wait(self._due - time.monotonic())
                    if self._closed or self._since != since:
                        continue
                self._busy = True
            try:
                if since is None:
                    self._remove()
                elif context is not None:
                    self._look(since, context)
            finally:
                with self._changed:
                    self._busy = False
                    self._changed.notify_all()

    def _remove(self) -> None:
        line, context = self._line, self._line_context
        if line is not None and context is not None:
            context.run(line.remove)
        with self._changed:
            self._line = None

    def _look(self, since: float, context: contextvars.Context) -> None:
        # Ask outside the lock: stop() must never wait for a round trip to the daemon.
        probe = self._probe
        if probe is not None and not probe():
            self._wait_began = None
            self._due = time.monotonic() + self.delay
            if self._line is not None:
                self._remove()
            return
        if self._wait_began is None:
            self._wait_began = since if probe is None else time.monotonic() - self.delay / 2
        self._due = time.monotonic() + self.refresh
        text = self.view.text(self._me(), time.monotonic() - self._wait_began)
        if self._since != since and self._line is None:
            return  # granted meanwhile: do not draw a line only to blank it
        line = self._line or WaitingLine()
        context.run(line.show, text)
        with self._changed:
            self._line, self._line_context = line, context
