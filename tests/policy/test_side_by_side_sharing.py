"""Holders side by side share the GPU's time in the simulator (``Replay(co_run=...)``).

Kernels of different processes on one GPU take turns on it: two compute-bound cells side by side
each run at about half speed. Without ``co_run`` the replay runs them at full speed, the model
that flattered mode auto; with it, k working holders each do ``co_run / k`` of a second's work
per second, and the rates change whenever a holder starts working or leaves.
"""

from __future__ import annotations

import pytest
from policy_helpers import GiB, make_scheduler

from benchmarks.fleet.switching import SwitchingModel
from nodeside.testing import Replay

GPU = 40 * GiB


def side_by_side(co_run: float | None, link: float | None = None) -> Replay:
    switching = SwitchingModel(GPU, link) if link else None
    return Replay(make_scheduler({"tq": 1000.0, "mode": "auto"}, memory=GPU),
                  switching=switching, co_run=co_run)


def ends(replay: Replay) -> dict[str, float | None]:
    return {s.name: s.end for s in replay.spans}


def a_long_cell_then_a_short_one_beside_it(co_run: float | None) -> dict[str, float | None]:
    """A works 10 s from 0 s, B 2 s from 4 s, side by side: when each ends."""
    replay = side_by_side(co_run=co_run)
    a = replay.add("A", working_set=GiB)
    b = replay.add("B", working_set=GiB)
    replay.burst(a, 10.0, when=0.0)
    replay.burst(b, 2.0, when=4.0)
    replay.run_until(100.0)
    return ends(replay)


def test_two_holders_side_by_side_each_work_at_half_speed():
    # A alone for 4 s (6 s left); from 4 s both at half speed: B's 2 s take 4 s, so B ends at
    # 8 s with A 2 s further (4 s left); A alone again ends at 12 s.
    assert a_long_cell_then_a_short_one_beside_it(1.0) == {"A": pytest.approx(12.0),
                                                         "B": pytest.approx(8.0)}


def test_without_co_run_holders_side_by_side_work_at_full_speed():
    assert a_long_cell_then_a_short_one_beside_it(None) == {"A": pytest.approx(10.0),
                                                          "B": pytest.approx(6.0)}


def test_an_efficiency_below_one_slows_every_holder_beside_another():
    replay = side_by_side(co_run=0.8)
    workers = [replay.add(n, working_set=GiB) for n in "ABC"]
    for worker in workers:
        replay.burst(worker, 2.4, when=0.0)
    replay.run_until(100.0)
    # Three at 0.8 / 3 of a second's work per second: 2.4 s of work each takes 9 s.
    assert ends(replay) == {n: pytest.approx(9.0) for n in "ABC"}


def test_a_holder_shares_only_once_its_memory_has_come_in():
    """While a holder's memory moves in, the one beside it works alone at full speed."""
    replay = side_by_side(co_run=1.0, link=10 * GiB)  # 10 GiB a second: 20 GiB take 2 s
    a = replay.add("A", working_set=GiB)
    b = replay.add("B", working_set=20 * GiB)
    c = replay.add("C", working_set=20 * GiB)
    replay.burst(a, 30.0, when=0.0)
    replay.burst(b, 1.0, when=0.0)  # allocates in place: shares with A at once, ends at 2 s
    replay.burst(c, 1.0, when=3.0)  # B's memory moves out first (3-5 s), then C shares: 5-7 s
    replay.burst(b, 1.0, when=10.0)  # C out and B back in (10-14 s), then B shares: 14-16 s
    replay.run_until(100.0)
    spans = {(s.name, s.start): s for s in replay.spans}
    assert [s.switching for s in replay.spans if s.name != "A"] == [
        0.0, pytest.approx(2.0), pytest.approx(4.0)]
    assert spans[("B", 0.0)].end == pytest.approx(2.0)
    assert spans[("C", 3.0)].end == pytest.approx(7.0)
    assert spans[("B", 10.0)].end == pytest.approx(16.0)
    # A's 30 s: 1 s by 2 s, 3 s alone by 5 s, 1 s beside C, 7 s alone by 14 s, 1 s beside B,
    # and the last 17 s alone: it ends at 33 s.
    assert spans[("A", 0.0)].end == pytest.approx(33.0)


def test_a_cell_added_to_a_holders_burst_keeps_the_shared_rate():
    replay = side_by_side(co_run=1.0)
    a = replay.add("A", working_set=GiB)
    b = replay.add("B", working_set=GiB)
    replay.burst(a, 4.0, when=0.0)
    replay.burst(b, 10.0, when=0.0)
    replay.burst(a, 2.0, when=2.0)  # more work while it holds: 5 s left at half speed
    replay.run_until(100.0)
    assert ends(replay)["A"] == pytest.approx(12.0)
    assert ends(replay)["B"] == pytest.approx(16.0)


def test_co_run_is_a_fraction_of_the_gpu():
    with pytest.raises(ValueError, match="co_run"):
        side_by_side(co_run=1.5)


