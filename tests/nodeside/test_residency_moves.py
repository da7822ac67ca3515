"""The residency's transition table: every legal move works and dates the new residency, every
other one raises and leaves the memory where it was; the status document keeps its words."""

from __future__ import annotations

import itertools

import pytest

from nodeside.model import EVICTED, RESIDENCIES, RESIDENT, RESTORING, Residency
from nodeside.scheduler.clients import RESIDENCY_MOVES
from nodeside.scheduler.core import ClientRecord, IllegalTransition

ALL_MOVES = [(a, b) for a, b in itertools.product(Residency, Residency) if a is not b]


def client_in(residency: Residency) -> ClientRecord:
    return ClientRecord(id="c1", name="nb", gpu=0, pool="default", priority="NORMAL", memory=True,
                  residency=residency)


@pytest.mark.parametrize(("before", "after"), sorted(RESIDENCY_MOVES, key=str), ids=str)
def test_a_legal_move_changes_the_residency_and_dates_it(before: Residency,
                                                         after: Residency) -> None:
    client = client_in(before)
    client.settle(after, 12.5)
    assert (client.residency, client.eviction.since) == (after, 12.5)


@pytest.mark.parametrize(("before", "after"),
                         [m for m in ALL_MOVES if m not in RESIDENCY_MOVES], ids=str)
def test_an_illegal_move_raises_and_leaves_the_memory_where_it_was(before: Residency,
                                                                   after: Residency) -> None:
    client = client_in(before)
    with pytest.raises(IllegalTransition, match=f"{before.value} -> {after.value}"):
        client.settle(after, 1.0)
    assert (client.residency, client.eviction.since) == (before, None)


def test_only_a_grant_after_an_eviction_restores() -> None:
    # Resident memory has nothing in host memory to bring back.
    assert (RESIDENT, RESTORING) not in RESIDENCY_MOVES
    assert {a for a, b in RESIDENCY_MOVES if b is RESTORING} == {EVICTED, Residency.EVICTING}


def test_staying_where_it_is_keeps_the_date() -> None:
    client = client_in(EVICTED)
    client.settle(RESTORING, 3.0)
    client.settle(RESTORING, 7.0)
    assert client.eviction.since == 3.0


def test_every_residency_can_get_back_on_the_gpu() -> None:
    reach = {RESIDENT}
    while True:
        more = {a for a, b in RESIDENCY_MOVES if b in reach} - reach
        if not more:
            break
        reach |= more
    assert reach == set(Residency)


def test_the_status_document_keeps_its_words() -> None:
    assert tuple(r.value for r in Residency) == RESIDENCIES == (
        "resident", "evicting", "evicted", "restoring")
