"""Runtime changes (``kiwictl -S`` / ``-T``) kept on disk so that they survive a restart.

The daemon reads the file once at start and at each reload (``apply``, then
``restore_gpu_tq``), and writes it after each change (``save_from``).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nodeside.config import ConfigError, SchedulerConfig, parse_mode
from nodeside.files import FileRefused, read_trusted_text
from nodeside.limits import LimitError, shown_name, tq_seconds

if TYPE_CHECKING:
    from nodeside.scheduler.core import Action, Scheduler

log = logging.getLogger("kiwi.state")

#: The file holds a mode and a TQ per GPU: a few hundred bytes.
MAX_STATE_BYTES = 64 * 1024


class StateFile:
    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = Path(path) if path else None
        #: What ``apply`` read last: ``restore_gpu_tq`` uses it, so the file is read (and its
        #: faults named) once.
        self._restored: dict[str, Any] = {}

    def apply(self, config: SchedulerConfig) -> SchedulerConfig:
        """``config`` with the saved mode and TQ in place of its own."""
        saved = self._restored = self.restore()
        changes = {k: v for k, v in saved.items() if k in ("mode", "tq")}
        if changes:
            log.info("Restored runtime settings from %s: %s", self.path,
                     ", ".join(f"{k} {v}" for k, v in changes.items()))
        return config.with_runtime(**changes)

    def restore_gpu_tq(self, scheduler: Scheduler, now: float) -> list[Action]:
        """Put back the per-GPU TQs that ``apply`` read, on the GPUs the scheduler has, as the
        admin's ``set_tq`` would (the actions that follow, for the shell to carry out)."""
        actions: list[Action] = []
        for index, seconds in self._restored.get("gpu_tq", {}).items():
            if index in scheduler.gpus:
                actions.extend(scheduler.set_tq(now, seconds, index))
        return actions

    def save_from(self, scheduler: Scheduler) -> None:
        """Save the scheduler's runtime settings; a failure is logged, never raised."""
        overrides = {str(i): g.tq_override for i, g in scheduler.gpus.items()
                     if g.tq_override is not None}
        try:
            self.save({"mode": scheduler.mode, "tq": scheduler.tq, "gpu_tq": overrides})
        except (OSError, ValueError) as exc:  # ValueError: a value JSON cannot hold
            log.error("Could not save runtime settings to %s: %s", self.path, exc)

    def load(self) -> dict[str, Any]:
        """What the file holds, when the daemon may trust it (``nodeside.files``); one line
        naming the file and why it is ignored otherwise, never what it holds."""
        if self.path is None:
            return {}
        try:
            data = json.loads(read_trusted_text(self.path, MAX_STATE_BYTES))
        except FileNotFoundError:
            return {}
        except FileRefused as exc:
            log.warning("Ignoring state file %s: %s", self.path, exc)
            return {}
        except (ValueError, RecursionError) as exc:  # JSONDecodeError; nesting past the stack
            why = f"line {exc.lineno}, column {exc.colno}: {exc.msg}" \
                if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
            log.warning("Ignoring state file %s: not a JSON object (%s)", self.path, why)
            return {}
        if not isinstance(data, dict):
            log.warning("Ignoring state file %s: not a JSON object", self.path)
            return {}
        return data

    def restore(self) -> dict[str, Any]:
        """The saved mode, tq and per-GPU tq that are valid; each bad field is named and skipped.

        A file edited by hand, or written by another version, must never put a value in the
        scheduler that breaks it (a NaN TQ would break every reply that carries the TQ).
        """
        saved = self.load()
        out: dict[str, Any] = {}
        if "mode" in saved:
            try:  # read as the config reads it: a hand-edited "Off" means off
                out["mode"] = parse_mode(saved["mode"])
            except ConfigError as exc:
                self._ignored("mode", str(exc))
        if "tq" in saved:
            try:
                out["tq"] = tq_seconds(saved["tq"], "tq")
            except LimitError as exc:
                self._ignored("tq", str(exc))
        gpu_tq = saved.get("gpu_tq") or {}
        if not isinstance(gpu_tq, dict):
            self._ignored("gpu_tq", "expected an object of GPU index to seconds")
            gpu_tq = {}
        out["gpu_tq"] = {}
        for index, seconds in gpu_tq.items():
            if not (isinstance(index, str) and index.isdigit() and len(index) < 6):
                self._ignored(f"gpu_tq.{shown_name(index)}", "expected a GPU index")
                continue
            where = f"gpu_tq.{index}"
            try:
                out["gpu_tq"][int(index)] = tq_seconds(seconds, where)
            except LimitError as exc:
                self._ignored(where, str(exc))
        return out

    def _ignored(self, field: str, why: str) -> None:
        log.warning("Ignoring %s in state file %s: %s", field, self.path, why)

    def save(self, state: dict[str, Any]) -> None:
        """Write atomically: a crash mid-write leaves the old file, never half of a new one."""
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".kiwi-state-", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(state, out, indent=2, sort_keys=True, allow_nan=False)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

