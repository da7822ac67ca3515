"""Holders side by side share the GPU's time in the simulator (``Replay(co_run=...)``).

Kernels of different processes on one GPU take turns on it: two compute-bound cells side by side
each run at about half speed. Without ``co_run`` the replay runs them at full speed, the model
that flattered mode auto; with it, k working holders each do ``co_run / k`` of a second's work
per second, and the rates change whenever a holder starts working or leaves.
"""

from __future__ import annotations

import json

import pytest
from policy_helpers import GiB, make_scheduler

from benchmarks.fleet import busy_seconds
from benchmarks.fleet_shares import Contention
from benchmarks.fleet_workload import Workload, build_fleet
from nodeside.scheduler.replay import Replay
from nodeside.scheduler.switching import SwitchingModel

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


def fleet_work_and_busy_time(workload: Workload) -> tuple[float, float, int]:
    """Mode auto's fleet on one GPU for two hours: the GPU work of the cells completed, the
    seconds in which some holder worked, and the most holders side by side."""
    replay, cells, _ = build_fleet(8, 1, 3, workload, "auto", 40 * GiB, 30.0)
    most = [0]
    replay.observers.append(
        lambda r, _: most.__setitem__(0, max(most[0], len(r.scheduler.gpus[0].holders))))
    end = 2 * 3600.0
    replay.run_until(end)
    done = sum(c.burst for c in cells if c.end is not None and c.end <= end)
    return done, busy_seconds(replay, end), most[0]


def test_in_the_fleet_no_gpu_does_more_than_a_second_of_work_per_second():
    done, busy, most = fleet_work_and_busy_time(Workload())
    assert most >= 3  # the fleet did run holders side by side
    assert done <= busy + 1e-6
    # The model it replaces did more work than there was time for.
    done, busy, _ = fleet_work_and_busy_time(Workload(co_run=None))
    assert done > 1.05 * busy


def test_the_fleets_pool_shares_split_the_gpus_time_between_holders_side_by_side():
    pools = {"training": {"guarantee": 0.3, "weight": 1, "maximum": -1},
             "simulation": {"guarantee": 0.5, "weight": 3, "maximum": -1}}
    replay = Replay(make_scheduler({"tq": 1000.0, "mode": "auto", "pools": pools}, memory=GPU),
                    co_run=1.0)
    contention = Contention(min_length=10.0)
    replay.observers.append(contention.observe)
    first, other = replay.add("a", pool="training", working_set=GiB), \
        replay.add("s", pool="simulation", working_set=GiB)
    second = replay.add("b", pool="training", working_set=GiB)
    replay.burst(first, 1e6, when=0.0)
    replay.burst(other, 1e6, when=0.0)
    replay.burst(second, 1e6, when=50.0)
    replay.run_until(100.0)
    contention.finish(100.0)  # charges the 50 s after the last event too
    # Two holders for 50 s, then three: a half each, then a third each, of 100 s of GPU time.
    assert contention.sustained == pytest.approx(100.0)
    assert contention.held == pytest.approx({"training": 25.0 + 100 / 3,
                                             "simulation": 25.0 + 50 / 3})


def test_the_fleet_takes_the_measured_co_run_and_only_side_by_side_runs_move(tmp_path, capsys):
    """``--co-run`` feeds ``benchmarks.gpu_corun``'s figure back into the fleet: mode auto's
    runs move with it, mode on's (one holder at a time) read the same."""
    from benchmarks.fleet import main

    figures = {}
    for co_run in ("1.0", "0.5"):
        out = tmp_path / f"{co_run}.json"
        main(["--seeds", "1", "--notebooks", "8", "--gpus", "1", "--hours", "0.5", "--jobs", "1",
              "--co-run", co_run, "--json", str(out)])
        figures[co_run] = json.loads(out.read_text())
    assert "0.5 of the GPU's work done together" in capsys.readouterr().out
    timing = {"wall_s", "simulated_seconds_per_wall_second"}  # the benchmark's own speed

    def replayed(run: dict) -> dict:
        return {k: v for k, v in run.items() if k not in timing}

    for label, by_seed in figures["1.0"].items():
        same = replayed(by_seed["1"]) == replayed(figures["0.5"][label]["1"])
        assert same == (not label.startswith("auto")), label


def test_a_co_run_outside_zero_to_one_is_refused():
    from benchmarks.fleet import main

    with pytest.raises(SystemExit):
        main(["--co-run", "1.5"])
