"""The admin's controls while clients run: the mode and the TQ.

Each applies at once to every GPU (or the one named) and returns what follows: drops when the
mode turns on or auto, withdrawn drops when it turns off, quanta ended under a shorter TQ.
``Scheduler`` (core.py) holds the state.
"""

from __future__ import annotations

from nodeside import protocol as p
from nodeside.scheduler.actions import Action, SchedulerError
from nodeside.scheduler.membership import Membership
from nodeside.scheduler.state import HoldState


class Controls(Membership):
    """What an admin changes while clients run; ``Scheduler`` holds the state it changes."""

    def _resize_windows(self) -> None:
        for index, gpu in self.gpus.items():
            gpu.meter.window = self.config.share_window(self.tq_for(index))

    def set_mode(self, now: float, mode: str) -> list[Action]:
        if mode not in p.MODES:
            raise SchedulerError(p.E_INVALID, f"mode must be one of {', '.join(p.MODES)}")
        previous, self.mode = self.mode, mode
        actions: list[Action] = []
        if mode != "off" and previous == "off":
            # Running side by side ends now: every holder gets a fresh quantum measured from
            # the switch, so none is dropped the instant the scheduler comes on.
            for gpu in self.gpus.values():
                for holder in gpu.holders.values():
                    assert holder.hold is not None
                    holder.hold.quantum_start = now
        if mode == "on":
            for gpu in self.gpus.values():
                keeper, *others = gpu.holders.values() if gpu.holders else (None,)
                for holder in others:
                    if holder.hold_state is HoldState.HOLDING:
                        actions.extend(self._drop(gpu, holder, p.REASON_MODE, now,
                                                  incoming=keeper))
        elif mode == "auto":
            for gpu in self.gpus.values():
                first = next(iter(gpu.holders.values()), None)
                actions.extend(self._relieve_overcommit(gpu, first, now, p.REASON_MODE))
        else:
            for gpu in self.gpus.values():
                self._withdraw_drops(gpu)
        return actions + self._schedule_all(now)

    def set_tq(self, now: float, seconds: float, gpu: int | None = None) -> list[Action]:
        """A new TQ applies to running quanta too, measured from their start."""
        if not seconds > 0:
            raise SchedulerError(p.E_INVALID, "TQ must be a positive number of seconds")
        if gpu is None:
            self.tq = seconds
            for state in self.gpus.values():
                state.tq_override = None
        elif gpu in self.gpus:
            self.gpus[gpu].tq_override = seconds
        else:
            raise SchedulerError(p.E_INVALID, f"no GPU {gpu} on this node")
        self._resize_windows()
        return self._schedule_all(now)
