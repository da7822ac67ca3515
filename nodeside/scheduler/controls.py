"""The admin's controls while clients run: the mode, the TQ, and a reloaded config.

Each applies at once to every GPU (or the one named) and returns what follows (turns.py): drops
when the mode turns on or auto, withdrawn drops when it turns off, quanta ended under a shorter
TQ, a new policy's choices after a reload.
"""

from __future__ import annotations

from typing import final

from nodeside import protocol as p
from nodeside.config import SchedulerConfig
from nodeside.scheduler.actions import Action, SchedulerError
from nodeside.scheduler.node import NodeState
from nodeside.scheduler.turns import Turns


@final
class Controls:
    """What an admin changes while clients run."""

    def __init__(self, state: NodeState, turns: Turns) -> None:
        self.state = state
        self.turns = turns

    def set_mode(self, now: float, mode: str) -> list[Action]:
        if mode not in p.MODES:
            raise SchedulerError(p.E_INVALID, f"mode must be one of {', '.join(p.MODES)}")
        previous, self.state.mode = self.state.mode, mode
        return self.turns.mode_changed(previous, now)

    def set_tq(self, now: float, seconds: float, gpu: int | None = None) -> list[Action]:
        """A new TQ applies to running quanta too, measured from their start."""
        if not seconds > 0:
            raise SchedulerError(p.E_INVALID, "TQ must be a positive number of seconds")
        state = self.state
        if gpu is None:
            state.tq = seconds
            for each in state.gpus.values():
                each.tq_override = None
        elif gpu in state.gpus:
            state.gpus[gpu].tq_override = seconds
        else:
            raise SchedulerError(p.E_INVALID, f"no GPU {gpu} on this node")
        state.resize_windows()
        return self.turns.schedule_all(now)

    def reconfigure(self, config: SchedulerConfig, now: float) -> list[Action]:
        """Apply a reloaded config (SIGHUP) without dropping anyone."""
        self.state.configure(config)
        return self.turns.schedule_all(now)
