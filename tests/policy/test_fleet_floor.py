"""The fleet benchmark's floor under short cells' slowdown that the priority rules impose
(``benchmarks.fleet.bound``), on the real scheduler core."""

from __future__ import annotations

import pytest
from policy_helpers import make_scheduler

from benchmarks.fleet.bound import LowFloor, higher_priority_backlog, restores
from benchmarks.fleet.runs import run
from benchmarks.fleet.switching import SwitchingModel
from benchmarks.fleet.workload import Cell
from nodeside.testing import Replay

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


def test_the_fleets_floor_for_any_policy_is_below_this_runs_floor():
    result = run(notebooks=16, gpus=1, hours=1.0, seed=3, tq=10.0, policy="interactive")
    for part in ("_low", "_normal", ""):
        any_policy = result[f"short_slowdown_mean{part}_floor_any_policy"]
        assert 1.0 < any_policy <= result[f"short_slowdown_mean{part}_floor"] + 1e-12
    assert result["short_restores"] > 0


def cells_of(*specs: tuple[str, str, str, float, float, float | None]) -> list[Cell]:
    """Cells from (notebook, pool, priority, start, burst, end) on GPU 0."""
    return [Cell(name, pool, 0, start, burst, end, priority)
            for name, pool, priority, start, burst, end in specs]


def test_a_low_cell_waits_for_its_pools_normal_backlog_whatever_the_policy():
    """a's NORMAL work: 7 s at 0 and 5 s at 0.5, so a server doing nothing else has 11 s left
    at 1; b's NORMAL work and a's other LOW work are not ahead of a LOW cell of pool a."""
    cells = cells_of(("n0", "a", "NORMAL", 0.0, 7.0, None), ("n1", "a", "NORMAL", 0.5, 5.0, None),
                     ("m0", "b", "NORMAL", 0.7, 50.0, None), ("l0", "a", "LOW", 0.8, 30.0, None),
                     ("l1", "a", "LOW", 1.0, 1.0, None), ("n2", "a", "NORMAL", 20.0, 1.0, None),
                     ("l2", "a", "LOW", 30.0, 1.0, None))
    backlog = higher_priority_backlog(cells)
    assert backlog[id(cells[4])] == pytest.approx(11.0)
    assert backlog[id(cells[6])] == 0.0  # all of it done by 13, and n2's by 21
    assert backlog[id(cells[0])] == 0.0 and backlog[id(cells[2])] == 0.0  # nothing above NORMAL


GiB = 1024**3


def replay_with_memory(sizes: dict[str, int]) -> Replay:
    replay = Replay(make_scheduler({"tq": 30.0}),
                    switching=SwitchingModel(10 * GiB, bandwidth=GiB))
    for name, size in sizes.items():
        replay.add(name, working_set=size)
    return replay


@pytest.mark.parametrize(("other_size", "other_cell", "restored"), [
    (5 * GiB, (2.0, 1.0, 3.0), 6.0),     # granted in between, and the two do not fit
    (4 * GiB, (2.0, 1.0, 3.0), None),    # they fit together: nothing had to move
    (5 * GiB, (0.5, 1.0, 3.0), None),    # began before x's cell ended: maybe served at once
    (5 * GiB, (2.0, 9.0, 11.0), None),   # still going when x asks again
    (5 * GiB, (2.0, 1.0, None), None),   # never finished
])
def test_a_cells_memory_comes_back_when_another_cell_must_have_moved_it_out(
        other_size, other_cell, restored):
    """x (6 GiB of a 10 GiB room) runs a cell over [0, 1] and asks again at 10; y's cell
    (start, burst, end) may have evicted it in between. The link moves 1 GiB a second."""
    replay = replay_with_memory({"x": 6 * GiB, "y": other_size})
    start, burst, end = other_cell
    cells = cells_of(("x", "a", "NORMAL", 0.0, 1.0, 1.0), ("y", "a", "NORMAL", start, burst, end),
                     ("x", "a", "NORMAL", 10.0, 1.0, None))
    seconds = restores(replay, cells)
    assert seconds.get(id(cells[2])) == (None if restored is None else pytest.approx(restored))
    assert id(cells[0]) not in seconds  # a notebook's first cell has nothing on host
