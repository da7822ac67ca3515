"""Where the fleet's short cells waited (``benchmarks.fleet.explain``, ``--explain``): every
second put down to one cause, the causes adding up to what the fleet measures."""

from __future__ import annotations

import pytest
from policy_helpers import make_scheduler

from benchmarks.fleet.explain import CAUSES, Explain
from benchmarks.fleet.report import explain_table
from benchmarks.fleet.runs import run
from benchmarks.fleet.workload import Cell
from nodeside.testing import Replay


@pytest.mark.parametrize("policy", ["round-robin", "interactive"])
def test_the_fleet_explains_where_short_cells_waiting_went(policy):
    """``--explain``: every second short cells waited is put down to one cause, and the causes
    add up to the waiting the fleet measures (cells still open at the end aside)."""
    result = run(notebooks=12, gpus=1, hours=1.0, seed=3, tq=10.0, policy=policy,
                 explain=True)
    explained = result["explain"]
    causes = explained["short_wait_seconds"]
    assert set(causes) <= set(CAUSES)
    assert sum(causes.values()) == pytest.approx(explained["short_wait_total"], rel=0.1)
    assert causes.get("own memory moves", 0.0) > 0.0  # the link is Gen4: memory moves
    if policy == "interactive":
        assert explained["short_asked"] > 0 and explained["cut_short"] > 0
    else:
        assert explained["cut_short"] == 0  # round robin never cuts a quantum short
        assert "counted heavy for earlier cells" not in causes
    # In the metric's own units the causes add up exactly: each second a finished short cell
    # waited, over its burst, is its slowdown less one.
    added = explained["short_slowdown_by_cause"]
    assert set(added) <= set(CAUSES)
    assert 1.0 + sum(added.values()) == pytest.approx(result["short_slowdown_mean"], rel=1e-6)
    table = explain_table([{**result, "label": policy}])
    assert "holder's remaining quantum" in table and policy in table


def test_in_mode_auto_the_explanation_counts_the_time_lost_sharing_the_gpu():
    """Side by side, a short cell works slower than alone: that time is waiting too, put down
    to sharing, and the causes still add up to the measured slowdown exactly."""
    result = run(notebooks=12, gpus=1, hours=1.0, seed=3, mode="auto", tq=30.0, explain=True)
    explained = result["explain"]
    assert explained["short_wait_seconds"]["side by side: sharing the GPU"] > 0.0
    added = explained["short_slowdown_by_cause"]
    assert 1.0 + sum(added.values()) == pytest.approx(result["short_slowdown_mean"], rel=1e-6)


def test_a_short_cell_of_a_pool_at_its_maximum_waits_for_the_maximum_not_a_holder():
    """Training (maximum 0.7) fills its share with a long run; its next short cell then waits
    with the GPU idle, and the breakdown says why (it once read "holder's remaining quantum")."""
    replay = Replay(make_scheduler({"tq": 1.0, "pools": {
        "training": {"guarantee": 0.3, "weight": 1, "maximum": 0.7},
        "simulation": {"guarantee": 0.5, "weight": 3, "maximum": -1}}}))
    long_run = replay.add("long", pool="training")
    short = replay.add("short", pool="training")
    other = replay.add("other", pool="simulation")
    cell = Cell("short", "training", 0, start=60.0, burst=0.5)
    open_cells = {short.id: cell}
    explain = Explain(10.0, open_cells)
    replay.observers.append(explain.observe)
    replay.burst(other, 1.0, when=0.0)
    replay.burst(long_run, 59.0, when=1.0)
    replay.burst(short, 0.5, when=60.0)

    def done(_: object, now: float) -> None:
        cell.end = now
    short.on_done = done
    replay.run_until(200.0)
    assert cell.end is not None and cell.wait > 1.0
    explain.observe(replay, [])
    causes = explain.report(cell.wait, [cell])["short_wait_seconds"]
    assert causes["pool at its maximum"] == pytest.approx(cell.wait)
