"""The fleet's runs with holders taking turns (mode auto, ``interactive.turns``), and what a
switch between them may cost.

``nodeside/scheduler/taking_turns.py`` gives the GPU's time to one holder side by side at a time,
least attained first, instead of leaving the driver to time-slice between them. What a switch costs
the GPU is not measured yet: on the CPU's side a turn between two processes through the shim takes
about 0.1 ms (``benchmarks.shim.turns``), but the GPU may lose more (the leaving process's queue
draining while nothing new starts, caches warming for the one coming). So the replay charges each
``Resume`` a cost (``Replay.resume_cost``): the resumed holder's work starts that much later and
nobody else's goes on meanwhile. ``--turns`` runs the same setting at several costs, to show how
dear a switch may be before taking turns stops paying.

A fleet ``policy`` name ``turns:TURN:COST`` is ``interactive`` with ``interactive.turns`` set
to TURN seconds, its replay charging COST seconds a switch.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The prefix of the fleet's ``policy`` names for runs taking turns: ``turns:TURN:COST``.
PREFIX = "turns:"


@dataclass(frozen=True)
class TurnRun:
    turn: float  # seconds: interactive.turns
    switch_cost: float = 0.0  # seconds the GPU loses at each switch (Replay.resume_cost)

    def __post_init__(self) -> None:
        if not self.turn > 0.0 or not 0.0 <= self.switch_cost < self.turn:
            raise ValueError(f"turns of {self.turn} s cannot pay switches of "
                             f"{self.switch_cost} s (the form is {PREFIX}1:0.05)")

    @classmethod
    def parse(cls, policy: str) -> TurnRun | None:
        """The run a fleet ``policy`` name asks for (``turns:1:0.05``), or None."""
        if not policy.startswith(PREFIX):
            return None
        turn, _, cost = policy[len(PREFIX):].partition(":")
        try:
            return cls(float(turn), float(cost or 0.0))
        except ValueError:
            raise ValueError(f"a policy taking turns looks like {PREFIX}1:0.05, "
                             f"not {policy!r}") from None

    @property
    def policy(self) -> str:
        return f"{PREFIX}{self.turn:g}:{self.switch_cost:g}"


#: The key run taking turns (``runs.RUNS``): mode auto, ``interactive``, TQ 30 s, turns of
#: 1 s, a switch charged 1 ms (ten times what the shim's side measured).
KEY_TURNS = TurnRun(1.0, 0.001)
#: What ``--turns`` adds: the same with a switch costing 10 ms, 50 ms and 200 ms.
TURN_RUNS = tuple(
    (f"auto, interactive, TQ 30 s, 1 s turns, switch {label}", "auto", 30.0,
     TurnRun(1.0, cost).policy, "gen4")
    for label, cost in (("10 ms", 0.01), ("50 ms", 0.05), ("200 ms", 0.2)))
