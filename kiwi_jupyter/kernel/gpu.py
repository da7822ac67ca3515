"""How a cell gets the GPU: the kernel's own client (eager) or the CUDA shim (lazy).

The extension calls one ``Arbiter`` at three moments of every cell: ``begin_cell`` (the
``pre_run_cell`` hook), ``gate`` (the cell's first statement, before any of its own code) and
``end_cell`` (``post_run_cell``, which runs after success, error and interrupt alike). What each
mode does at those moments:

=========  ===========================  ==================================  ================
mode       begin_cell                   gate                                end_cell
=========  ===========================  ==================================  ================
eager      note the cell                acquire                             release
lazy       tell the shim a cell begins  nothing: the shim acquires at the   tell the shim to
                                        cell's first CUDA call              release now
off        nothing                      nothing                             release a hold
                                                                            made by hand
=========  ===========================  ==================================  ================

Who acquires depends on the shim. Without it (no GPU, or ``KIWI_SHIM=0``) the kernel's own
``Client`` does (``Arbiter``, ``EagerArbiter``), and lazy mode cannot work: the extension falls
back to eager and says so. With the shim preloaded, the shim is the kernel's one scheduling
client and every mode goes through its ctypes API (``ShimArbiter`` and its two siblings;
``ShimGate`` states what they use of ``kiwi_jupyter.shim.Shim``): two clients for one kernel
would queue behind each other.
"""

from __future__ import annotations

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
    """What the kernel uses of ``kiwi_jupyter.shim.Shim``, the ctypes face of the CUDA shim."""

    def active(self) -> bool:
        """The shim gates this process's GPU work (it is preloaded and KIWI_SHIM is not 0)."""

    def cell_begin(self) -> None:
        """A cell starts: its end, not an idle timer, gives the GPU back."""

    def release(self) -> None:
        """The cell is over: synchronize, evict if the next holder needs the room, release."""

    def acquire(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` for the GPU; False on timeout, the request still queued."""

    @property
    def holding(self) -> bool:
        """This process holds its GPU."""

    def set_policy(self, *, fail_closed: bool, timeout: float) -> None:
        """What GPU calls do while the daemon is unreachable."""

    def stats(self) -> Mapping[str, Any]:
        """Counters since the process started: ``seconds_waiting``, ``grants``, ``drops``..."""


def load_shim() -> tuple[ShimGate | None, str]:
    """The shim preloaded in this kernel, or None and the reason lazy mode cannot be used."""
    try:
        from kiwi_jupyter.shim import Shim
    except ImportError:
        return None, "the shim's Python glue (kiwi_jupyter.shim) is not installed"
    shim = Shim.attach()
    if shim is None:
        return None, ("the CUDA shim is not preloaded in this kernel (it is, in the Kiwi kernel "
                      "on a node with a CUDA driver)")
    if not shim.active():
        return None, "the CUDA shim is loaded but switched off (KIWI_SHIM=0)"
    return shim, ""


class Arbiter:
    """Mode ``off``, and the base of the others: only holds made by ``%kiwi acquire``."""

    mode = "off"

    def __init__(self, link: DaemonLink, config: KiwiKernelConfig) -> None:
        self.link = link
        self.config = config
        self.report = CellReport()
        self._acquired = False  # the kernel's client acquired and has not released yet
        self.watcher = Watcher(self._status_for_line, self.my_client_id,
                               delay=config.waiting_line_delay,
                               refresh=config.waiting_line_refresh)

    # ---- the three moments of a cell -----------------------------------------------------

    def begin_cell(self) -> None:
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
                    unreachable = SchedulerUnreachable(self.link.socket_path, str(exc))
                finally:
                    self.report.waited += self.watcher.stop()
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

    def close(self) -> None:
        self.watcher.close()

    # ---- internals ----------------------------------------------------------------------

    def _wait_for_scheduler(self, unreachable: SchedulerUnreachable, started: float) -> bool:
        """Apply the failure policy. True: try to acquire again; False: run unarbitrated."""
        __tracebackhide__ = True  # noqa: F841 (IPython: not the user's frame)
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

    @property
    def holding(self) -> bool:
        client = self.link.current
        return client is not None and client.holding

    def my_client_id(self) -> str | None:
        """The scheduler's id for whoever holds and waits on this kernel's behalf."""
        return self.link.client_id

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
        __tracebackhide__ = True  # noqa: F841 (IPython: not the user's frame)
        self.acquire()


class ShimArbiter(Arbiter):
    """Lazy mode: the shim takes the GPU at the cell's first CUDA call; the kernel frames cells.

    With the shim loaded, the shim is this kernel's scheduling client (registered under the
    kernel's id) and the kernel's own client only reads status and sends admin requests, so
    every arbiter here goes through the shim. A drop asked mid-cell is the shim's to honour (it
    gates the GPU work there and then), so a shim cell's closing lines are only about waiting.
    """

    mode = "lazy"
    #: Waiting happens in C; waiting in slices this long lets an interrupt reach Python.
    SLICE = 0.2

    def __init__(self, link: DaemonLink, config: KiwiKernelConfig, shim: ShimGate) -> None:
        super().__init__(link, config)
        self.shim = shim
        self._before: Mapping[str, Any] = {}
        shim.set_policy(fail_closed=config.failure_policy == FAIL_CLOSED,
                        timeout=config.unreachable_timeout)

    def begin_cell(self) -> None:
        super().begin_cell()
        self.shim.cell_begin()
        self._before = self.shim.stats()
        # The shim waits inside a CUDA call, in C: follow the cell to show the waiting line.
        self.watcher.watch(probe=self._shim_waits)

    def end_cell(self) -> CellReport:
        self.watcher.stop()
        self.release()
        self.watcher.flush()
        after = self.shim.stats()
        self.report.waited += _grew(self._before, after, "seconds_waiting")
        self.report.held = self.report.held or _grew(self._before, after, "grants") > 0
        return self.report

    def acquire(self) -> None:
        """Take the GPU now through the shim (eager mode, ``%kiwi acquire``).

        A timed-out slice keeps the shim's request queued, so slicing costs no queue position.
        """
        __tracebackhide__ = True  # noqa: F841 (IPython: not the user's frame)
        following = self.watcher.watching  # the cell's own watch shows this wait too
        if not following:
            self.watcher.watch(probe=self._shim_waits)
        try:
            while True:
                if self.shim.acquire(self.SLICE):
                    break
        except KeyboardInterrupt:
            self.shim.release()  # withdraws the queued request
            raise KeyboardInterrupt("interrupted while waiting for the GPU; "
                                    "the request was withdrawn") from None
        except ConnectionError as exc:  # the shim's fail_closed timeout ran out
            raise SchedulerUnavailable(str(exc)) from None
        finally:
            if not following:
                self.watcher.stop()
        self._acquired = True

    def release(self) -> None:
        self._acquired = False
        self.shim.release()

    @property
    def holding(self) -> bool:
        return bool(self.shim.holding)

    def _shim_waits(self) -> bool:
        return self.shim.stats().get("state") == "waiting"

    def my_client_id(self) -> str | None:
        client = self.shim.stats().get("client")
        return client if isinstance(client, str) else None


class ShimEagerArbiter(ShimArbiter):
    """Eager mode with the shim loaded: the shim takes the GPU before the cell's code runs."""

    mode = "eager"

    def gate(self) -> None:
        self.acquire()


class ShimOffArbiter(ShimArbiter):
    """Mode off with the shim loaded: cells are not framed; only a hold taken by hand ends."""

    mode = "off"

    def begin_cell(self) -> None:
        Arbiter.begin_cell(self)  # not the shim's: this mode does not frame cells

    def end_cell(self) -> CellReport:
        if self._acquired:
            self.release()
        self.watcher.flush()
        return self.report


def _grew(before: Mapping[str, Any], after: Mapping[str, Any], counter: str) -> float:
    """How much a shim counter grew during the cell."""
    now, then = float(after.get(counter, 0.0)), float(before.get(counter, 0.0))
    return now - then if now >= then else now  # the shim restarted its count at cell_begin
