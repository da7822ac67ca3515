"""The host budget and the disk tier in the fleet's memory model (``benchmarks.fleet.tiers``):
the daemon's rules (nodeside/scheduler/tiers.py) on the replay's resident working sets, and the
refused waiter as the shim answers it (``nodeside.testing.Replay``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_helpers import GiB, make_scheduler

from benchmarks.fleet.cli import main
from benchmarks.fleet.runs import run
from benchmarks.fleet.tier_sweep import carried
from benchmarks.fleet.tiers import HostTiers, TierSetting, default_budget
from nodeside.testing import Replay

LINK = 10 * GiB  # bytes per second: 10 GiB take one second
READ, WRITE = 2 * GiB, 1 * GiB  # a slow drive, to tell its time from the link's


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def node(budget: int | None, disk: bool = True, spill_after: float = 600.0,
         capacity: int = 40 * GiB) -> tuple[HostTiers, Clock]:
    clock = Clock()
    model = HostTiers(capacity, LINK, tiers=TierSetting(budget, disk, READ, WRITE, spill_after))
    model.clock = clock
    return model, clock


def evicted(model: HostTiers, clock: Clock, *names: str, size: int = 20 * GiB) -> None:
    """Each of ``names`` used the GPU and was moved out for the next: all but the last end in
    host memory (the GPU holds two of 20 GiB)."""
    for name in (*names, "filler-1", "filler-2"):
        assert model.grant_cost(0, name, size) is not None
        model.used(0, name)
        clock.now += 1.0


# -- the budget ----------------------------------------------------------------------------


def test_the_default_budget_is_the_daemons_host_less_its_margin():
    assert default_budget(256 * GiB) == 256 * GiB - int(256 * GiB * 0.1)
    assert default_budget(16 * GiB) == 12 * GiB  # the 4 GiB floor


def test_an_eviction_the_budget_cannot_hold_is_refused_without_the_disk_tier():
    model, clock = node(budget=30 * GiB, disk=False)
    evicted(model, clock, "a")  # a is in host memory: 20 of 30 GiB
    assert model.grant_cost(0, "b", 20 * GiB) is None  # filler-1 would need 20 more
    assert model.counts["refusals"] == 1
    assert "nothing more to spill to disk" in model.reasons[0]
    assert model.host_use() == 20 * GiB


def test_an_eviction_the_budget_cannot_hold_waits_for_the_idle_to_spill():
    model, clock = node(budget=30 * GiB)
    evicted(model, clock, "a")
    now = clock.now
    seconds = model.grant_cost(0, "b", 20 * GiB)
    # a's 20 GiB written to disk first, then filler-1 out over the link.
    assert seconds == pytest.approx(20 * GiB / WRITE + 20 * GiB / LINK)
    assert model.disk == {"a": 20 * GiB} and model.counts["spills_budget"] == 1
    assert model.host_use() == 20 * GiB and clock.now == now


def test_a_kernel_with_an_intent_standing_is_not_spilled_for_the_budget():
    model, clock = node(budget=30 * GiB)
    evicted(model, clock, "a")
    model.intent("a")  # its notebook ran a cell (a CPU one: it was not granted)
    assert model.grant_cost(0, "b", 20 * GiB) is None
    assert "a" in model.host and not model.spilling


def test_a_working_set_idle_past_spill_after_spills_and_frees_its_host_memory():
    model, clock = node(budget=None, spill_after=600.0)
    evicted(model, clock, "a")
    since = model.since["a"]
    clock.now = since + 599.0
    model.intent("nobody")  # anything that brings the model up to now
    assert "a" in model.host and not model.spilling
    clock.now = since + 600.0 + 20 * GiB / WRITE
    model.intent("nobody")
    assert model.disk == {"a": 20 * GiB} and "a" not in model.host
    assert model.counts["spills_idle"] == 1


def test_a_restore_from_disk_streams_at_the_slower_of_drive_and_link():
    model, clock = node(budget=None, spill_after=1.0)
    evicted(model, clock, "a")
    clock.now += 3600.0
    model.intent("nobody")
    assert "a" in model.disk
    # filler-2 goes out over the link, then a streams back at the drive's read rate.
    assert model.grant_cost(0, "a", 20 * GiB) == pytest.approx(
        20 * GiB / LINK + 20 * GiB / READ)
    assert model.counts["restores_from_disk"] == 1 and not model.disk


def test_an_intent_brings_memory_from_disk_to_host_before_the_grant():
    model, clock = node(budget=None, spill_after=1.0)
    evicted(model, clock, "a")
    clock.now += 3600.0
    model.intent("a")  # the execute request
    assert model.counts["fetches"] == 1
    clock.now += 20 * GiB / READ  # the fetch is done before the cell's grant
    assert model.grant_cost(0, "a", 20 * GiB) == pytest.approx(40 * GiB / LINK)
    assert model.counts["restores_from_disk"] == 0


def test_an_intent_gives_up_a_spill_under_way():
    model, clock = node(budget=None, spill_after=1.0)
    evicted(model, clock, "a")
    clock.now = model.since["a"] + 2.0  # written by since + 1 + 20 s
    model.intent("a")
    assert "a" in model.host and not model.spilling
    assert model.counts["spills_given_up"] == 1


# -- the rules under any sequence ----------------------------------------------------------

STEPS = st.lists(st.tuples(st.sampled_from(["grant", "intent", "wait"]),
                           st.integers(0, 5), st.integers(1, 30), st.floats(0.0, 900.0)),
                 max_size=60)


@settings(max_examples=150, deadline=None)
@given(steps=STEPS, budget=st.integers(0, 80), disk=st.booleans(),
       spill_after=st.sampled_from([0.0, 60.0, 600.0]))
def test_host_use_never_exceeds_the_budget_and_only_idle_evicted_memory_spills(
        steps, budget, disk, spill_after):
    model, clock = node(budget * GiB, disk, spill_after)
    holding: str | None = None
    for kind, who, size, pause in steps:
        name = f"k{who}"
        if kind == "grant" and name != holding:
            if holding is not None:
                model.used(0, holding)
            seconds = model.grant_cost(0, name, size * GiB)
            if seconds is None:
                # Refused only once all that could spill is spilling, and still short.
                assert not disk or not model._spillable({name})
                holding = None
            else:
                holding = name
        elif kind == "intent":
            model.intent(name)
        clock.now += pause
        model._advance(clock.now)
        assert model.host_use() <= budget * GiB
        assert model.peak_host <= budget * GiB
        on_gpu = set(model.gpus[0].resident) if model.gpus else set()
        # Spilled or spilling: evicted (not on the GPU) and not the holder.
        assert not (set(model.spilling) | set(model.disk)) & on_gpu
        assert holding not in model.spilling and holding not in model.disk
        assert not model.disk or disk


# -- the refused waiter, as the shim answers ------------------------------------------------


class Refuses:
    """Memory moves that refuse one client's grants and cost nothing for the others'."""

    capacity = 40 * GiB

    def __init__(self, refused: str) -> None:
        self.refused = refused

    def grant_cost(self, gpu, client, working_set, keep=()):
        return None if client == self.refused else 0.0

    def used(self, gpu, client):
        pass

    def forget(self, client):
        pass


def test_a_refused_waiter_gives_the_gpu_back_asks_again_and_fails_after_the_room_timeout():
    replay = Replay(make_scheduler(), switching=None)
    stuck = replay.add("stuck", working_set=10 * GiB)
    other = replay.add("other", working_set=10 * GiB)
    replay.switching = Refuses(stuck.id)
    failed_at: list[float] = []
    stuck.on_done = lambda worker, now: failed_at.append(now)
    replay.burst(stuck, 5.0)
    replay.burst(other, 5.0, when=1.0)
    replay.run_until(400.0)
    assert other.bursts_done == 1 and other.waits == [0.0]  # the GPU was not kept from it
    assert stuck.failed == 1 and stuck.remaining == 0.0 and stuck.bursts_done == 0
    # Refused at 0, asked again at 1 behind the other's cell, refused at its end (6), then
    # 2, 4, 8 and 16 s apart: at 8, 12, 20, 36 ... 308, past 300 s of refusals.
    assert failed_at == [pytest.approx(308.0)]
    assert stuck.refusals == 4 + 18 + 1


# -- the fleet -----------------------------------------------------------------------------


def test_a_fleet_with_tiers_reports_its_host_and_disk_deterministically():
    tiers = TierSetting(24 * GiB, disk=True, spill_after=300.0)
    first = run(12, 1, 0.5, 3, "auto", 40 * GiB, 30.0, "round-robin", "gen5", tiers=tiers)
    again = run(12, 1, 0.5, 3, "auto", 40 * GiB, 30.0, "round-robin", "gen5", tiers=tiers)
    assert first["tiers"] == again["tiers"]
    assert first["short_slowdown_mean"] == again["short_slowdown_mean"]
    assert first["tiers"]["peak_host_gib"] <= 24.0
    assert first["tiers"]["spills_idle"] + first["tiers"]["spills_budget"] > 0


def test_the_tier_sweep_prints_what_each_node_carries(capsys):
    main(["--tiers", "--gpus", "1", "--host-gib", "32", "--gpu-gib", "40", "--per-gpu", "2",
          "--hours", "0.1", "--jobs", "1"])
    out = capsys.readouterr().out
    assert "| host RAM only | short cells' mean slowdown |" in out
    assert "| host + disk | seeds meeting the targets |" in out
    assert "Carried at the targets" in out


def figures(short: float, long: float = 1.0, failed: int = 0) -> dict:
    return {"short_slowdown_mean": short, "long_slowdown_mean": long,
            "tiers": {"failed_cells": failed}}


def test_a_count_is_carried_on_the_seeds_mean_and_only_while_no_cell_failed():
    base = {n: {1: figures(9.0), 2: figures(9.0)} for n in (4, 6, 8)}
    results = {"base": base,
               # One seed over 2x, the mean within: carried; then a failed cell: not.
               "disk": {4: {1: figures(1.2), 2: figures(2.6)}, 6: {1: figures(1.5),
                        2: figures(1.5, failed=1)}, 8: {1: figures(1.1), 2: figures(1.1)}},
               # The long cells' mean past 1.10x round robin's at 6: 4 is the most.
               "host": {4: {1: figures(1.2), 2: figures(1.2)}, 6: {1: figures(1.2, 1.3),
                        2: figures(1.2, 1.0)}, 8: {1: figures(1.1), 2: figures(1.1)}}}
    assert carried(results, "disk") == 4
    assert carried(results, "host") == 4
    results["host"][6][1] = figures(1.2, 1.1)
    assert carried(results, "host") == 8
