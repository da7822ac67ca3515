"""The IPython extension: ``%load_ext kiwi_jupyter``.

Every cell the user runs gets the GPU before its code and gives it back after, whatever way the
cell ends. Three IPython mechanisms make that happen:

- ``pre_run_cell`` marks a user cell (IPython does not fire it for silent executions, the ones
  frontends and comms make, so those never touch the GPU);
- an AST transformer makes a call to ``gate()`` the cell's first statement. Waiting happens
  there, inside the cell, and not in ``pre_run_cell``, because IPython catches whatever a hook
  raises (KeyboardInterrupt included), prints it and runs the cell anyway: an interrupt while
  waiting would run the cell without the GPU. Raised from the cell's first statement, the
  interrupt ends the cell like any other, and ``fail_closed`` can fail a cell the same way;
- ``post_run_cell``, which IPython fires after success, error and interrupt alike, gives the GPU
  back and writes the cell's closing lines (how long it waited, a drop it honoured late).

A cell made only of housekeeping magics (``%kiwi``, ``%config``, ``%pip``...) is not gated: asking
for the status, or fixing the failure policy, must not wait for the GPU. Nor, by default
(``gate_cells = 'gpu'``), is a cell that cannot touch the GPU (``gpu_cells``): defining
functions must not queue behind another notebook's training step.
"""

from __future__ import annotations

import sys
from typing import Any

from kiwi_jupyter.kernel.cells import (
    GateInserter,
    drop_sentence,
    handed_back_sentence,
    needs_no_gpu,
)
from kiwi_jupyter.kernel.config import FAIL_CLOSED, KiwiKernelConfig
from kiwi_jupyter.kernel.free_blocks import FreeBlocks
from kiwi_jupyter.kernel.gpu import Arbiter, CellReport, EagerArbiter
from kiwi_jupyter.kernel.gpu_cells import GPU_LIBRARIES, may_use_gpu
from kiwi_jupyter.kernel.gpu_shim import (
    ShimEagerArbiter,
    ShimLazyArbiter,
    ShimOffArbiter,
    load_shim,
)
from kiwi_jupyter.kernel.identity import client_name, display_name
from kiwi_jupyter.kernel.link import KernelDaemonLink
from kiwi_jupyter.kernel.magics import KiwiMagics
from nodeside.client.memory import PagesItself
from nodeside.formats import seconds

_loaded: KernelExtension | None = None


def gate() -> None:
    """The first thing every gated cell runs: take the GPU before the cell's own code.

    Returns None: the cell's first statement ``S`` is compiled as ``if not gate(): S``."""
    __tracebackhide__ = True  # noqa: F841 (IPython hides this frame from tracebacks)
    if _loaded is not None:
        _loaded.gate()


class KernelExtension:
    """The extension's state in one kernel: settings, link to the daemon, the current mode."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.config = KiwiKernelConfig(parent=shell)
        self.shim, self.shim_missing = load_shim()
        # One per kernel, whatever the mode: once it fails it stays off for the kernel's life.
        self.free_blocks = FreeBlocks(self.shim) if self.shim is not None else None
        # With the shim loaded the shim is the kernel's scheduling client, and the kernel's own
        # connection only reads status and sends admin requests.
        self.link = KernelDaemonLink(client_name(), reconnect_timeout=self._reconnect_timeout(),
                               register=self.shim is None, display_name=display_name())
        self.link.add_listener(self._on_event)
        self.config.observe(self._policy_changed, names=["failure_policy", "unreachable_timeout",
                                                         "restart_grace"])
        self.arbiter: Arbiter = self._arbiter_for(self.config.mode or
                                                  ("lazy" if self.shim else "eager"))
        self.config.observe(lambda change: self.set_mode(change["new"]), names=["mode"])
        self._in_cell = False
        self._armed = False      # this cell still needs its gate() call
        self._inserted = False   # gate() is already in this cell's code
        self._inserter = GateInserter(self)

    # ---- wiring -----------------------------------------------------------------------

    def install(self) -> None:
        events = self.shell.events
        events.register("pre_run_cell", self.pre_run_cell)
        events.register("post_run_cell", self.post_run_cell)
        self.shell.ast_transformers.append(self._inserter)
        self.shell.configurables.append(self.config)  # so that %config KiwiKernelConfig works
        self.shell.register_magics(KiwiMagics(self.shell, extension=self))
        self.link.client  # noqa: B018 - register now: the panel shows the kernel before a cell

    def uninstall(self) -> None:
        events = self.shell.events
        for event, hook in (("pre_run_cell", self.pre_run_cell),
                            ("post_run_cell", self.post_run_cell)):
            if hook in events.callbacks[event]:
                events.unregister(event, hook)
        if self._inserter in self.shell.ast_transformers:
            self.shell.ast_transformers.remove(self._inserter)
        if self.config in self.shell.configurables:
            self.shell.configurables.remove(self.config)
        magics = self.shell.magics_manager
        magics.magics["line"].pop("kiwi", None)
        magics.registry.pop("KiwiMagics", None)
        self.arbiter.release()
        self.arbiter.close()
        self.link.close()

    def _reconnect_timeout(self) -> float:
        """How long a waiting request outlives a vanished daemon, by failure policy."""
        if self.config.failure_policy == FAIL_CLOSED:
            return self.config.unreachable_timeout
        return self.config.restart_grace

    def _policy_changed(self, change: Any) -> None:
        self.link.reconnect_timeout = self._reconnect_timeout()

    # ---- modes --------------------------------------------------------------------------

    def _arbiter_for(self, mode: str) -> Arbiter:
        if self.shim is not None:
            kinds = {"eager": ShimEagerArbiter, "lazy": ShimLazyArbiter, "off": ShimOffArbiter}
            return kinds[mode](self.link, self.config, self.shim, self.free_blocks)
        if mode == "lazy":
            print(f"kiwi: lazy mode needs the CUDA shim, but {self.shim_missing}; "
                  "using eager mode (the GPU is taken when a cell starts)", file=sys.stderr)
            mode = "eager"
        if mode == "eager":
            return EagerArbiter(self.link, self.config)
        return Arbiter(self.link, self.config)

    @property
    def mode(self) -> str:
        return self.arbiter.mode

    def set_mode(self, mode: str) -> str:
        """Switch how cells get the GPU; return the mode now in force."""
        if mode == self.arbiter.mode:
            return mode
        old, self.arbiter = self.arbiter, self._arbiter_for(mode)
        self.arbiter.report = old.report
        old.release()
        old.close()
        self.config.mode = self.arbiter.mode
        return self.arbiter.mode

    # ---- the cell's life ----------------------------------------------------------------

    def interactivity(self) -> str:
        return str(self.shell.ast_node_interactivity)

    def wants_gate_inserted(self) -> bool:
        if self._armed and not self._inserted:
            self._inserted = True
            return True
        return False

    def pre_run_cell(self, info: Any) -> None:
        self._in_cell = True
        self._armed = (self.arbiter.mode == "eager" and not needs_no_gpu(info.raw_cell)
                       and self._may_use_gpu(info.raw_cell))
        self._inserted = False
        self.arbiter.begin_cell(self._armed)

    def _may_use_gpu(self, raw_cell: str) -> bool:
        if self.config.gate_cells == "all":
            return True
        libraries = (*GPU_LIBRARIES, *self.config.extra_gpu_libraries)
        return may_use_gpu(self.shell.transform_cell(raw_cell), self.shell.user_ns, libraries)

    def gate(self) -> None:
        __tracebackhide__ = True  # noqa: F841 (IPython: not the user's frame)
        if self._armed:
            self._armed = False
            self.arbiter.gate()

    def post_run_cell(self, result: Any) -> None:
        self._armed = False
        if not self._in_cell:
            return  # an empty cell: IPython fires post_run_cell without pre_run_cell
        self._in_cell = False
        self._close_cell(self.arbiter.end_cell())

    def serve_pages(self, pages: PagesItself) -> bool:
        """Let the kernel's client speak for memory the kernel moves itself (the stand-in GPU,
        ``standin``); False where the CUDA shim is the kernel's client. Whatever this cell
        held goes back: the next GPU call asks again, as the new registration."""
        if self.shim is not None or not self.link.register:
            return False
        self.arbiter.release()
        self.link.serve(pages)
        self.link.client  # noqa: B018 - register now, with the memory's figures
        return True

    def _on_event(self, message: dict[str, Any]) -> None:
        # On the client's thread: only note why the GPU was wanted back, for the closing line.
        if message.get("op") in ("drop", "revoked") and self._in_cell:
            self.arbiter.report.drop_reason = str(message.get("reason", ""))

    def _close_cell(self, report: CellReport) -> None:
        if report.handed_back:
            sentence = handed_back_sentence(report.handed_back, report.drop_reason,
                                            report.waited)
            print(f"kiwi: {sentence}")
        elif report.waited > self.config.waited_note_after:
            print(f"kiwi: waited {seconds(report.waited)} for the GPU")
        if report.drop_requested:
            print(f"kiwi: {drop_sentence(report.drop_reason)}")


def load_ipython_extension(shell: Any) -> None:
    global _loaded
    if _loaded is not None:
        return
    extension = KernelExtension(shell)
    extension.install()
    _loaded = extension


def unload_ipython_extension(shell: Any) -> None:
    global _loaded
    if _loaded is None:
        return
    extension, _loaded = _loaded, None
    extension.uninstall()
