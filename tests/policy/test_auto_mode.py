"""Mode auto: side by side while the working sets fit in the GPU less the reserve; serialized by
quanta when they do not; drops say whether the memory must move out."""

from policy_helpers import GiB, greedy, kinds, make_scheduler

from nodeside.model import Registration
from nodeside.scheduler.core import Drop, Grant
from nodeside.testing import Replay

GPU = 16 * GiB  # less the default 512 MiB reserve: 15.5 GiB for working sets


def auto(**extra):
    return make_scheduler({"tq": 1.0, "mode": "auto", **extra}, memory=GPU)


def test_holders_run_side_by_side_while_their_working_sets_fit():
    sched = auto()
    a, b = (sched.register(0.0, Registration(name=n, working_set=7 * GiB)) for n in "ab")
    assert kinds(sched.acquire(0.0, a.id)) == [("Grant", a.id)]
    assert kinds(sched.acquire(0.1, b.id)) == [("Grant", b.id)]
    assert list(sched.gpus[0].holders) == [a.id, b.id]


def test_the_reserve_is_kept_free():
    sched = auto()
    a = sched.register(0.0, Registration(name="a", working_set=8 * GiB))
    # 16 GiB together: they fit the GPU, not what is left beside the reserve.
    b = sched.register(0.0, Registration(name="b", working_set=8 * GiB))
    sched.acquire(0.0, a.id)
    assert sched.acquire(0.0, b.id) == []


def test_a_client_with_unknown_working_set_needs_the_whole_gpu():
    sched = auto()
    known = sched.register(0.0, Registration(name="known", working_set=1 * GiB))
    unknown = sched.register(0.0, Registration(name="unknown"))
    sched.acquire(0.0, known.id)
    assert sched.acquire(0.0, unknown.id) == []
    # Once it reports a size that fits, it joins at once.
    assert kinds(sched.report_working_set(0.5, unknown.id, 2 * GiB)) == [("Grant", unknown.id)]


def test_unknown_gpu_capacity_serializes_like_mode_on():
    sched = make_scheduler({"tq": 1.0, "mode": "auto"}, memory=None)
    a, b = (sched.register(0.0, Registration(name=n, working_set=GiB)) for n in "ab")
    sched.acquire(0.0, a.id)
    assert sched.acquire(0.0, b.id) == []


def test_contenders_that_do_not_fit_are_serialized_by_quanta_then_concurrency_returns():
    replay = Replay(auto())
    big_a = replay.add("big-a", working_set=10 * GiB)
    big_b = replay.add("big-b", working_set=10 * GiB)
    replay.burst(big_a, 3.0)
    replay.burst(big_b, 3.0, when=0.1)
    replay.run_until(10.0)
    spans = sorted((s.start, s.end, s.name) for s in replay.spans)
    # Never both at once while they contend, and turns last one quantum.
    for (_, end, _), (start, _, _) in zip(spans, spans[1:], strict=False):
        assert end <= start
    assert all(end - start <= 1.0 + 1e-9 for start, end, _ in spans)
    assert {name for *_, name in spans} == {"big-a", "big-b"}
    assert all(r.reason == "room" for _, r in replay.actions if isinstance(r, Drop))
    # Contention over, two small ones run side by side again.
    small = [replay.add(f"small-{i}", working_set=GiB) for i in range(2)]
    for worker in small:
        replay.burst(worker, 1.0)
    replay.run_until(10.5)
    assert len(replay.scheduler.gpus[0].holders) == 2


def test_drop_says_evict_when_the_next_holder_needs_the_room():
    sched = make_scheduler({"tq": 1.0}, memory=GPU)  # mode on: a quantum drop
    a = sched.register(0.0, Registration(name="a", working_set=10 * GiB))
    b = sched.register(0.0, Registration(name="b", working_set=10 * GiB))
    sched.acquire(0.0, a.id)
    sched.acquire(0.1, b.id)
    (drop,) = sched.tick(1.0)
    assert isinstance(drop, Drop) and drop.evict is True


def test_drop_says_stay_when_the_next_holder_fits_beside():
    sched = make_scheduler({"tq": 1.0}, memory=GPU)
    a = sched.register(0.0, Registration(name="a", working_set=4 * GiB))
    b = sched.register(0.0, Registration(name="b", working_set=4 * GiB))
    sched.acquire(0.0, a.id)
    sched.acquire(0.1, b.id)
    (drop,) = sched.tick(1.0)
    assert isinstance(drop, Drop) and drop.evict is False
    released = sched.release(1.1, a.id)
    assert released[0].evict is False and kinds(released[1:]) == [("Grant", b.id)]


def test_a_holder_that_grows_past_the_room_makes_the_others_leave_and_evict():
    sched = auto()
    a, b = (sched.register(0.0, Registration(name=n, working_set=4 * GiB)) for n in "ab")
    sched.acquire(0.0, a.id)
    sched.acquire(0.0, b.id)
    actions = sched.report_working_set(0.5, b.id, 14 * GiB)
    assert [(x.client, x.reason, x.evict) for x in actions] == [(a.id, "room", True)]


def test_holders_that_fit_hear_nothing_at_quantum_end():
    replay = Replay(auto())
    for name in "abc":
        greedy(replay, name, working_set=4 * GiB)
    replay.run_until(10.0)
    assert len(replay.scheduler.gpus[0].holders) == 3
    assert not [a for _, a in replay.actions if isinstance(a, Drop)]
    assert len([a for _, a in replay.actions if isinstance(a, Grant)]) == 3


def test_a_capped_pool_side_by_side_is_served_while_its_holders_use_less_than_its_maximum():
    # Training capped at 0.7 of the GPU's time. Two training and two simulation holders side by
    # side for 5 s had a quarter of the GPU each: training used 0.5, so a third training
    # request is granted. Charged their wall time, they counted 2.0 and it was refused.
    sched = auto(window=10.0, pools={
        "training": {"guarantee": 0.3, "weight": 1, "maximum": 0.7},
        "simulation": {"guarantee": 0.5, "weight": 3, "maximum": -1}})
    first = [sched.register(0.0, Registration(name=f"{pool}-{n}", pool=pool, working_set=GiB))
             for pool in ("training", "simulation") for n in range(2)]
    for client in first:
        assert kinds(sched.acquire(0.0, client.id)) == [("Grant", client.id)]
    late = sched.register(5.0, Registration(name="training-late", pool="training", working_set=GiB))
    assert kinds(sched.acquire(5.0, late.id)) == [("Grant", late.id)]
    assert sched.shares(0, 5.0)["training"] == 0.5
