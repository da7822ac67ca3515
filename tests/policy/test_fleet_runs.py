"""The fleet's runs (``benchmarks.fleet.runs``): switching loss, work done side by side at the
measured ``co_run``, and the pools' shares in contention, replayed deterministically."""

from __future__ import annotations

import json

import pytest
from policy_helpers import GiB, make_scheduler

from benchmarks.fleet.cli import main
from benchmarks.fleet.runs import busy_seconds, run
from benchmarks.fleet.shares import Contention
from benchmarks.fleet.workload import Workload, build_fleet
from nodeside.testing import Replay

GPU = 40 * GiB


@pytest.mark.slow
def test_the_fleet_reports_switching_loss_deterministically():
    first = run(notebooks=16, gpus=1, hours=1.0, seed=3, tq=5.0, link="gen4")
    again = run(notebooks=16, gpus=1, hours=1.0, seed=3, tq=5.0, link="gen4")
    faster = run(notebooks=16, gpus=1, hours=1.0, seed=3, tq=5.0, link="gen5")
    free = run(notebooks=16, gpus=1, hours=1.0, seed=3, tq=5.0, link="none")
    figures = ("switching_loss", "utilization", "short_slowdown_mean", "long_slowdown_mean")
    assert [first[k] for k in figures] == [again[k] for k in figures]
    assert first["switching_loss"] > faster["switching_loss"] > 0.0
    assert free["switching_loss"] == 0.0


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
    """``--co-run`` feeds ``benchmarks.shim.gpu_corun``'s figure back into the fleet: mode auto's
    runs move with it, mode on's (one holder at a time) read the same."""
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
    with pytest.raises(SystemExit):
        main(["--co-run", "1.5"])
