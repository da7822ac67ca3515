"""The shim-based backend of ``gpu``: cells framed through the CUDA shim's ctypes API.

Used when the shim is preloaded in the kernel (the Kiwi kernel on a node with a CUDA driver).
The shim is then the kernel's one scheduling client, registered under the kernel's id; these
arbiters tell it when cells begin and end and, in eager mode, ask it for the GPU up front.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from kiwi_jupyter.kernel.config import FAIL_CLOSED, KiwiKernelConfig
from kiwi_jupyter.kernel.free_blocks import FreeBlocks, FreeRangesShim
from kiwi_jupyter.kernel.gpu import Arbiter, CellReport, SchedulerUnavailable
from kiwi_jupyter.kernel.link import KernelDaemonLink
from kiwi_jupyter.kernel.wait_view import Place


class ShimGate(FreeRangesShim, Protocol):
    """What the kernel uses of ``kiwi_jupyter.shim.Shim``, the ctypes face of the CUDA shim
    (with what ``FreeBlocks`` tells it)."""

    def active(self) -> bool:
        """The shim gates this process's GPU work (it is preloaded and KIWI_SHIM is not 0)."""

    def cell_begin(self) -> None:
        """A cell starts: its end, not an idle timer, gives the GPU back."""

    def release(self) -> None:
        """The cell is over: synchronize, evict if the next holder needs the room, release."""

    def catch_interrupts(self) -> None:
        """Let Ctrl-C end a wait for the GPU inside a CUDA call (main thread, per cell)."""

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


class ShimOffArbiter(Arbiter):
    """Mode off with the shim loaded, and the base of the shim's other modes: cells are not
    framed; a hold taken by hand goes through the shim, and only that hold ends with the cell.

    With the shim loaded, the shim is this kernel's scheduling client (registered under the
    kernel's id) and the kernel's own client only reads status and sends admin requests, so
    every arbiter here goes through the shim. A drop asked mid-cell is the shim's to honour (it
    gates the GPU work there and then), so a shim cell's closing lines are only about waiting.
    """

    mode = "off"
    #: Waiting happens in C; waiting in slices this long lets an interrupt reach Python.
    SLICE = 0.2

    def __init__(self, link: KernelDaemonLink, config: KiwiKernelConfig, shim: ShimGate,
                 free_blocks: FreeBlocks | None = None) -> None:
        super().__init__(link, config)
        self.shim = shim
        self.free_blocks = free_blocks
        self._before: Mapping[str, Any] = {}
        shim.set_policy(fail_closed=config.failure_policy == FAIL_CLOSED,
                        timeout=config.unreachable_timeout)

    def end_cell(self) -> CellReport:
        if self._acquired:
            self.release()
        self.watcher.flush()
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
        # Refused for want of room, the hold is idle while the calls wait for the next ask.
        stats = self.shim.stats()
        return stats.get("state") == "waiting" or bool(stats.get("room_refused"))

    def place(self) -> Place:
        # The shim keeps the position of its last "waiting" (0: not waiting). Where its daemon
        # sends position events (it asks for them in hello), the position follows the queue and
        # the line asks for the status document only when it moves; else on every look.
        stats = self.shim.stats()
        position = stats.get("queue_position")
        refused = stats.get("room_refused")
        retry_in = stats.get("room_retry_in")
        return Place(position if isinstance(position, int) and position > 0 else None,
                     live=stats.get("position_live") is True,
                     refused=refused if isinstance(refused, str) and refused else None,
                     retry_in=float(retry_in) if isinstance(retry_in, (int, float)) else 0.0)

    def my_client_id(self) -> str | None:
        client = self.shim.stats().get("client")
        return client if isinstance(client, str) else None


class ShimLazyArbiter(ShimOffArbiter):
    """Lazy mode: the shim takes the GPU at the cell's first CUDA call; the kernel frames cells."""

    mode = "lazy"

    def begin_cell(self, gated: bool = False) -> None:
        super().begin_cell(gated)
        # ipykernel installs its SIGINT handler as each cell starts; the shim's goes in front
        # of it, or Ctrl-C could not end a wait for the GPU inside a CUDA call.
        self.shim.catch_interrupts()
        self.shim.cell_begin()
        self._before = self.shim.stats()
        # The shim waits inside a CUDA call, in C: follow the cell to show the waiting line.
        self.watcher.watch(probe=self._shim_waits)

    def end_cell(self) -> CellReport:
        self.watcher.stop()
        if self.free_blocks is not None:
            self.free_blocks.tell()  # before the release, which may evict
        self.release()
        self.watcher.flush()
        after = self.shim.stats()
        self.report.waited += _grew(self._before, after, "seconds_waiting")
        self.report.held = self.report.held or _grew(self._before, after, "grants") > 0
        return self.report


class ShimEagerArbiter(ShimLazyArbiter):
    """Eager mode with the shim loaded: the shim takes the GPU before the cell's code runs."""

    mode = "eager"

    def gate(self) -> None:
        self.acquire()


def _grew(before: Mapping[str, Any], after: Mapping[str, Any], counter: str) -> float:
    """How much a shim counter grew during the cell."""
    now, then = float(after.get(counter, 0.0)), float(before.get(counter, 0.0))
    return now - then if now >= then else now  # the shim restarted its count at cell_begin
