"""The fleet over many seeds (``benchmarks.fleet.seeds``): real replays in worker processes."""

from __future__ import annotations

import math

import pytest

from benchmarks.fleet.cli import main
from benchmarks.fleet.runs import run
from benchmarks.fleet.seeds import KEY_RUNS, parse_seeds, replay_seeds, summary


@pytest.mark.parametrize(("text", "seeds"), [("1-3", [1, 2, 3]), ("4", [4]),
                                             ("1-2,7,2", [1, 2, 7])])
def test_seeds_are_read_as_ranges_and_lists(text, seeds):
    assert parse_seeds(text) == seeds


@pytest.mark.parametrize("text", ["", "a-3", "5-2", "1,,2"])
def test_a_malformed_seed_list_is_refused_with_the_expected_form(text):
    with pytest.raises(ValueError, match="seeds"):
        parse_seeds(text)


def test_every_key_run_replays_every_seed_and_the_summary_spans_them():
    results = replay_seeds([3, 4], notebooks=8, gpus=1, hours=0.5, jobs=2)
    assert set(results) == set(KEY_RUNS)
    assert all(set(by_seed) == {3, 4} for by_seed in results.values())
    # The seeds are different traces: a summary over both is not one seed's figure twice.
    rr = results[KEY_RUNS[0]]
    assert rr[3]["cells"] != rr[4]["cells"]
    table = summary(results)
    assert "2 seeds (3-4)" in table
    assert "| long cells against round robin TQ 30 s | 1.000x (1.000x-1.000x) |" in table
    assert table.count("of 2") == 2 * len(KEY_RUNS)  # all short cells, NORMAL notebooks'


def test_the_summary_counts_the_seeds_meeting_the_target_for_all_and_for_normal_short_cells():
    """Seed 1: all short cells 2.5x, NORMAL 1.8x; seed 2: 1.9x and 1.5x, but long cells 20%
    slower than round robin TQ 30 s's."""
    def figures(short, normal, long):
        return {"short_slowdown_mean": short, "short_slowdown_mean_normal": normal,
                "short_slowdown_mean_low": 5.0, "short_slowdown_mean_floor_any_policy": 1.2,
                "long_slowdown_mean": long, "long_slowdown_mean_normal": long,
                "long_slowdown_mean_low": long, "switching_loss": 0.01}
    base = {1: figures(9.0, 8.0, 2.0), 2: figures(9.0, 8.0, 2.0)}
    tried = {1: figures(2.5, 1.8, 2.1), 2: figures(1.9, 1.5, 2.4)}
    table = summary({KEY_RUNS[0]: base, "tried": tried})
    rows = [line for line in table.splitlines() if "seeds meeting the target" in line]
    assert rows[0].startswith("| seeds meeting") and rows[0].endswith("| 0 of 2 | 0 of 2 |")
    assert rows[1].startswith("| NORMAL notebooks' short cells: seeds meeting")
    assert rows[1].endswith("| 0 of 2 | 1 of 2 |")


def test_the_command_line_prints_the_summary(capsys):
    main(["--seeds", "1-2", "--notebooks", "8", "--gpus", "1", "--hours", "0.25", "--jobs", "1"])
    out = capsys.readouterr().out
    assert out.startswith("2 seeds (1-2)") and "interactive, TQ 10 s" in out


def test_a_fleet_without_low_notebooks_reports_no_figure_for_them_rather_than_failing():
    result = run(notebooks=6, gpus=1, hours=0.25, seed=1)
    assert math.isnan(result["short_slowdown_mean_low"])
    assert result["short_slowdown_mean_normal"] >= 1.0
