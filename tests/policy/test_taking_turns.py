"""Mode auto under ``interactive.turns``: holders side by side take turns, least attained first.

The rules of taking_turns.py on the real scheduler core with an injected clock: one pausable
holder works at a time, a fresh cell takes the turn at once, equals alternate, a holder paused a
whole TQ is owed a turn nobody cuts short, a lone holder always works, and the share meter
charges only the holder working. Hypothesis checks the invariants on random traffic: never two
at work, never none, and nobody paused past its bound.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from policy_helpers import GiB, greedy, kinds, make_scheduler

from nodeside.model import Registration
from nodeside.scheduler.core import Drop, Resume, Scheduler
from nodeside.scheduler.gpu_state import HoldState
from nodeside.scheduler.status import build_status
from nodeside.testing import Replay

TQ = 30.0
TURN = 1.0
#: A first quantum of a TQ keeps the step-aside rule (aside.py) out of the unit tests: nobody
#: leaves here, they take turns. The fleet runs both together (docs/policy.md).
TURNS = {"mode": "auto", "policy": "interactive", "tq": TQ,
         "interactive": {"turns": TURN, "first_quantum": TQ}}


def scheduler(config: dict | None = None) -> Scheduler:
    return make_scheduler({**TURNS, **(config or {})}, memory=40 * GiB)


def holding(sched: Scheduler, name: str, now: float, *, pausable: bool = True):
    client = sched.register(now, Registration(name=name, working_set=GiB, pausable=pausable))
    actions = sched.acquire(now, client.id)
    return client, actions


def at_work(sched: Scheduler) -> list[str]:
    return [c.name for c in sched.gpus[0].holders.values() if not c.paused]


def test_turns_are_off_unless_configured():
    sched = scheduler({"interactive": {"first_quantum": TQ}})
    holding(sched, "trainer", 0.0)
    _, actions = holding(sched, "person", 10.0)
    assert kinds(actions) == [("Grant", "c2")]
    assert sched.turn_length() == 0.0
    assert at_work(sched) == ["trainer", "person"]


def test_a_fresh_cell_takes_the_turn_at_once_and_the_busy_holder_pauses():
    sched = scheduler()
    trainer, _ = holding(sched, "trainer", 0.0)
    person, actions = holding(sched, "person", 10.0)
    assert kinds(actions) == [("Grant", person.id), ("Pause", trainer.id)]
    assert at_work(sched) == ["person"]
    assert trainer.state == "holding" and trainer.paused  # it keeps the GPU and its memory
    # The person's cell has done less than the trainer's ten seconds until it has done ten:
    # its turns go on, one after another, heard of by nobody.
    assert sched.next_deadline(10.0) == pytest.approx(11.0)
    assert sched.tick(11.0) == []
    assert sched.tick(15.0) == []
    # The cell ends: the trainer works again.
    actions = sched.release(15.5, person.id)
    assert (Resume(trainer.id, 0)) in actions
    assert at_work(sched) == ["trainer"]


def test_equals_alternate_turn_by_turn_longest_paused_first():
    sched = scheduler()
    a, _ = holding(sched, "a", 0.0)
    b, actions = holding(sched, "b", 0.0)
    assert kinds(actions) == [("Grant", b.id), ("Pause", b.id)]  # a tie: a keeps its turn
    assert kinds(sched.tick(1.0)) == [("Pause", a.id), ("Resume", b.id)]
    assert kinds(sched.tick(2.0)) == [("Pause", b.id), ("Resume", a.id)]
    assert sched.counts["turns"] == 2


def test_a_holder_that_cannot_pause_works_beside_whoever_has_the_turn():
    sched = scheduler()
    holding(sched, "python-client", 0.0, pausable=False)
    trainer, _ = holding(sched, "trainer", 1.0)
    person, actions = holding(sched, "person", 5.0)
    assert kinds(actions) == [("Grant", person.id), ("Pause", trainer.id)]
    assert at_work(sched) == ["python-client", "person"]


def test_a_lone_holder_always_works():
    sched = scheduler()
    trainer, _ = holding(sched, "trainer", 0.0)
    person, _ = holding(sched, "person", 10.0)
    assert trainer.paused
    actions = sched.unregister(10.5, person.id)  # the person's kernel died
    assert kinds(actions) == [("Resume", trainer.id)]
    assert sched.next_deadline(10.5) is None  # nobody paused: no turn to end


def test_a_holder_paused_a_whole_tq_is_owed_a_turn_that_nobody_cuts_short():
    sched = scheduler()
    trainer, _ = holding(sched, "trainer", 0.0)
    person, _ = holding(sched, "person", 10.0)  # the person's cell runs long
    assert trainer.paused
    # At the end of the person's turn after a TQ of pause, the trainer is owed one.
    assert kinds(sched.tick(10.0 + TQ)) == [("Pause", person.id), ("Resume", trainer.id)]
    assert trainer.hold.owed_turn
    # A fresh cell now waits for the owed turn's end instead of cutting it short.
    newcomer, actions = holding(sched, "newcomer", 10.0 + TQ + 0.5)
    assert kinds(actions) == [("Grant", newcomer.id), ("Pause", newcomer.id)]
    assert kinds(sched.tick(10.0 + TQ + TURN)) == [("Pause", trainer.id),
                                                   ("Resume", newcomer.id)]


def test_the_share_meter_charges_only_the_holder_at_work():
    sched = scheduler({"pools": {"a": {"guarantee": 0.5}, "b": {"guarantee": 0.5}}})
    trainer = sched.register(0.0, Registration(name="trainer", pool="a", working_set=GiB,
                                               pausable=True))
    person = sched.register(0.0, Registration(name="person", pool="b", working_set=GiB,
                                              pausable=True))
    sched.acquire(0.0, trainer.id)
    sched.acquire(10.0, person.id)  # from 10 s on only the person works
    # Ten seconds of the GPU's time each; charged 1/2 each while side by side (the driver
    # time-slicing), it would have read 0.75 and 0.25.
    assert sched.gpus[0].meter.shares(20.0, ["a", "b"]) == pytest.approx({"a": 0.5, "b": 0.5})


def test_paused_time_is_not_counted_as_the_cells_work():
    sched = scheduler()
    trainer, _ = holding(sched, "trainer", 0.0)
    holding(sched, "person", 10.0)
    assert sched.choice.request_work(trainer.id, 14.0) == pytest.approx(10.0)


def test_mode_off_lets_every_paused_holder_work():
    sched = scheduler()
    trainer, _ = holding(sched, "trainer", 0.0)
    holding(sched, "person", 10.0)
    assert kinds(sched.set_mode(11.0, "off")) == [("Resume", trainer.id)]
    assert at_work(sched) == ["trainer", "person"]


def test_the_status_says_who_is_paused_and_the_turn_in_effect():
    sched = scheduler()
    trainer, _ = holding(sched, "trainer", 0.0)
    holding(sched, "person", 10.0)
    doc = build_status(sched, 10.5)
    assert doc["gpus"][0]["turns"] == TURN
    paused = {c["name"]: c["paused"] for c in doc["clients"]}
    assert paused == {"trainer": True, "person": False}


# -- invariants on random traffic (Hypothesis) ---------------------------------------------


def check_turns(replay: Replay, _actions) -> None:
    """At most one pausable holder at work, and one whenever any holds; nobody paused past
    a TQ plus a turn for each holder (the owed turns ahead of it)."""
    sched = replay.scheduler
    for gpu in sched.gpus.values():
        takers = [h for h in gpu.holders.values()
                  if h.pausable and h.hold_state is HoldState.HOLDING]
        working = [h for h in takers if not h.paused]
        assert gpu.paused == sum(h.paused for h in gpu.holders.values())
        assert len(working) <= 1
        assert not takers or working
        bound = sched.tq_for(gpu.spec.index) + (len(gpu.holders) + 1) * TURN + 1e-6
        for h in takers:
            if h.paused:
                assert replay.now - h.hold.paused_since <= bound


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cells=st.lists(st.lists(st.tuples(st.floats(0, 120), st.floats(0.05, 40)),
                               min_size=1, max_size=6), min_size=1, max_size=5),
       first_quantum=st.sampled_from([0.25, TQ]))
# Two equals racing within their turns once put an owed turn off past its bound.
@example(cells=[[(32.0, 32.0)], [(32.0, 32.0)], [(65.0, 2.0)]], first_quantum=0.25)
def test_one_at_work_never_none_and_nobody_paused_past_its_bound(cells, first_quantum):
    sched = scheduler({"interactive": {"turns": TURN, "first_quantum": first_quantum}})
    replay = Replay(sched, release_delay=0.1, co_run=0.9)
    replay.observers.append(check_turns)
    greedy(replay, "trainer", working_set=4 * GiB, pausable=True)
    work = 0.0
    for i, bursts in enumerate(cells):
        worker = replay.add(f"cell-{i}", working_set=GiB, pausable=True)
        for when, seconds in bursts:
            replay.burst(worker, seconds, when=when)
            work += seconds
    end = 200.0 + 3 * work
    replay.run_until(end)
    check_turns(replay, [])
    # Every cell got done, and the trainer, holding at the end, got the rest of the GPU's
    # time: all of it but the cells' work (at worst shared with a leaving holder, at co_run
    # 0.9 for two) and the give-backs of its drops.
    assert all(w.remaining == 0 for w in replay.workers.values() if w.name != "trainer")
    [trainer] = [w for w in replay.workers.values() if w.name == "trainer"]
    assert trainer.holding_since is not None
    drops = sum(isinstance(a, Drop) for _, a in replay.actions)
    assert 1e12 - trainer.left(end) >= end - work / 0.45 - 0.1 * drops - 1e-6
