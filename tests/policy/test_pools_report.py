"""The pools report (status `pools` entries and `kiwictl pools`): shares, waiting clients, and
the reason a stuck pool is stuck."""

import pytest
from policy_helpers import SEED_POOLS, GiB, greedy, make_scheduler

from nodeside.model import Registration
from nodeside.scheduler.report import pool_reports
from nodeside.testing import Replay


def by_name(sched, now):
    return {r.name: r for r in pool_reports(sched, now)}


def test_report_lists_configured_pools_with_their_settings_and_share(seed_scheduler):
    replay = Replay(seed_scheduler())
    greedy(replay, "a", "training")
    greedy(replay, "b", "simulation")
    replay.run_until(100.0)
    reports = by_name(replay.scheduler, replay.now)
    assert list(reports) == ["training", "simulation"]
    training = reports["training"].as_status()
    for key in ("name", "guarantee", "weight", "maximum", "share", "clients"):
        assert key in training
    assert (training["guarantee"], training["weight"], training["maximum"]) == (0.3, 1, 0.7)
    assert training["share"] == pytest.approx(0.35, abs=0.03)
    assert training["clients"] == 1
    assert reports["simulation"].gpus[0].entitlement == pytest.approx(0.65)


def test_report_names_waiting_clients_in_queue_order():
    sched = make_scheduler({"tq": 1.0})
    holder, first, second = (sched.register(0.0, Registration(name=n))
                             for n in ("holder", "first", "second"))
    for client in (holder, first, second):
        sched.acquire(0.0, client.id)
    (default,) = pool_reports(sched, 0.5)
    assert default.waiting == ["first", "second"]
    assert default.holding == 1 and default.stuck is None


def test_a_pool_at_its_maximum_says_so():
    replay = Replay(make_scheduler({"tq": 1.0, "pools": SEED_POOLS}))
    greedy(replay, "a", "training")
    greedy(replay, "a2", "training")
    replay.run_until(60.0)
    # Find a moment where training waits at its cap (the GPU idles then).
    while replay.scheduler.gpus[0].holders:
        replay.run_until(replay.now + 0.05)
    stuck = by_name(replay.scheduler, replay.now)["training"].stuck
    assert stuck is not None and stuck.startswith("at its maximum")
    assert "0.7" in stuck


def test_a_pool_below_guarantee_with_preemption_off_says_why():
    pools = {"training": {"guarantee": 0.3, "weight": 1, "maximum": 0.7},
             "simulation": {"guarantee": 0.5}}
    sched = make_scheduler({"tq": 5.0, "pools": pools})
    low = sched.register(0.0, Registration(name="low", pool="training", priority="LOW"))
    waiting = sched.register(0.0, Registration(name="waiting", pool="simulation"))
    sched.acquire(0.0, low.id)
    sched.acquire(1.0, waiting.id)
    stuck = by_name(sched, 1.0)["simulation"].stuck
    assert "below its guarantee" in stuck and "preemption is off" in stuck
    assert "simulation lacks weight, maximum" in stuck


def test_a_pool_below_guarantee_behind_a_non_preemptible_holder_says_nothing_preemptible():
    sched = make_scheduler({"tq": 5.0, "pools": SEED_POOLS})
    a = sched.register(0.0, Registration(name="a", pool="training"))
    b = sched.register(0.0, Registration(name="b", pool="simulation"))
    sched.acquire(0.0, a.id)
    sched.acquire(1.0, b.id)
    assert "nothing preemptible" in by_name(sched, 1.0)["simulation"].stuck


def test_a_pool_whose_requests_are_low_is_told_they_never_preempt():
    sched = make_scheduler({"tq": 5.0, "pools": SEED_POOLS})
    a = sched.register(0.0, Registration(name="a", pool="training", priority="LOW"))
    b = sched.register(0.0, Registration(name="b", pool="simulation", priority="LOW"))
    sched.acquire(0.0, a.id)
    sched.acquire(1.0, b.id)
    assert "LOW (preemptible)" in by_name(sched, 1.0)["simulation"].stuck


def test_auto_mode_says_what_does_not_fit():
    sched = make_scheduler({"tq": 1.0, "mode": "auto"}, memory=16 * GiB)
    a = sched.register(0.0, Registration(name="a", working_set=10 * GiB))
    b = sched.register(0.0, Registration(name="b", working_set=8 * GiB))
    c = sched.register(0.0, Registration(name="c"))
    sched.acquire(0.0, a.id)
    sched.acquire(0.0, b.id)
    stuck = by_name(sched, 0.1)["default"].stuck
    assert "does not fit" in stuck and "needs 8.0 GiB" in stuck and "5.5 GiB free" in stuck
    sched.release(0.2, b.id)
    sched.acquire(0.3, c.id)
    assert "working set is unknown" in by_name(sched, 0.3)["default"].stuck


def test_pools_named_only_by_clients_are_reported_too():
    sched = make_scheduler({"pools": SEED_POOLS})
    sched.register(0.0, Registration(name="x", pool="research"))
    reports = by_name(sched, 0.0)
    assert reports["research"].guarantee == 0.0 and reports["research"].clients == 1


def test_no_pools_configured_reports_the_default_pool():
    (only,) = pool_reports(make_scheduler(), 0.0)
    assert only.name == "default" and only.guarantee == 1.0
