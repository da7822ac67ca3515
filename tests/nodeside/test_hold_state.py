"""The hold state's transition table: every legal move works, every other one raises."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodeside.config import SchedulerConfig
from nodeside.model import Registration
from nodeside.scheduler.core import (
    ClientRecord,
    GpuSpec,
    HoldState,
    IllegalTransition,
    Scheduler,
)
from nodeside.scheduler.gpu_state import TRANSITIONS

ALL_MOVES = list(itertools.product(HoldState, HoldState))


def client_in(state: HoldState) -> ClientRecord:
    return ClientRecord(id="c1", name="nb", gpu=0, pool="default", priority="NORMAL",
                  hold_state=state)


@pytest.mark.parametrize(("before", "after"), sorted(TRANSITIONS, key=str))
def test_a_legal_move_changes_the_hold_state(before: HoldState, after: HoldState) -> None:
    client = client_in(before)
    client.move(after)
    assert client.hold_state is after


@pytest.mark.parametrize(("before", "after"),
                         [m for m in ALL_MOVES if m not in TRANSITIONS], ids=str)
def test_an_illegal_move_raises_and_leaves_the_state_alone(before: HoldState,
                                                           after: HoldState) -> None:
    client = client_in(before)
    with pytest.raises(IllegalTransition, match=f"{before.value} -> {after.value}"):
        client.move(after)
    assert client.hold_state is before


def test_a_dropping_holder_is_still_holding_in_the_status_words() -> None:
    assert [s.public for s in HoldState] == ["idle", "waiting", "holding", "holding"]


def test_every_state_can_get_back_to_idle() -> None:
    # No state is a trap: a client that goes away is always freed.
    reach = {HoldState.IDLE}
    while True:
        more = {a for a, b in TRANSITIONS if b in reach} - reach
        if not more:
            break
        reach |= more
    assert reach == set(HoldState)


def test_dropping_a_holder_twice_raises_instead_of_doing_nothing() -> None:
    s = Scheduler(SchedulerConfig(tq=1.0), [GpuSpec(0)], now=0.0)
    a = s.register(0.0, Registration(name="a"))
    b = s.register(0.0, Registration(name="b"))
    s.acquire(0.0, a.id)
    s.acquire(0.0, b.id)
    s.tick(1.0)
    assert a.hold_state is HoldState.DROPPING
    with pytest.raises(IllegalTransition):
        s._drop(s.gpus[0], a, "quantum", 1.0, incoming=b)


@given(st.lists(st.sampled_from(list(HoldState)), max_size=20))
def test_a_walk_is_accepted_exactly_when_each_step_is_in_the_table(
        walk: list[HoldState]) -> None:
    client = client_in(HoldState.IDLE)
    for after in walk:
        before = client.hold_state
        if (before, after) in TRANSITIONS:
            client.move(after)
            assert client.hold_state is after
        else:
            with pytest.raises(IllegalTransition):
                client.move(after)
            assert client.hold_state is before
