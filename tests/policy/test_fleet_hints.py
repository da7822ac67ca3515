"""The fleet benchmark's reference on hinted estimates (``benchmarks.fleet.hints``): the
clairvoyant reference told estimates from length hints of stated quality.

Like the oracle it runs on the pure Python core: its replays run where ``KIWI_PURE_PYTHON`` is
set, which test_fleet_oracle.py's child pytest arranges for this file too.
"""

from __future__ import annotations

import math
import os

import pytest
from policy_helpers import make_scheduler

from benchmarks.fleet.cli import main
from benchmarks.fleet.hints import HINT_RUNS, PRIOR, HintModel, estimated_work
from benchmarks.fleet.runs import run
from benchmarks.fleet.seeds import KEY_RUNS
from benchmarks.fleet.workload import Cell
from nodeside import compiled
from nodeside.scheduler.core import Grant
from nodeside.testing import Replay

PURE = compiled.pure_asked(os.environ)
pure_only = pytest.mark.skipif(not PURE, reason="runs on the pure core (the child run in "
                                                "test_fleet_oracle.py)")


def cells(n: int) -> list[Cell]:
    return [Cell(f"nb{i % 5:02d}", "training", 0, start=17.0 * i, burst=0.5 + i) for i in range(n)]


def test_a_hint_is_the_cells_own_every_time_it_is_asked():
    model = HintModel(0.7, 0.3)
    assert [model.hint(1, c) for c in cells(50)] == [model.hint(1, c) for c in cells(50)]
    assert [model.hint(1, c) for c in cells(50)] != [model.hint(2, c) for c in cells(50)]


def test_a_lower_coverage_hints_a_subset_of_a_higher_ones_cells():
    hinted = {c.start for c in cells(200) if HintModel(0.7, 0.3).hint(3, c) is not None}
    fewer = {c.start for c in cells(200) if HintModel(0.4, 0.3).hint(3, c) is not None}
    assert fewer < hinted
    assert 0.55 < len(hinted) / 200 < 0.85 and 0.25 < len(fewer) / 200 < 0.55


def test_without_noise_a_hint_is_the_cells_length_and_without_coverage_there_is_none():
    assert all(HintModel(1.0, 0.0).hint(1, c) == c.burst for c in cells(20))
    assert all(HintModel(0.0, 0.5).hint(1, c) is None for c in cells(20))


def test_noise_spreads_hints_around_the_length_as_a_lognormal_of_that_sigma():
    ratios = [math.log(HintModel(1.0, 0.5).hint(7, c) / c.burst) for c in cells(2000)]
    mean = sum(ratios) / len(ratios)
    sigma = math.sqrt(sum((r - mean) ** 2 for r in ratios) / len(ratios))
    assert abs(mean) < 0.05 and 0.45 < sigma < 0.55


@pytest.mark.parametrize(("hint", "done", "expected"), [
    (10.0, 4.0, 6.0),  # the hint less the work done
    (None, 0.0, PRIOR),  # a fresh cell without a hint is a typical one
    (None, 2.0, PRIOR - 2.0),
    (None, 20.0, 20.0),  # past the prior: as long again
    (3.0, 5.0, 5.0),  # past its hint: as if it had none
])
def test_the_estimate_of_the_remaining_work(hint, done, expected):
    assert HintModel(0.5, 0.5).estimate(hint, done) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["hints:1.5:0", "hints:0.5:-1", "hints:x:y", "hints:"])
def test_a_malformed_hinted_policy_name_is_refused_with_its_form(text):
    with pytest.raises(ValueError, match="hints:0.7:0.3|coverage in"):
        HintModel.parse(text)


def test_a_hinted_policy_name_reads_back_as_its_model_and_other_names_are_not_hinted():
    assert HintModel.parse(HintModel(0.7, 0.3).policy) == HintModel(0.7, 0.3)
    assert HintModel.parse("interactive") is None and HintModel.parse("clairvoyant") is None
    assert all(HintModel.parse(policy) is not None for _, _, _, policy, _ in HINT_RUNS)


def test_the_estimate_follows_the_work_the_replay_has_done_of_the_cell():
    replay = Replay(make_scheduler({"tq": 30.0}))
    worker = replay.add("nb00")
    cell = Cell("nb00", "default", 0, start=0.0, burst=8.0)
    open_cells = {worker.id: cell}
    replay.burst(worker, 8.0, when=0.0)
    exact = estimated_work(replay, open_cells, 1, HintModel(1.0, 0.0))
    blind = estimated_work(replay, open_cells, 1, HintModel(0.0, 0.0))
    replay.run_until(3.0)
    assert exact(worker.id, 3.0) == pytest.approx(5.0)
    assert blind(worker.id, 3.0) == pytest.approx(PRIOR - 3.0)
    assert exact("nobody", 3.0) == PRIOR


@pure_only
def test_a_short_hinted_cell_goes_first_and_cuts_a_longer_holder_a_long_one_goes_last():
    """``holder`` works 5 s from 0; at 1 ``blind`` asks for 4 s with no cell on record (the
    estimate of a fresh cell without a hint: the prior, 6 s), at 2 ``short`` (hinted 1 s) and
    ``long`` (hinted 30 s). No memory to move: ``short`` cuts the holder (1 s < 3 s left),
    the holder goes on (3 s < 6 s), then ``blind``, then ``long``."""
    from benchmarks.fleet.hints import install_hinted

    replay = Replay(make_scheduler({"tq": 30.0, "policy": "interactive"}))
    plan = {"holder": (0.0, 5.0), "blind": (1.0, 4.0), "short": (2.0, 1.0), "long": (2.0, 30.0)}
    workers = {name: replay.add(name) for name in plan}
    open_cells = {w.id: Cell(name, "default", 0, *plan[name])
                  for name, w in workers.items() if name != "blind"}
    for name, (start, seconds) in plan.items():
        replay.burst(workers[name], seconds, when=start)
    install_hinted(replay, open_cells, 1, HintModel(1.0, 0.0))
    replay.run_until(100.0)
    names = {w.id: name for name, w in workers.items()}
    assert [names[a.client] for _, a in replay.actions if isinstance(a, Grant)] == [
        "holder", "short", "holder", "blind", "long"]


@pure_only
def test_exact_hints_on_every_cell_replay_the_clairvoyant_reference_to_the_last_figure():
    small = {"notebooks": 8, "gpus": 1, "hours": 0.5, "seed": 2, "tq": 10.0}
    exact = run(**small, policy=HintModel(1.0, 0.0).policy)
    oracle = run(**small, policy="clairvoyant")
    figures = [k for k in oracle if not k.startswith("_") and k not in ("policy", "wall_s",
                                                                        "simulated_seconds_"
                                                                        "per_wall_second")]
    assert {k: exact[k] for k in figures} == {k: oracle[k] for k in figures}


def test_the_seed_summary_carries_a_column_for_each_hinted_run(capsys):
    """Whatever core this process runs: the hinted runs run in pure worker processes."""
    main(["--seeds", "1", "--notebooks", "8", "--gpus", "1", "--hours", "0.25", "--jobs", "1",
          "--hints"])
    out = capsys.readouterr().out
    assert all(label in out for label, *_ in HINT_RUNS)
    assert out.count("of 1") == 2 * (len(KEY_RUNS) + len(HINT_RUNS))  # all, NORMAL notebooks'
