"""Switching costs in the simulator: a handoff that must move memory costs GPU time nobody uses.

The replay runs the real scheduler core; ``SwitchingModel`` says how long each grant spends
moving working sets over the host link before the new holder can work.
"""

from __future__ import annotations

import pytest
from policy_helpers import GiB, make_scheduler

from benchmarks.fleet import Cell, run
from benchmarks.fleet_explain import CAUSES, Explain
from benchmarks.fleet_report import explain_table
from nodeside.scheduler.replay import Replay
from nodeside.scheduler.switching import Residency, SwitchingModel

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
