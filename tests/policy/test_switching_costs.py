"""Switching costs in the simulator: a handoff that must move memory costs GPU time nobody uses.

The replay runs the real scheduler core; ``SwitchingModel`` says how long each grant spends
moving working sets over the host link before the new holder can work.
"""

from __future__ import annotations

import pytest
from policy_helpers import GiB, make_scheduler

from benchmarks.fleet.switching import Residency, SwitchingModel
from nodeside.testing import Replay

LINK = 10 * GiB  # bytes per second: 10 GiB take one second, so the figures read easily


def replay_with_link(memory: int = 40 * GiB) -> Replay:
    return Replay(make_scheduler({"tq": 100.0}, memory=memory),
                  switching=SwitchingModel(memory, LINK))


def ends(replay: Replay, name: str) -> list[float | None]:
    return [s.end for s in replay.spans if s.name == name]


def test_a_handoff_whose_working_sets_do_not_fit_costs_evict_plus_restore():
    replay = replay_with_link()
    a = replay.add("A", working_set=30 * GiB)
    b = replay.add("B", working_set=30 * GiB)
    replay.burst(a, 10.0, when=0.0)
    replay.burst(b, 5.0, when=1.0)
    replay.burst(a, 2.0, when=20.0)
    replay.run_until(100.0)
    # A's first grant allocates in place: nothing to move. B needs A's room: 3 s to evict A.
    # A comes back: 3 s to evict B and 3 s to restore A.
    assert ends(replay, "A") == [pytest.approx(10.0), pytest.approx(28.0)]
    assert ends(replay, "B") == [pytest.approx(18.0)]
    assert [s.switching for s in replay.spans] == [0.0, pytest.approx(3.0), pytest.approx(6.0)]


def test_a_handoff_whose_working_sets_fit_together_costs_nothing():
    replay = replay_with_link()
    a = replay.add("A", working_set=10 * GiB)
    b = replay.add("B", working_set=10 * GiB)
    replay.burst(a, 10.0, when=0.0)
    replay.burst(b, 5.0, when=1.0)
    replay.burst(a, 2.0, when=20.0)
    replay.run_until(100.0)
    assert ends(replay, "B") == [pytest.approx(15.0)]
    assert ends(replay, "A")[-1] == pytest.approx(22.0)
    assert all(s.switching == 0.0 for s in replay.spans)


def test_switching_time_is_nobodys_work():
    """A quantum that ends while memory still moves does no work: the burst is all still due."""
    replay = Replay(make_scheduler({"tq": 2.0}, memory=40 * GiB),
                    switching=SwitchingModel(40 * GiB, LINK))
    a = replay.add("A", working_set=35 * GiB)
    b = replay.add("B", working_set=35 * GiB)
    replay.burst(a, 1.0, when=0.0)
    replay.burst(b, 1.0, when=0.5)  # waits for A; evicting A takes 3.5 s, longer than a TQ
    replay.run_until(100.0)
    held_b = [s for s in replay.spans if s.name == "B"]
    assert held_b[0].switching == pytest.approx(3.5)
    assert held_b[-1].end == pytest.approx(1.0 + 3.5 + 1.0)
    assert b.remaining == 0.0 and b.bursts_done == 1


def test_the_least_recently_granted_working_sets_go_first():
    gpu = Residency(capacity=40 * GiB)
    assert gpu.admit("A", 15 * GiB) == (0, 0)
    assert gpu.admit("B", 15 * GiB) == (0, 0)
    assert gpu.admit("A", 15 * GiB) == (0, 0)  # still resident: nothing moves
    assert gpu.admit("C", 15 * GiB) == (15 * GiB, 0)  # B was granted least recently
    assert list(gpu.resident) == ["A", "C"]
    assert gpu.admit("B", 15 * GiB) == (15 * GiB, 15 * GiB)  # A goes; B comes back


def test_holders_side_by_side_are_never_evicted():
    gpu = Residency(capacity=40 * GiB)
    gpu.admit("A", 20 * GiB)
    gpu.admit("B", 10 * GiB)
    assert gpu.admit("C", 20 * GiB, keep=["A"]) == (10 * GiB, 0)
    assert "A" in gpu.resident and "B" not in gpu.resident


