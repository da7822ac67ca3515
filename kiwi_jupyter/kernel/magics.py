"""``%kiwi``: look at and steer GPU sharing from a notebook. The docstring below is ``%kiwi?``."""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class

from kiwi_jupyter.kernel.config import MODES
from kiwi_jupyter.kernel.gpu import Arbiter
from kiwi_jupyter.kernel.link import KernelDaemonLink, SchedulerUnreachable
from kiwi_jupyter.kernel.pool_choice import pool_note, unknown_pool
from kiwi_jupyter.kernel.status_view import StatusTable
from nodeside.limits import TQ_MAX, TQ_MIN, LimitError, tq_seconds

if TYPE_CHECKING:
    from nodeside.client import Client

PRIORITIES = ("HIGH", "NORMAL", "LOW")


class SteeredKernel(Protocol):
    """What ``%kiwi`` steers of the IPython extension (``KernelExtension``, which registers
    these magics): stated here so that the magics need not import the extension back."""

    link: KernelDaemonLink
    arbiter: Arbiter

    @property
    def shim(self) -> object | None:
        """The CUDA shim, when it is preloaded in this kernel."""

    @property
    def mode(self) -> str:
        """The arbiter's mode: ``eager``, ``lazy`` or ``off``."""

    def set_mode(self, mode: str) -> str:
        """Switch the kernel to ``mode``; the mode it is in now."""


def say(message: str) -> None:
    print(f"kiwi: {message}")


def complain(message: str) -> None:
    print(f"kiwi: {message}", file=sys.stderr)


@magics_class
class KiwiMagics(Magics):
    def __init__(self, shell: Any, extension: SteeredKernel) -> None:
        super().__init__(shell)
        self.extension = extension
        self.magics["line"]["kiwi"] = self._with_live_help(self.magics["line"]["kiwi"])

    def _with_live_help(self, magic: Callable[[str], Any]) -> Callable[[str], Any]:
        """``%kiwi`` whose help (``%kiwi?``) ends with the socket this kernel really uses: the
        embedded scheduler's private one under `jupyter lab`, not the node's default.

        IPython's inspector asks an object's ``getdoc()`` before its docstring, so the help is
        written when it is asked for (the link may have found another socket since the start).
        """

        def kiwi(line: str) -> Any:
            return magic(line)

        kiwi.__doc__ = magic.__doc__
        kiwi.getdoc = self.help_text  # type: ignore[attr-defined]
        return kiwi

    def help_text(self) -> str:
        """``%kiwi?`` and ``%kiwi help``: the magic's docstring and the socket in use."""
        socket = self.extension.link.socket_path
        where = "$KIWI_SOCKET" if os.environ.get("KIWI_SOCKET") == socket else "found"
        usage = inspect.cleandoc(KiwiMagics.kiwi.__doc__ or "")
        return f"{usage}\n\nThis kernel uses {socket} ({where})."

    @line_magic
    def kiwi(self, line: str) -> Any:
        """Share this node's GPU with other notebooks through the Kiwi scheduler.

        Usage::

          %kiwi [status]           the scheduler's state: mode, TQ, who holds the GPU, the queue
                                   (this kernel marked), pools. `%kiwi status --json` returns
                                   the status document as a dict.
          %kiwi acquire            take the GPU now, waiting for it if needed; it is given back
                                   at the end of the cell (useful in mode off)
          %kiwi release            give the GPU back now, before the cell ends
          %kiwi mode [eager|lazy|off]
                                   how this kernel's cells get the GPU (no argument: show it):
                                   eager takes it before each cell that may touch the GPU
                                   runs (it imports or uses a GPU library; docs/kernel.md);
                                   lazy lets the CUDA shim take it at the cell's first GPU call
                                   (needs the shim; eager is used without it); off does not
                                   arbitrate cells
          %kiwi pool NAME          move this kernel to pool NAME (default: $KIWI_POOL); where
                                   the scheduler configures pools, one of them or default
          %kiwi priority HIGH|NORMAL|LOW
                                   this kernel's priority in its pool; LOW can be preempted
          %kiwi on | off | auto    (admin) turn the node's scheduler on (one holder at a time,
                                   by time quanta), off (everyone at once) or auto (side by
                                   side while working sets fit in GPU memory)
          %kiwi tq SECONDS         (admin) set the scheduler's time quantum
          %kiwi help               this text (also %kiwi?)

        Every cell gives the GPU back when it ends (success, error or interrupt); interrupting a
        cell that waits for the GPU withdraws its request. A cell made only of %kiwi lines never
        waits for the GPU. Admin commands need the node's permission; a refusal is one line.
        The kernel reaches the scheduler at $KIWI_SOCKET, else /var/run/kiwi/scheduler.sock,
        else the socket a Jupyter server published for its own scheduler.
        """
        words = line.split()
        command, args = (words[0].lower(), words[1:]) if words else ("status", [])
        handler = self._commands().get(command)
        if handler is None:
            raise UsageError(f"%kiwi {command}: unknown subcommand; see %kiwi?")
        return handler(args)

    def _commands(self) -> dict[str, Callable[[list[str]], Any]]:
        return {
            "status": self._status,
            "acquire": self._no_args(self._acquire),
            "release": self._no_args(self._release),
            "mode": self._mode,
            "pool": self._pool,
            "priority": self._priority,
            "on": self._no_args(lambda: self._set_scheduler_mode("on")),
            "off": self._no_args(lambda: self._set_scheduler_mode("off")),
            "auto": self._no_args(lambda: self._set_scheduler_mode("auto")),
            "tq": self._tq,
            "help": self._no_args(lambda: print(self.help_text())),
        }

    @staticmethod
    def _no_args(action: Callable[[], Any]) -> Callable[[list[str]], Any]:
        def run(args: list[str]) -> Any:
            if args:
                raise UsageError(f"unexpected arguments: {' '.join(args)}")
            return action()

        return run

    def _ask(self, action: Callable[[Client], Any], what: str) -> tuple[bool, Any]:
        """Run an action on the scheduler, turning every refusal into one line."""
        try:
            return True, self.extension.link.call(action)
        except SchedulerUnreachable as exc:
            complain(f"{exc}")
        except PermissionError as exc:
            complain(f"not allowed to {what}: {exc}")
        except (ValueError, RuntimeError) as exc:
            complain(f"could not {what}: {exc}")
        return False, None

    # ---- subcommands --------------------------------------------------------------------

    def _status(self, args: list[str]) -> Any:
        if args not in ([], ["--json"]):
            raise UsageError("usage: %kiwi status [--json]")
        ok, document = self._ask(lambda c: c.status(), "read the scheduler's status")
        if not ok:
            return None
        if args == ["--json"]:
            return document
        return StatusTable(document, me=self.extension.arbiter.my_client_id())

    def _acquire(self) -> None:
        self.extension.arbiter.acquire()
        if self.extension.arbiter.holding:
            say("this kernel holds the GPU until the end of the cell")

    def _release(self) -> None:
        if not self.extension.arbiter.holding:
            say("this kernel does not hold the GPU")
            return
        self.extension.arbiter.release()
        say("gave the GPU back")

    def _mode(self, args: list[str]) -> None:
        if not args:
            say(f"this kernel's mode is {self.extension.mode}")
            return
        if len(args) != 1 or args[0].lower() not in MODES:
            raise UsageError(f"usage: %kiwi mode [{'|'.join(MODES)}]")
        now = self.extension.set_mode(args[0].lower())
        say(f"this kernel's mode is {now}")

    def _regroup_refused(self) -> bool:
        if self.extension.shim is None:
            return False
        complain("with the CUDA shim loaded, the shim holds the GPU for this kernel and takes "
                 "its pool and priority from KIWI_POOL and KIWI_PRIORITY when the kernel starts")
        return True

    def _regroup(self, what: str, *, pool: str | None = None,
                 priority: str | None = None) -> bool:
        """Register again in another pool or at another priority (the daemon takes those at
        registration only). A refusal (the access policy, docs/policy.md) puts the old ones back
        and says so in one line."""
        link = self.extension.link
        asked = {"pool": link.pool, "priority": link.priority}
        was = (link.client.pool, link.client.priority)
        self.extension.arbiter.release()
        link.regroup(pool=pool, priority=priority)
        try:
            link.check()
        except SchedulerUnreachable as exc:
            link.rejoin(**asked)
            complain(f"could not {what}: {exc.reason}; this kernel stays in pool {was[0]} at "
                     f"priority {was[1]}")
            return False
        return True

    def _pool(self, args: list[str]) -> None:
        if len(args) != 1:
            raise UsageError("usage: %kiwi pool NAME")
        if self._regroup_refused():
            return
        name = args[0]
        ok, document = self._ask(lambda c: c.status(), f"join pool {name}")
        if not ok:
            return
        refusal = unknown_pool(document, name)
        if refusal:
            complain(f"%kiwi pool {name}: {refusal}")
            return
        if self._regroup(f"join pool {name}", pool=name):
            say(f"this kernel is now in pool {name}{pool_note(document, name)}")

    def _priority(self, args: list[str]) -> None:
        if len(args) != 1 or args[0].upper() not in PRIORITIES:
            raise UsageError(f"usage: %kiwi priority {'|'.join(PRIORITIES)}")
        priority = args[0].upper()
        if self._regroup_refused():
            return
        if self._regroup(f"take priority {priority}", priority=priority):
            say(f"this kernel's priority is now {priority}")

    def _set_scheduler_mode(self, mode: str) -> None:
        ok, _ = self._ask(lambda c: c.set_mode(mode), f"turn the scheduler {mode}")
        if ok:
            say(f"turned the scheduler {mode}")

    def _tq(self, args: list[str]) -> None:
        if len(args) != 1:
            raise UsageError(f"usage: %kiwi tq SECONDS (from {TQ_MIN:g} to {TQ_MAX:g})")
        try:
            seconds = tq_seconds(args[0])  # the daemon's one TQ range
        except LimitError as exc:
            raise UsageError(f"usage: %kiwi tq SECONDS: {exc}") from None
        ok, _ = self._ask(lambda c: c.set_tq(seconds), "set the scheduler's TQ")
        if ok:
            say(f"the scheduler's TQ is now {seconds:g} seconds")
