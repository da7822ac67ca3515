"""The KAI guide's three preemption scenarios, on one GPU's time, and preemption turned off by a
partially configured pool.

The seed's cluster states (pool A 30 non-preemptible + 40 preemptible of 100 GPUs, and so on)
become shares of a 10-second window: each scenario first replays a history that leaves the pools
with those shares, then makes the new request the guide describes.
"""

import pytest
from policy_helpers import SEED_POOLS, kinds, make_scheduler

from nodeside.model import Registration
from nodeside.scheduler.core import Drop, Grant, Scheduler


def seed_history(a_normal: float, b_normal: float, *, pools=SEED_POOLS) -> tuple[Scheduler, str]:
    """A's NORMAL work, then B's, then A's LOW work holding the GPU at t=10 in a 10 s window.

    Returns the scheduler and the id of A's preemptible holder. TQ 5 s: its quantum, started
    at ``a_normal + b_normal``, is still running at t=10.
    """
    sched = make_scheduler({"tq": 5.0, "window": 10.0, "pools": pools})
    a_n = sched.register(0.0, Registration(name="a-normal", pool="training"))
    b_n = sched.register(0.0, Registration(name="b-normal", pool="simulation"))
    a_low = sched.register(0.0, Registration(name="a-low", pool="training", priority="LOW"))
    sched.acquire(0.0, a_n.id)
    sched.release(a_normal, a_n.id)
    sched.acquire(a_normal, b_n.id)
    t = a_normal + b_normal
    sched.release(t, b_n.id)
    assert kinds(sched.acquire(t, a_low.id)) == [("Grant", a_low.id)]
    assert sched.tick(10.0) == []
    return sched, a_low.id


def test_scenario1_pool_below_guarantee_preempts_another_pools_low_holder_at_once():
    # A: 3 s NORMAL + 4 s LOW = 0.7, B: 3 s = 0.3 < its guarantee 0.5.
    sched, a_low = seed_history(3.0, 3.0)
    shares = sched.shares(0, 10.0)
    assert shares == pytest.approx({"training": 0.7, "simulation": 0.3})
    b_new = sched.register(10.0, Registration(name="b-new", pool="simulation"))
    actions = sched.acquire(10.0, b_new.id)
    # At once, not at the end of the quantum (t=11).
    assert [(a.client, a.reason) for a in actions if isinstance(a, Drop)] == [(a_low, "preempt")]
    assert sched.counts["preemptions"] == 1
    assert kinds(sched.release(10.2, a_low)) == [("Released", a_low), ("Grant", b_new.id)]


def test_scenario2_preemptible_request_never_cuts_a_quantum_short():
    # A: 2.5 s NORMAL + 4 s LOW = 0.65, B: 3.5 s = 0.35; A asks for more, preemptibly.
    sched, a_low = seed_history(2.5, 3.5)
    a_more = sched.register(10.0, Registration(name="a-more", pool="training", priority="LOW"))
    assert kinds(sched.acquire(10.0, a_more.id)) == []
    assert sched.tick(10.9) == []
    # It waits for the quantum to end (6 + 5 = 11), as the guide's workflow stays pending.
    assert [(a.client, a.reason) for a in sched.tick(11.0)] == [(a_low, "quantum")]
    assert sched.counts["preemptions"] == 0


def test_a_preemptible_request_waits_even_when_its_pool_is_below_guarantee():
    sched, a_low = seed_history(2.5, 3.5)
    b_low = sched.register(10.0, Registration(name="b-low", pool="simulation", priority="LOW"))
    assert sched.acquire(10.0, b_low.id) == []
    assert sched.counts["preemptions"] == 0


def test_scenario3_pool_preempts_its_own_low_holder_when_below_guarantee():
    # A: 2.5 s NORMAL (0.25 < its guarantee 0.3) + 4 s LOW; A submits non-preemptible work.
    sched, a_low = seed_history(2.5, 3.5)
    # A's total share (0.65) is far above its guarantee: only its non-preemptible time counts.
    assert sched.shares(0, 10.0)["training"] == pytest.approx(0.65)
    a_new = sched.register(10.0, Registration(name="a-new", pool="training"))
    actions = sched.acquire(10.0, a_new.id)
    assert [(a.client, a.reason) for a in actions if isinstance(a, Drop)] == [(a_low, "preempt")]
    assert kinds(sched.release(10.1, a_low)) == [("Released", a_low), ("Grant", a_new.id)]


def test_no_preemption_when_the_pool_has_its_guarantee():
    # A: 4 s NORMAL (0.4 >= 0.3) before its LOW work; its new NORMAL request waits its turn.
    sched, a_low = seed_history(4.0, 2.0)
    a_new = sched.register(10.0, Registration(name="a-new", pool="training"))
    assert sched.acquire(10.0, a_new.id) == []


def test_non_preemptible_holders_are_never_preempted():
    sched = make_scheduler({"tq": 5.0, "pools": SEED_POOLS})
    a = sched.register(0.0, Registration(name="a", pool="training", priority="NORMAL"))
    b = sched.register(0.0, Registration(name="b", pool="simulation", priority="HIGH"))
    sched.acquire(0.0, a.id)
    assert sched.acquire(1.0, b.id) == []
    assert [(x.client, x.reason) for x in sched.tick(5.0)] == [(a.id, "quantum")]


def test_partial_pool_config_turns_preemption_off_and_says_why():
    partial = {"training": {"guarantee": 0.3, "weight": 1, "maximum": 0.7},
               "simulation": {"guarantee": 0.5, "weight": 3}}  # no maximum
    sched, a_low = seed_history(3.0, 3.0, pools=partial)
    assert sched.preemption is False
    reason = sched.preemption_off_reason
    assert reason is not None and "simulation lacks maximum" in reason
    b_new = sched.register(10.0, Registration(name="b-new", pool="simulation"))
    assert sched.acquire(10.0, b_new.id) == []  # scenario 1 again: no preemption now
    assert [(a.client, a.reason) for a in sched.tick(11.0)] == [(a_low, "quantum")]


def test_fully_configured_pools_have_preemption_on():
    sched = make_scheduler({"pools": SEED_POOLS})
    assert sched.preemption is True and sched.preemption_off_reason is None


def test_a_preempted_holder_that_asks_again_goes_after_the_claimant():
    sched, a_low = seed_history(3.0, 3.0)
    b_new = sched.register(10.0, Registration(name="b-new", pool="simulation"))
    sched.acquire(10.0, b_new.id)
    sched.release(10.1, a_low)
    assert sched.acquire(10.1, a_low) == []
    holders = list(sched.gpus[0].holders)
    assert holders == [b_new.id]
    assert not any(isinstance(a, Grant) and a.client == a_low for a in sched.tick(10.5))


def test_a_request_owed_its_guarantee_during_a_handoff_goes_before_the_one_promised():
    sched = make_scheduler({"tq": 1.0, "window": 10.0, "pools": SEED_POOLS})
    s1, s2 = (sched.register(0.0, Registration(name=n, pool="simulation")) for n in ("s1", "s2"))
    sched.acquire(0.0, s1.id)
    sched.acquire(0.5, s2.id)
    assert [(x.client, x.reason) for x in sched.tick(1.0)] == [(s1.id, "quantum")]
    # While s1 hands over (promised to s2), training, below its guarantee, asks.
    t = sched.register(1.1, Registration(name="t", pool="training"))
    sched.acquire(1.1, t.id)
    assert kinds(sched.release(1.2, s1.id)) == [("Released", s1.id), ("Grant", t.id)]


def test_the_promised_successor_gets_the_gpu_when_nobody_is_owed():
    sched = make_scheduler({"tq": 1.0, "window": 10.0, "pools": SEED_POOLS})
    s1, s2 = (sched.register(0.0, Registration(name=n, pool="simulation")) for n in ("s1", "s2"))
    sched.acquire(0.0, s1.id)
    sched.acquire(0.5, s2.id)
    sched.tick(1.0)
    s3 = sched.register(1.1, Registration(name="s3", pool="simulation", priority="HIGH"))
    sched.acquire(1.1, s3.id)  # would win a fresh pick within the pool
    assert kinds(sched.release(1.2, s1.id)) == [("Released", s1.id), ("Grant", s2.id)]
