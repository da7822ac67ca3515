"""How a cell gets the GPU: the kernel's own client (eager) or the CUDA shim (lazy).

The extension calls one ``Arbiter`` at three moments of every cell: ``begin_cell`` (the
``pre_run_cell`` hook), ``gate`` (the cell's first statement, before any of its own code) and
``end_cell`` (``post_run_cell``, which runs after success, error and interrupt alike). What each
mode does at those moments:

=========  ===========================  ==================================  ================
mode       begin_cell                   gate                                end_cell
=========  ===========================  ==================================  ================
eager      ask for the GPU, without     wait for the grant (the round trip  release
           waiting for the answer       overlapped IPython compiling)
lazy       tell the shim a cell begins  nothing: the shim acquires at the   tell the shim to
                                        cell's first CUDA call              release now
off        nothing                      nothing                             release a hold
                                                                            made by hand
=========  ===========================  ==================================  ================

Who acquires depends on the shim. Without it (no GPU, or ``KIWI_SHIM=0``) the kernel's own
``Client`` does (``Arbiter``, ``EagerArbiter``), and lazy mode cannot work: the extension falls
back to eager and says so. With the shim preloaded, the shim is the kernel's one scheduling
client and every mode goes through its ctypes API (in ``gpu_shim``: ``ShimOffArbiter``, and the
lazy and eager arbiters built on it; its ``ShimGate`` states what they use of
``kiwi_jupyter.shim.Shim``): two clients for one kernel would queue behind each other.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from kiwi_jupyter.kernel.config import FAIL_CLOSED, KiwiKernelConfig
from kiwi_jupyter.kernel.link import KernelDaemonLink, SchedulerUnreachable
from kiwi_jupyter.kernel.wait_view import Document, Place, no_place
from kiwi_jupyter.kernel.waiting import WaitingLine, Watcher
from nodeside.formats import seconds
from nodeside.protocol import FEATURE_POSITION


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
    handed_back: int = 0           # times it gave the GPU back mid-cell, as asked, and waited


class Arbiter:
    """Mode ``off``, and the base of the others: only holds made by ``%kiwi acquire``."""

    mode = "off"

    def __init__(self, link: KernelDaemonLink, config: KiwiKernelConfig) -> None:
        self.link = link
        self.config = config
        self.report = CellReport()
        self._acquired = False  # the kernel's client acquired and has not released yet
        self.watcher = Watcher(self._status_for_line, self.my_client_id,
                               delay=config.waiting_line_delay,
                               refresh=config.waiting_line_refresh, place=self.place)

    # ---- the three moments of a cell -----------------------------------------------------

    def begin_cell(self, gated: bool = False) -> None:
        """A user cell starts; ``gated``: its first statement will be ``gate()``."""
        self.report = CellReport()
        self.watcher.delay = self.config.waiting_line_delay  # %config applies from this cell
        self.watcher.refresh = self.config.waiting_line_refresh

    def gate(self) -> None:
        pass

    def end_cell(self) -> CellReport:
        self.release()
        self.watcher.flush()
        return self.report

    # ---- by hand (%kiwi acquire / release), and eager's gate ------------------------------

    def acquire(self) -> None:
        """Block until the kernel's client holds the GPU, showing the waiting line.

        Applies the failure policy when the scheduler cannot be reached. An interrupt while
        waiting withdraws the request (the client does that before the interrupt reaches us),
        so the GPU is never granted to a kernel that stopped waiting.
        """
        __tracebackhide__ = True  # noqa: F841 (IPython: not the user's frame)
        started = time.monotonic()
        while True:
            # The policy is applied outside the except blocks, so that a cell failed under
            # fail_closed shows one error, not a chain of the client's.
            unreachable: SchedulerUnreachable | None = None
            try:
                self.link.check()
            except SchedulerUnreachable as exc:
                unreachable = exc
            if unreachable is None:
                client = self.link.client
                asked = time.monotonic()
                try:
                    client.request()  # a no-op if begin_cell asked already, or we hold
                    # Most grants come within the waiting line's delay: wait that long without
                    # waking the watcher, and show the line only if the wait goes on.
                    if not client.wait_for_grant(self.watcher.delay):
                        self.watcher.watch(since=asked)
                        client.wait_for_grant()
                except KeyboardInterrupt:
                    raise KeyboardInterrupt("interrupted while waiting for the GPU; "
                                            "the request was withdrawn") from None
                except ConnectionError as exc:
                    # The daemon went away while we waited and did not come back in time.
                    unreachable = SchedulerUnreachable(self.link.socket_path, str(exc))
                finally:
                    if self.watcher.watching:
                        self.watcher.stop()
                    self.report.waited += time.monotonic() - asked
                if unreachable is None:
                    self.report.held = self._acquired = True
                    return
            if not self._wait_for_scheduler(unreachable, started):
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

    def drop_asked(self) -> bool:
        """The scheduler wants the GPU back from this cell (its quantum ended with another
        notebook waiting, a preemption...)."""
        client = self.link.current
        return client is not None and client.holding and client.drop_requested.is_set()

    def drop_evicts(self) -> bool:
        """That request says the next holder needs the room: move the memory out first."""
        client = self.link.current
        drop = client.last_drop if client is not None else None
        return drop is not None and drop.get("evict") is True

    def hand_back(self, move_out: Callable[[], None] | None = None) -> None:
        """Give the GPU back in the middle of the cell, as the scheduler asked, and wait for it
        again (the waiting line shows meanwhile), as the CUDA shim does at a GPU call. With
        ``move_out``, the memory leaves first (``release`` ``evicting``: the next holder
        starts once the room is there), and this kernel queues again at once."""
        __tracebackhide__ = True  # noqa: F841 (IPython: not the user's frame)
        client = self.link.current
        if client is None or not client.holding:
            return
        self.report.handed_back += 1
        self._acquired = False
        if move_out is None:
            client.requeue()
        else:
            client.release_evicting()
            client.request()
            move_out()
        self.acquire()

    def close(self) -> None:
        self.watcher.close()

    # ---- internals ----------------------------------------------------------------------

    def _wait_for_scheduler(self, unreachable: SchedulerUnreachable, started: float) -> bool:
        """Apply the failure policy. True: try to acquire again; False: run unarbitrated."""
        __tracebackhide__ = True  # noqa: F841 (IPython: not the user's frame)
        if self.config.failure_policy != FAIL_CLOSED:
            client = self.link.current
            if client is not None:
                client.release()  # withdraw what begin_cell asked: this cell runs without it
            self.report.unarbitrated = unreachable.reason
            print(f"kiwi: {unreachable}; this cell runs without GPU arbitration (fail_open)",
                  file=sys.stderr)
            return False
        line = WaitingLine()
        deadline = started + self.config.unreachable_timeout
        try:
            while not self.link.client.connected:
                left = max(deadline - time.monotonic(), 0.0)
                # Shown before the deadline is checked: noticing that the daemon is gone may
                # have spent the whole timeout (a loaded machine, a short timeout), and the
                # cell must still say what it waited for before it fails.
                line.show(f"kiwi: waiting for the scheduler at {unreachable.socket_path} "
                          f"({unreachable.reason}); the cell fails in {seconds(round(left))}")
                if left <= 0:
                    raise SchedulerUnavailable(
                        f"{unreachable}; gave up after {seconds(self.config.unreachable_timeout)} "
                        "(fail_closed), so the cell did not run")
                time.sleep(min(self.config.reconnect_interval, left))
            return True
        finally:
            line.remove()

    @property
    def holding(self) -> bool:
        client = self.link.current
        return client is not None and client.holding

    def my_client_id(self) -> str | None:
        """The scheduler's id for whoever holds and waits on this kernel's behalf."""
        return self.link.client_id

    def place(self) -> Place:
        """The kernel's queue position as its client last heard it; never asks the daemon."""
        client = self.link.current
        if client is None:
            return no_place()
        return Place(client.position, live=FEATURE_POSITION in client.features)

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
    """The kernel's client takes the GPU before each gated cell runs and gives it back after."""

    mode = "eager"

    def begin_cell(self, gated: bool = False) -> None:
        super().begin_cell(gated)
        client = self.link.current
        if gated and client is not None and client.connected:
            # Ask now, wait in gate(): the round trip to the daemon overlaps IPython's own
            # work on the cell (history, parsing, compiling), which comes between the two.
            # Nothing here blocks, so an interrupt cannot land in this hook (IPython would
            # print it and run the cell anyway); one before gate() ends the cell, and
            # end_cell withdraws the request.
            client.request()

    def gate(self) -> None:
        __tracebackhide__ = True  # noqa: F841 (IPython: not the user's frame)
        self.acquire()
