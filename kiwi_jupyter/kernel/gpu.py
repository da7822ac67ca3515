"""How a cell gets the GPU: the kernel's own client (eager) or the CUDA shim (lazy).

The extension calls one ``Arbiter`` at three moments of every cell: ``begin_cell`` (the
``pre_run_cell`` hook), ``gate`` (the cell's first statement, before any of its own code) and
``end_cell`` (``post_run_cell``, which runs after success, error and interrupt alike). What each
mode does at those moments:

=========  ===========================  ==================================  ================
mode       begin_cell                   gate                                end_cell
=========  ===========================  ==================================  ================
eager      note the cell                acquire with the kernel's client    release
lazy       tell the shim a cell begins  nothing: the shim acquires at the   tell the shim to
                                        cell's first CUDA call              release now
off        nothing                      nothing                             release a hold
                                                                            made by hand
=========  ===========================  ==================================  ================

The shim side is the small ctypes API of ``kiwi_jupyter.shim`` (``ShimGate`` below states what
this module expects of it). Without a loaded shim (no GPU, or ``KIWI_SHIM=0``) lazy mode cannot
work, and the extension falls back to eager and says so.
"""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kiwi_jupyter.kernel.config import FAIL_CLOSED, KiwiKernelConfig
from kiwi_jupyter.kernel.link import DaemonLink, SchedulerUnreachable
from kiwi_jupyter.kernel.waiting import Document, WaitingLine, Watcher


class SchedulerUnavailable(ConnectionError):  # noqa: N818 (a condition, named for users)
    """Under ``fail_closed``: the scheduler stayed unreachable, so the cell did not run."""


@dataclass
class CellReport:
    """What happened to one cell's GPU access; the extension turns it into output lines."""

    waited: float = 0.0            # seconds the cell waited for its grant
    held: bool = False             # the cell held the GPU at some point
    drop_requested: bool = False   # the scheduler wanted the GPU back before the cell ended
    drop_reason: str | None = None # why: "quantum", "preempt", ... "grace" when revoked;
                                   # None when the connection to the daemon was lost instead
    unarbitrated: str | None = None  # why the cell ran without arbitration (fail_open)


class ShimGate(Protocol):
    """What ``kiwi_jupyter.shim`` offers the kernel (module-level functions)."""

    def active(self) -> bool:
        """The shim is preloaded in this process and talks to the scheduler."""

    def cell_begins(self) -> None:
        """A cell starts: the next CUDA call acquires the GPU (statistics restart)."""

    def release_now(self) -> None:
        """The cell is over: give the GPU back now, not at the end of the quantum."""

    def stats(self) -> Mapping[str, Any]:
        """Since ``cell_begins``: ``waited`` (s), ``held`` (bool), ``drop_requested`` (bool)."""


def load_shim() -> tuple[ShimGate | None, str]:
    """The loaded shim, or None and the reason lazy mode cannot be used."""
    try:
        shim: Any = importlib.import_module("kiwi_jupyter.shim")
    except ImportError as exc:
        return None, f"the shim's Python glue is missing ({exc})"
    missing = [f for f in ("active", "cell_begins", "release_now", "stats")
               if not callable(getattr(shim, f, None))]
    if missing:
        return None, f"kiwi_jupyter.shim lacks {', '.join(missing)}"
    try:
        if not shim.active():
            return None, "the CUDA shim is not loaded in this kernel (no GPU, or KIWI_SHIM=0)"
    except OSError as exc:
        return None, f"the CUDA shim does not answer ({exc})"
    return shim, ""


class Arbiter:
    """Mode ``off``, and the base of the others: only holds made by ``%kiwi acquire``."""

    mode = "off"

    def __init__(self, link: DaemonLink, config: KiwiKernelConfig) -> None:
        self.link = link
        self.config = config
        self.report = CellReport()
        self._acquired = False  # the kernel's client acquired and has not released yet
        self.watcher = Watcher(self._status_for_line, lambda: self.link.client_id,
                               delay=config.waiting_line_delay,
                               refresh=config.waiting_line_refresh)

    # ---- the three moments of a cell -----------------------------------------------------

    def begin_cell(self) -> None:
        self.report = CellReport()

    def gate(self) -> None:
        pass

    def end_cell(self) -> CellReport:
        self.release()
        return self.report

    # ---- by hand (%kiwi acquire / release), and eager's gate ------------------------------

    def acquire(self) -> None:
        """Block until the kernel's client holds the GPU, showing the waiting line.

        Applies the failure policy when the scheduler cannot be reached. An interrupt while
        waiting withdraws the request (the client does that before the interrupt reaches us),
        so the GPU is never granted to a kernel that stopped waiting.
        """
        started = time.monotonic()
        while True:
            try:
                self.link.check()
            except SchedulerUnreachable as unreachable:
                if self._wait_for_scheduler(unreachable, started):
                    continue
                return
            client = self.link.client
            if client.holding:
                return
            self.watcher.watch()
            try:
                client.acquire()
            except KeyboardInterrupt:
                raise KeyboardInterrupt("interrupted while waiting for the GPU; "
                                        "the request was withdrawn") from None
            except ConnectionError as exc:
                # The daemon went away while we waited and did not come back in time.
                lost = SchedulerUnreachable(self.link.socket_path, str(exc))
                if self._wait_for_scheduler(lost, started):
                    continue
                return
            finally:
                self.report.waited += self.watcher.stop()
            self.report.held = self._acquired = True
            return

    def release(self) -> None:
        """Give back the GPU if the kernel's client holds it; note a drop asked mid-cell."""
        client = self.link.current
        acquired, self._acquired = self._acquired, False
        if client is None:
            return
        if acquired and client.drop_requested.is_set():
            self.report.drop_requested = True
        client.release()  # the client ignores a daemon that is gone: so did the hold

    def close(self) -> None:
        self.watcher.close()

    # ---- internals ----------------------------------------------------------------------

    def _wait_for_scheduler(self, unreachable: SchedulerUnreachable, started: float) -> bool:
        """Apply the failure policy. True: try to acquire again; False: run unarbitrated."""
        if self.config.failure_policy != FAIL_CLOSED:
            self.report.unarbitrated = unreachable.reason
            print(f"kiwi: {unreachable}; this cell runs without GPU arbitration (fail_open)",
                  file=sys.stderr)
            return False
        line = WaitingLine()
        deadline = started + self.config.unreachable_timeout
        try:
            while not self.link.client.connected:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SchedulerUnavailable(
                        f"{unreachable}; gave up after {self.config.unreachable_timeout:g} s "
                        "(fail_closed), so the cell did not run")
                line.show(f"kiwi: waiting for the scheduler at {unreachable.socket_path} "
                          f"({unreachable.reason}); the cell fails in {left:.0f} s")
                time.sleep(min(self.config.reconnect_interval, left))
            return True
        finally:
            line.remove()

    def _status_for_line(self) -> Document | None:
        # Runs on the watcher thread while the cell's thread waits in acquire(): it must not
        # reconnect or forget the client under the cell's feet, only ask.
        client = self.link.current
        if client is None:
            return None
        try:
            return client.status()
        except (ConnectionError, TimeoutError):
            return None


class EagerArbiter(Arbiter):
    """The kernel's client takes the GPU before each cell runs and gives it back after."""

    mode = "eager"

    def gate(self) -> None:
        self.acquire()


class LazyArbiter(Arbiter):
    """The shim takes the GPU at the cell's first CUDA call; the kernel only frames cells."""

    mode = "lazy"

    def __init__(self, link: DaemonLink, config: KiwiKernelConfig, shim: ShimGate) -> None:
        super().__init__(link, config)
        self.shim = shim

    def begin_cell(self) -> None:
        super().begin_cell()
        self.shim.cell_begins()

    def end_cell(self) -> CellReport:
        self.shim.release_now()
        stats = self.shim.stats()
        self.report.waited += float(stats.get("waited", 0.0))
        # With the shim a drop is honoured mid-cell (it gates the GPU work), so only the wait
        # is worth a line.
        self.report.held = self.report.held or bool(stats.get("held", False))
        return super().end_cell()

    def acquire(self) -> None:
        print("kiwi: in lazy mode the CUDA shim acquires the GPU at the cell's first GPU call; "
              "use `%kiwi mode eager` to take it by hand", file=sys.stderr)
