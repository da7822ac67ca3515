"""Mode auto under ``policy: interactive``: memory side by side, the GPU's time to the light.

A holder heavy beside a light request steps aside (a drop whose memory stays), and heavy
requests are held back while a light holder has its turn, for at most one TQ (aside.py). Every
test runs the real scheduler core on an injected clock, through ``Replay`` with the GPU's time
shared as the fleet benchmark shares it (``co_run`` 1.0).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from policy_helpers import GiB, greedy, make_scheduler

from nodeside import protocol as p
from nodeside.model import Registration
from nodeside.scheduler.core import Drop, Grant
from nodeside.scheduler.status import build_status
from nodeside.testing import Replay

TQ = 30.0
AUTO_INTERACTIVE = {"mode": "auto", "policy": "interactive", "tq": TQ}


def side_by_side(config: dict | None = None, **kw) -> Replay:
    """A 40 GiB GPU in mode auto; every working set here fits beside the others."""
    sched = make_scheduler({**AUTO_INTERACTIVE, **(config or {})}, memory=40 * GiB)
    return Replay(sched, release_delay=0.1, co_run=1.0, **kw)


def cell_end(replay: Replay, name: str) -> float:
    return max(s.end for s in replay.spans if s.name == name and s.end is not None)


def drops_to(replay: Replay, name: str) -> list[Drop]:
    ids = {w.id for w in replay.workers.values() if w.name == name}
    return [a for _, a in replay.actions if isinstance(a, Drop) and a.client in ids]


def test_a_training_run_steps_aside_for_a_short_cell_and_keeps_its_memory():
    replay = side_by_side()
    greedy(replay, "trainer", working_set=8 * GiB)
    cell = replay.add("person", working_set=2 * GiB)
    replay.burst(cell, 2.0, when=100.0)
    replay.run_until(200.0)
    # Granted beside at once; the trainer, which has held for more than a first quantum, is
    # asked at once to step aside and gives back 0.1 s later: 0.1 s at half speed, then alone.
    assert cell_end(replay, "person") == pytest.approx(100.0 + 2.0 + 0.1 / 2)
    [drop] = drops_to(replay, "trainer")
    assert (drop.reason, drop.evict) == (p.REASON_QUANTUM, False)
    assert replay.scheduler.counts["steps_aside"] == 1


def test_without_stepping_aside_the_cell_shares_the_gpu_round_robin():
    replay = side_by_side({"policy": "round-robin"})
    greedy(replay, "trainer", working_set=8 * GiB)
    cell = replay.add("person", working_set=2 * GiB)
    replay.burst(cell, 2.0, when=100.0)
    replay.run_until(200.0)
    assert cell_end(replay, "person") == pytest.approx(104.0)  # half speed throughout
    assert drops_to(replay, "trainer") == []
    assert replay.scheduler.counts["steps_aside"] == 0


def test_the_training_run_is_held_back_during_the_light_turn_then_comes_back_beside():
    replay = side_by_side()
    trainer = greedy(replay, "trainer", working_set=8 * GiB)
    cell = replay.add("person", working_set=2 * GiB)
    replay.burst(cell, 5.0, when=100.0)
    replay.run_until(200.0)
    end = cell_end(replay, "person")
    trainer_grants = [t for t, a in replay.actions if isinstance(a, Grant) and a.client == trainer]
    # Asked again at once after stepping aside, the trainer is granted only when the cell ends.
    assert trainer_grants == [0.0, pytest.approx(end)]
    status = build_status(replay.scheduler, 0.0)  # after the run: the trainer holds alone
    assert status["gpus"][0]["holders"] == [trainer]


def test_a_waiter_held_back_is_told_why():
    sched = make_scheduler(AUTO_INTERACTIVE, memory=40 * GiB)
    trainer = sched.register(0.0, Registration(name="trainer", working_set=8 * GiB))
    person = sched.register(0.0, Registration(name="person", working_set=2 * GiB))
    sched.acquire(0.0, trainer.id)
    [grant, drop] = sched.acquire(100.0, person.id)
    assert (type(grant), grant.client, type(drop), drop.client) == (
        Grant, person.id, Drop, trainer.id)
    sched.release(100.3, trainer.id)
    assert sched.acquire(100.3, trainer.id) == []  # held back
    reason = build_status(sched, 101.0)["gpus"][0]["next_reason"]
    assert reason == "held back while a light request beside it has its turn: 30 s at most"


def test_a_low_cell_shares_with_a_normal_training_run_rather_than_cut_it():
    """A LOW request never cuts a quantum short, in mode auto as in mode on."""
    replay = side_by_side()
    greedy(replay, "trainer", working_set=8 * GiB)
    cell = replay.add("person", priority="LOW", working_set=2 * GiB)
    replay.burst(cell, 2.0, when=100.0)
    replay.run_until(200.0)
    assert cell_end(replay, "person") == pytest.approx(104.0)
    assert drops_to(replay, "trainer") == []


def test_a_low_training_run_steps_aside_for_a_normal_cell():
    replay = side_by_side()
    greedy(replay, "trainer", priority="LOW", working_set=8 * GiB)
    cell = replay.add("person", working_set=2 * GiB)
    replay.burst(cell, 2.0, when=100.0)
    replay.run_until(200.0)
    assert cell_end(replay, "person") == pytest.approx(102.0 + 0.1 / 2)


def test_two_training_runs_side_by_side_hear_nothing():
    replay = side_by_side()
    greedy(replay, "one", working_set=8 * GiB)
    greedy(replay, "two", working_set=8 * GiB)
    replay.run_until(500.0)
    assert replay.scheduler.counts["drops"] == 0
    assert replay.scheduler.next_deadline(500.0) is None  # their turns are over: no polling


def test_a_light_cell_that_does_not_fit_cuts_the_holders_quantum_instead_of_waiting_a_tq():
    """Where the light request needs the room, the holder leaves after the quantum priced as in
    mode on (a first quantum, or twice the memory moves), and moves its memory out."""
    replay = side_by_side()
    greedy(replay, "trainer", working_set=30 * GiB)
    cell = replay.add("person", working_set=20 * GiB)
    replay.burst(cell, 2.0, when=100.0)
    replay.run_until(200.0)
    [drop, *_] = drops_to(replay, "trainer")
    assert (drop.reason, drop.evict) == (p.REASON_QUANTUM, True)
    assert cell_end(replay, "person") < 100.0 + 5.0  # not the rest of a 30 s quantum


@pytest.mark.parametrize("tq", [2.0, 5.0])
def test_a_stream_of_light_cells_holds_a_training_run_back_at_most_a_tq_then_it_holds_one(tq):
    """Light notebooks taking turns so that one always has its turn: the trainer still waits at
    most one TQ (and a first quantum, when the daemon looks again) and then holds for one."""
    replay = side_by_side({"tq": tq})
    trainer = greedy(replay, "trainer", working_set=4 * GiB)
    for i in range(4):
        worker = replay.add(f"light-{i}", working_set=GiB)
        for k in range(60):
            replay.burst(worker, 0.3 * tq, when=50.0 + i * 0.25 * tq + k * tq)
    replay.run_until(50.0 + 60 * tq)
    assert_bounded(replay, trainer, tq)


def assert_bounded(replay: Replay, trainer: str, tq: float) -> None:
    first_quantum = replay.scheduler.config.interactive.first_quantum
    waits = [w for w in replay.wait_spans if w.client == trainer and w.end is not None]
    holds = {s.start: s for s in replay.spans if s.client == trainer}
    assert waits, "the trainer never stepped aside: nothing was tested"
    for wait in waits:
        assert wait.end - wait.start <= tq + first_quantum + 1e-6
        if wait.end - wait.start >= tq - 1e-6:  # let through: it holds a TQ before leaving
            hold = holds[wait.end]
            assert hold.end is None or hold.end - hold.start >= tq - 1e-6


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tq=st.sampled_from([1.0, 2.0, 5.0]),
       lights=st.lists(st.tuples(st.sampled_from(["NORMAL", "LOW"]),
                                 st.lists(st.tuples(st.floats(0, 60), st.floats(0.05, 3)),
                                          min_size=1, max_size=8)),
                       min_size=1, max_size=5))
def test_no_stream_of_light_requests_starves_a_training_run(tq, lights):
    replay = side_by_side({"tq": tq})
    trainer = greedy(replay, "trainer", working_set=4 * GiB)
    work = 0.0
    for i, (priority, cells) in enumerate(lights):
        worker = replay.add(f"light-{i}", priority=priority, working_set=GiB)
        for when, seconds in cells:
            replay.burst(worker, seconds, when=10.0 + when)
            work += seconds
    replay.run_until(100.0 + 3 * work)
    settings = replay.scheduler.config.interactive
    # Held back itself for at most a TQ; behind others held back, passed over by at most
    # ``pass_bound`` of them, each held back for at most a TQ (and a first quantum, when the
    # daemon looks again).
    bound = (settings.pass_bound + 1) * (tq + settings.first_quantum)
    for wait in replay.wait_spans:
        if wait.client == trainer and wait.end is not None:
            assert wait.end - wait.start <= bound + 1e-6
    # Every light cell got done.
    assert all(w.remaining == 0 for w in replay.workers.values() if w.name != "trainer")


def test_a_holder_leaving_in_its_first_tq_is_no_reason_to_look_again():
    """Only a holder in its turn (holding, in the first TQ of its hold) can make another step
    aside: one already asked to leave, with nobody waiting, leaves the daemon nothing to look
    again for but its grace."""
    sched = make_scheduler({**AUTO_INTERACTIVE, "grace": 20}, memory=40 * GiB)
    trainer = sched.register(0.0, Registration(name="trainer", working_set=8 * GiB))
    explorer = sched.register(0.0, Registration(name="explorer", priority="LOW",
                                                working_set=8 * GiB))
    sched.acquire(0.0, trainer.id)
    [grant] = sched.acquire(100.0, explorer.id)  # a LOW request shares, cutting nothing
    assert grant.client == explorer.id
    # The trainer's working set grows past the room: the explorer must leave, and has not yet.
    [drop] = sched.report_working_set(101.0, trainer.id, 35 * GiB)
    assert (drop.client, drop.evict) == (explorer.id, True)
    assert sched.next_deadline(101.0) == pytest.approx(101.0 + 20)
