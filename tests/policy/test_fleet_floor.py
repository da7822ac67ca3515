"""The fleet benchmark's floor under short cells' slowdown that the priority rules impose
(``benchmarks.fleet_bound``), on the real scheduler core."""

from __future__ import annotations

import pytest
from policy_helpers import make_scheduler

from benchmarks.fleet import Cell, run
from benchmarks.fleet_bound import LowFloor
from nodeside.scheduler.replay import Replay

POOLS = {"a": {"guarantee": 0.3, "weight": 1, "maximum": -1},
         "b": {"guarantee": 0.3, "weight": 1, "maximum": -1}}


def low_cell_behind(policy: str, normal: list[tuple[str, float, float]],
                    priority: str = "LOW", release_delay: float = 0.0) -> tuple[Cell, dict]:
    """NORMAL requests (pool, start, GPU seconds), then at t=1 a cell of pool a (1 s)."""
    replay = Replay(make_scheduler({"tq": 30.0, "pools": POOLS, "policy": policy}),
                    release_delay=release_delay)
    for i, (pool, start, seconds) in enumerate(normal):
        replay.burst(replay.add(f"n{i}", pool=pool), seconds, when=start)
    low = replay.add("low", pool="a", priority=priority)
    cell = Cell("low", "a", 0, start=1.0, burst=1.0, priority=priority)

    def done(_: object, now: float) -> None:
        cell.end = now
    low.on_done = done
    floor = LowFloor(10.0, {low.id: cell})
    replay.observers.append(floor.observe)
    replay.burst(low, 1.0, when=1.0)
    replay.run_until(300.0)
    assert cell.end is not None
    return cell, floor.report(replay, [cell])


@pytest.mark.parametrize("policy", ["round-robin", "interactive"])
def test_a_low_cell_waits_at_least_for_the_normal_work_of_its_own_pool(policy):
    """a's NORMAL requests have 6 s (of 7, one held since 0) and 5 s left at t=1."""
    cell, report = low_cell_behind(policy, [("a", 0.0, 7.0), ("a", 0.5, 5.0)])
    assert cell.wait >= 11.0 - 1e-9
    assert report["short_slowdown_mean_low_floor"] == pytest.approx(1.0 + 11.0)
    assert report["short_slowdown_mean_floor"] == pytest.approx(12.0)


@pytest.mark.parametrize("policy", ["round-robin", "interactive"])
def test_a_low_cell_waits_at_least_for_the_other_pools_normal_quantum(policy):
    """b's NORMAL holder has 29 s of its 30 s quantum left at t=1; a LOW cell cuts none."""
    cell, report = low_cell_behind(policy, [("b", 0.0, 100.0)])
    assert cell.wait >= 29.0 - 1e-9
    assert report["short_slowdown_mean_low_floor"] == pytest.approx(1.0 + 29.0)


@pytest.mark.parametrize(("holder_seconds", "floor"), [(100.0, 0.2), (1.05, 0.05)])
def test_a_normal_cell_waits_at_least_for_the_holder_to_give_back_or_finish(holder_seconds,
                                                                            floor):
    """Interactive cuts b's quantum short for the newcomer, but giving back takes 0.2 s; a
    holder with 0.05 s of work left is done sooner."""
    cell, report = low_cell_behind("interactive", [("b", 0.0, holder_seconds)],
                                   priority="NORMAL", release_delay=0.2)
    assert cell.wait >= floor - 1e-9
    assert report["short_slowdown_mean_normal_floor"] == pytest.approx(1.0 + floor)
    assert report["short_slowdown_mean_floor"] == pytest.approx(1.0 + floor)


@pytest.mark.parametrize("policy", ["round-robin", "interactive"])
def test_the_fleets_floor_is_below_what_the_fleet_measures(policy):
    result = run(notebooks=16, gpus=1, hours=1.0, seed=3, tq=10.0, policy=policy)
    assert result["low_asked_behind_normal"] > 0
    assert 1.0 < result["short_slowdown_mean_low_floor"] <= result["short_slowdown_mean_low"]
    assert 1.0 < result["short_slowdown_mean_normal_floor"] <= result[
        "short_slowdown_mean_normal"]
    assert 1.0 < result["short_slowdown_mean_floor"] <= result["short_slowdown_mean"]
