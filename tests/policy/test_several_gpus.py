"""Several GPUs on a node: one queue per GPU, each with its own TQ if configured."""

import pytest
from policy_helpers import greedy, kinds, make_scheduler

from nodeside.model import Registration
from nodeside.scheduler.core import SchedulerError
from nodeside.testing import Replay


def test_each_gpu_has_its_own_holder_and_queue():
    sched = make_scheduler({"tq": 1.0}, gpus=2)
    a0, b0 = (sched.register(0.0, Registration(name=n, gpu=0)) for n in ("a0", "b0"))
    a1 = sched.register(0.0, Registration(name="a1", gpu=1))
    assert kinds(sched.acquire(0.0, a0.id)) == [("Grant", a0.id)]
    assert sched.acquire(0.0, b0.id) == []
    assert kinds(sched.acquire(0.0, a1.id)) == [("Grant", a1.id)]  # GPU 1 is free
    assert [c.id for c in sched.queue(0, 0.0)] == [b0.id]
    assert sched.queue(1, 0.0) == []


def test_per_gpu_tq_from_the_config():
    replay = Replay(make_scheduler({"tq": 1.0, "gpus": {1: {"tq": 0.25}}}, gpus=2))
    for gpu in (0, 1):
        greedy(replay, f"a{gpu}", gpu=gpu)
        greedy(replay, f"b{gpu}", gpu=gpu)
    replay.run_until(2.0)
    turns = {gpu: [s for s in replay.spans if s.gpu == gpu and s.end is not None]
             for gpu in (0, 1)}
    assert len(turns[0]) == 2 and len(turns[1]) == 8
    assert all(s.end - s.start == pytest.approx(0.25) for s in turns[1])
    assert replay.scheduler.tq_for(0) == 1.0 and replay.scheduler.tq_for(1) == 0.25


def test_set_tq_for_one_gpu_leaves_the_others():
    sched = make_scheduler({"tq": 1.0}, gpus=2)
    sched.set_tq(0.0, 0.5, gpu=1)
    assert (sched.tq_for(0), sched.tq_for(1)) == (1.0, 0.5)
    sched.set_tq(0.0, 2.0)  # a node-wide TQ replaces the per-GPU ones
    assert (sched.tq_for(0), sched.tq_for(1)) == (2.0, 2.0)


def test_a_gpu_the_node_lacks_is_refused():
    sched = make_scheduler(gpus=2)
    with pytest.raises(SchedulerError, match="no GPU 2"):
        sched.register(0.0, Registration(name="x", gpu=2))
    with pytest.raises(SchedulerError, match="no GPU 5"):
        sched.set_tq(0.0, 1.0, gpu=5)


def test_shares_are_kept_per_gpu():
    replay = Replay(make_scheduler({"tq": 1.0, "pools": {"x": {}, "y": {}}}, gpus=2))
    greedy(replay, "x0", "x", gpu=0)
    greedy(replay, "y0", "y", gpu=0)
    greedy(replay, "x1", "x", gpu=1)
    replay.run_until(40.0)
    assert replay.scheduler.shares(0, 40.0) == pytest.approx({"x": 0.5, "y": 0.5}, abs=0.03)
    assert replay.scheduler.shares(1, 40.0) == pytest.approx({"x": 1.0})
