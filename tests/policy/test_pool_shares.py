"""Shares over time: pools contending converge on their entitlements, caps hold, and within a
pool HIGH goes before NORMAL before LOW, then request order, round robin."""

import pytest
from policy_helpers import SEED_POOLS, greedy, make_scheduler

from nodeside.limits import MAX_SHARE_INTERVALS
from nodeside.model import Registration
from nodeside.scheduler.core import Drop, Grant
from nodeside.scheduler.pools import ShareMeter
from nodeside.testing import Replay


def test_seed_pools_contending_converge_within_003_inside_100_quanta(seed_scheduler):
    replay = Replay(seed_scheduler(tq=1.0))
    greedy(replay, "a", "training")
    greedy(replay, "b", "simulation")
    replay.run_until(100.0)
    window = replay.scheduler.shares(0, replay.now)
    assert window["training"] == pytest.approx(0.35, abs=0.03)
    assert window["simulation"] == pytest.approx(0.65, abs=0.03)
    # And not only at the end: the last half of the run has the same split.
    late = replay.shares_between(50.0, 100.0)
    assert late["training"] == pytest.approx(0.35, abs=0.03)
    assert late["simulation"] == pytest.approx(0.65, abs=0.03)


def test_shares_hold_with_several_clients_per_pool(seed_scheduler):
    replay = Replay(seed_scheduler(tq=1.0))
    for i in range(3):
        greedy(replay, f"t{i}", "training")
    greedy(replay, "s0", "simulation")
    replay.run_until(100.0)
    shares = replay.shares_between(0.0, 100.0)
    assert shares["training"] == pytest.approx(0.35, abs=0.03)


def test_a_pool_alone_is_capped_at_its_maximum(seed_scheduler):
    replay = Replay(seed_scheduler(tq=1.0))
    greedy(replay, "a", "training")
    greedy(replay, "a2", "training")
    replay.run_until(300.0)
    used = replay.gpu_seconds_by_pool(100.0, 300.0)["training"] / 200.0
    assert used == pytest.approx(0.7, abs=0.03)
    assert used <= 0.7 + 0.02  # one quantum over the window at most
    reasons = {a.reason for _, a in replay.actions if isinstance(a, Drop)}
    assert "maximum" in reasons


def test_a_pool_without_maximum_alone_keeps_the_gpu_without_drops():
    replay = Replay(make_scheduler({"tq": 1.0, "pools": SEED_POOLS}))
    greedy(replay, "b", "simulation")
    replay.run_until(50.0)
    assert replay.gpu_seconds_by_pool(0.0, 50.0)["simulation"] == pytest.approx(50.0)
    assert not [a for _, a in replay.actions if isinstance(a, Drop)]


def test_within_a_pool_high_before_normal_before_low():
    sched = make_scheduler({"tq": 1.0})
    holder = sched.register(0.0, Registration(name="holder"))
    low = sched.register(0.0, Registration(name="low", priority="LOW"))
    normal = sched.register(0.0, Registration(name="normal", priority="NORMAL"))
    high = sched.register(0.0, Registration(name="high", priority="HIGH"))
    sched.acquire(0.0, holder.id)
    for client in (low, normal, high):  # asked in the reverse of their priority
        sched.acquire(0.1, client.id)
    assert [c.id for c in sched.queue(0, 0.2)] == [high.id, normal.id, low.id]
    order = []
    now = 0.2
    current = holder.id
    for _ in range(3):
        now += 1.0
        sched.tick(now)
        granted = [a.client for a in sched.release(now, current) if isinstance(a, Grant)]
        order += granted
        current = granted[0]
    assert order == [high.id, normal.id, low.id]


def test_within_a_level_request_order():
    sched = make_scheduler({"tq": 1.0})
    holder, first, second = (sched.register(0.0, Registration(name=n))
                             for n in ("h", "first", "second"))
    sched.acquire(0.0, holder.id)
    sched.acquire(0.2, second.id)
    sched.acquire(0.1, first.id)  # the later call, but clients are ordered by request
    assert [c.id for c in sched.queue(0, 0.3)] == [second.id, first.id]


def test_greedy_clients_of_one_pool_take_turns_round_robin():
    replay = Replay(make_scheduler({"tq": 1.0}))
    ids = [greedy(replay, name) for name in ("a", "b", "c")]
    replay.run_until(9.5)
    grants = [a.client for _, a in replay.actions if isinstance(a, Grant)]
    assert grants[:9] == ids * 3


def test_a_pool_held_at_its_maximum_is_served_again_once_its_share_falls():
    # Both pools capped at 0.5: the GPU idles while both wait, and no event will come. The
    # core must still ask to be woken when a share has fallen below its cap.
    pools = {"p0": {"guarantee": 0.2, "weight": 1, "maximum": 0.5},
             "p1": {"guarantee": 0.0, "weight": 1, "maximum": 0.5}}
    replay = Replay(make_scheduler({"tq": 1.0, "pools": pools}))
    greedy(replay, "a", "p0")
    greedy(replay, "b", "p1")
    # Something happens every 0.1 s that changes nothing (a panel polling status, say): the
    # shell asks for the next deadline after each event, and the wake-up must survive that.
    for step in range(3000):
        replay.call(lambda now: [], when=step * 0.1)
    replay.run_until(300.0)
    used = replay.gpu_seconds_by_pool(100.0, 300.0)
    assert used["p0"] / 200 == pytest.approx(0.5, abs=0.03)
    assert used["p1"] / 200 == pytest.approx(0.5, abs=0.03)


def test_the_queue_shows_the_client_a_drop_was_sent_for_as_next():
    sched = make_scheduler({"tq": 1.0, "pools": SEED_POOLS})
    holder = sched.register(0.0, Registration(name="holder", pool="simulation"))
    first = sched.register(0.0, Registration(name="first", pool="simulation"))
    sched.acquire(0.0, holder.id)
    sched.acquire(0.1, first.id)
    sched.tick(1.0)  # quantum over: the holder is asked to drop for `first`
    late = sched.register(1.1, Registration(name="late", pool="simulation", priority="HIGH"))
    sched.acquire(1.1, late.id)
    assert [c.name for c in sched.queue(0, 1.2)] == ["first", "late"]


def test_share_history_stays_bounded_over_100000_holds_with_no_status_reader():
    # Issue 11.6: 100,000 holds with nobody asking for shares kept 100,000 intervals. (No
    # maximum, so no request reads the shares either: only closing holds can trim.)
    pools = {"training": {"guarantee": 0.3, "weight": 1, "maximum": -1},
             "simulation": {"guarantee": 0.5, "weight": 3, "maximum": -1}}
    sched = make_scheduler({"tq": 30.0, "pools": pools})
    a = sched.register(0.0, Registration(name="a", pool="training"))
    b = sched.register(0.0, Registration(name="b", pool="simulation", priority="LOW"))
    now = 0.0
    for _ in range(50_000):  # two holds a round, alternating pools: nothing is back to back
        for client in (a, b):
            sched.acquire(now, client.id)
            now += 0.001
            sched.release(now, client.id)
            now += 0.001
    assert len(sched.gpus[0].meter) <= MAX_SHARE_INTERVALS


def test_share_history_is_trimmed_as_holds_close():
    sched = make_scheduler({"tq": 1.0, "window": 20.0})
    a = sched.register(0.0, Registration(name="a"))
    for n in range(1000):  # a 0.5 s hold every second, for 1000 s
        sched.acquire(float(n), a.id)
        sched.release(n + 0.5, a.id)
    assert len(sched.gpus[0].meter) <= 21
    assert sched.shares(0, 1000.0)["default"] == pytest.approx(0.5, abs=0.03)


def test_back_to_back_holds_of_one_pool_are_one_interval_and_shares_stay_exact():
    meter = ShareMeter(window=100.0, started=0.0)
    for n in range(10):
        meter.open(n, "p", float(n))
        meter.close(n, n + 1.0)
    assert len(meter) == 1
    assert meter.shares(10.0, ["p"])["p"] == pytest.approx(1.0)
    assert meter.shares(100.0, ["p"])["p"] == pytest.approx(0.1)


def test_holds_folded_past_the_bound_keep_their_gpu_seconds():
    meter = ShareMeter(window=1000.0, started=0.0, max_intervals=4)
    exact = ShareMeter(window=1000.0, started=0.0, max_intervals=10_000)
    for n in range(200):
        pool, low = ("p", False) if n % 2 else ("q", n % 3 == 0)
        for m in (meter, exact):
            m.open(n, pool, n * 2.0, low)
            m.close(n, n * 2.0 + 0.7)
    assert len(meter) <= 4
    for non_preemptible in (False, True):
        folded = meter.shares(500.0, ["p", "q"], non_preemptible=non_preemptible)
        assert folded == pytest.approx(exact.shares(500.0, ["p", "q"],
                                                    non_preemptible=non_preemptible))


def test_pools_that_came_and_went_leave_nothing_behind():
    # A peer may name any pool when there is no access policy: 10,000 registrations under
    # ever new names, each holding once and leaving, must not grow the scheduler by name.
    pools = {"training": {"guarantee": 0.5, "weight": 1, "maximum": -1},
             "simulation": {"guarantee": 0.5, "weight": 1, "maximum": -1}}
    sched = make_scheduler({"tq": 1.0, "window": 20.0, "pools": pools})
    trainer = sched.register(0.0, Registration(name="trainer", pool="training"))
    now = 0.0
    for n in range(10_000):
        client = sched.register(now, Registration(name=f"k{n}", pool=f"made-up-{n}"))
        sched.acquire(now, client.id)
        now += 0.01
        sched.release(now, client.id)
        sched.unregister(now, client.id)
    for second in range(60):  # a minute of the trainer's holds: the share window moves on
        sched.acquire(now + second, trainer.id)
        sched.release(now + second + 0.5, trainer.id)
    later = now + 60.0  # past the share window of every made-up pool's hold
    sched.unregister(later - 9.0, trainer.id)  # a configured pool keeps its counter
    stayer = sched.register(later - 5.0, Registration(name="stayer", pool="made-up-stays"))
    sched.acquire(later - 5.0, stayer.id)
    sched.release(later - 4.0, stayer.id)
    assert set(sched.pool_gpu_seconds(0, later)) == {"training", "made-up-stays"}
    assert sched.pool_gpu_seconds(0, later)["training"] == pytest.approx(30.0)
    assert set(sched.shares(0, later)) <= {"training", "simulation", "made-up-stays"}
