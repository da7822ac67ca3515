"""The fleet's runs taking turns (``benchmarks.fleet.turns``) and the replay's side of a turn:
a paused holder does no work, and a resumed one starts after the switch's cost."""

from __future__ import annotations

import pytest
from policy_helpers import GiB, make_scheduler

from benchmarks.fleet.runs import RUNS, run
from benchmarks.fleet.turns import KEY_TURNS, TURN_RUNS, TurnRun
from nodeside.scheduler.core import Pause, Resume
from nodeside.testing import Replay

TURNS = {"mode": "auto", "policy": "interactive", "tq": 30.0,
         "interactive": {"turns": 1.0, "first_quantum": 30.0}}


def ends(replay: Replay) -> dict[str, float]:
    return {s.name: s.end for s in replay.spans if s.end is not None}


@pytest.mark.parametrize("resume_cost", [0.0, 0.05])
def test_a_short_cell_beside_a_training_run_runs_alone_and_the_run_pays_only_the_switches(
        resume_cost):
    """The trainer works 10 s from 0, the person 2 s from 4 s: the person works alone at once
    (its switch costs ``resume_cost``), and the trainer goes on after it (another switch)."""
    replay = Replay(make_scheduler(TURNS, memory=40 * GiB), co_run=0.9,
                    resume_cost=resume_cost)
    trainer = replay.add("trainer", working_set=GiB, pausable=True)
    person = replay.add("person", working_set=GiB, pausable=True)
    replay.burst(trainer, 10.0, when=0.0)
    replay.burst(person, 2.0, when=4.0)
    replay.run_until(100.0)
    # A fresh grant works from its grant; only a resumed holder waits for the switch.
    assert ends(replay) == {"person": pytest.approx(6.0),
                            "trainer": pytest.approx(12.0 + resume_cost)}
    paused = [a for _, a in replay.actions if isinstance(a, (Pause, Resume))]
    assert paused == [Pause(trainer.id, 0), Resume(trainer.id, 0)]
    # The timeline draws the trainer's hold with the stretch it was paused.
    [hold] = [s for s in replay.spans if s.name == "trainer"]
    assert hold.paused == [(4.0, pytest.approx(6.0))] and hold.paused_since is None


def test_without_pausing_the_two_share_the_gpu_at_the_co_run_rate():
    replay = Replay(make_scheduler(TURNS, memory=40 * GiB), co_run=0.9)
    trainer = replay.add("trainer", working_set=GiB)  # a client that cannot pause
    person = replay.add("person", working_set=GiB)
    replay.burst(trainer, 10.0, when=0.0)
    replay.burst(person, 2.0, when=4.0)
    replay.run_until(100.0)
    assert ends(replay)["person"] == pytest.approx(4.0 + 2.0 / 0.45)


@pytest.mark.parametrize("text", ["turns:0:0", "turns:1:1", "turns:1:-0.1", "turns:x", "turns:"])
def test_a_malformed_name_taking_turns_is_refused_with_its_form(text):
    with pytest.raises(ValueError, match="turns:1:0.05"):
        TurnRun.parse(text)


def test_a_name_taking_turns_reads_back_and_other_names_do_not_take_turns():
    assert TurnRun.parse(TurnRun(0.5, 0.01).policy) == TurnRun(0.5, 0.01)
    assert TurnRun.parse("interactive") is None and TurnRun.parse("hints:0.7:0.3") is None
    assert all(TurnRun.parse(policy) is not None for _, _, _, policy, _ in TURN_RUNS)
    assert any(policy == KEY_TURNS.policy for _, _, _, policy, _ in RUNS)


def test_a_fleet_run_taking_turns_is_interactive_in_auto_with_its_turns_and_switch_cost():
    small = {"notebooks": 6, "gpus": 1, "hours": 0.25, "seed": 3, "mode": "auto", "tq": 30.0}
    result = run(**small, policy=TurnRun(1.0, 0.01).policy)
    replay = result["_replay"]
    assert replay.scheduler.config.policy == "interactive"
    assert replay.scheduler.config.interactive.turns == 1.0
    assert replay.resume_cost == 0.01
    assert result["counts"]["turns"] > 0
    without = run(**small, policy="interactive")
    assert without["counts"]["turns"] == 0
