"""Properties over random contention patterns, checked with Hypothesis.

- Pools contending without pause get their entitlement within 0.03 over long runs.
- A pool that wants the GPU without pause never ends below its guarantee, whatever the others do.
- Whatever happens (any sequence of requests, releases, deaths, mode and TQ changes, working-set
  reports, ignored drops, time passing): at most one holder not already leaving in mode on, no
  holder set in mode auto whose working sets exceed the room, no grant to a dead client.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from policy_helpers import GiB, greedy, make_scheduler

from nodeside.model import Registration
from nodeside.scheduler.core import Action, Grant, HoldState, Scheduler, SchedulerError
from nodeside.scheduler.pools import entitlements
from nodeside.testing import Replay

PROPERTY = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@st.composite
def pool_configs(draw: st.DrawFn, min_pools: int = 2, max_pools: int = 3) -> dict[str, dict]:
    """Fully configured pools whose guarantees sum to at most one GPU."""
    count = draw(st.integers(min_pools, max_pools))
    left = 1.0
    pools = {}
    for i in range(count):
        guarantee = draw(st.sampled_from([0.0, 0.1, 0.2, 0.3, 0.5]))
        guarantee = min(guarantee, round(left, 2))
        left -= guarantee
        weight = draw(st.sampled_from([1, 2, 3]))
        maximum = draw(st.sampled_from([-1, -1, 0.5, 0.7, 0.9]))
        if maximum != -1:
            maximum = max(maximum, guarantee)
        pools[f"p{i}"] = {"guarantee": guarantee, "weight": weight, "maximum": maximum}
    return pools


@PROPERTY
@given(pools=pool_configs(), clients=st.lists(st.integers(1, 3), min_size=3, max_size=3))
def test_contending_pools_get_their_entitlement_over_long_runs(pools, clients):
    sched = make_scheduler({"tq": 1.0, "pools": pools})
    replay = Replay(sched)
    for (name, _), count in zip(pools.items(), clients, strict=False):
        for i in range(count):
            greedy(replay, f"{name}-{i}", name)
    replay.run_until(400.0)
    expected = entitlements(sched.pool(name) for name in pools)
    used = replay.gpu_seconds_by_pool(100.0, 400.0)
    for name in pools:
        assert used.get(name, 0.0) / 300.0 == pytest.approx(expected[name], abs=0.03), name


@st.composite
def bursts(draw: st.DrawFn) -> list[tuple[float, float]]:
    """(start, GPU seconds) pairs: work arriving at random times in random amounts."""
    return draw(st.lists(st.tuples(st.floats(0, 350), st.floats(0.1, 20)), max_size=12))


@PROPERTY
@given(pools=pool_configs(), others=st.lists(
    st.tuples(st.integers(1, 2), st.sampled_from(["HIGH", "NORMAL", "LOW"]), bursts()),
    min_size=1, max_size=4))
def test_a_pool_wanting_the_gpu_without_pause_gets_at_least_its_guarantee(pools, others):
    steady = "p0"
    assume(pools[steady]["guarantee"] > 0)
    sched = make_scheduler({"tq": 1.0, "pools": pools})
    replay = Replay(sched)
    greedy(replay, "steady", steady)
    for n, (pool_index, priority, work) in enumerate(others):
        name = f"p{min(pool_index, len(pools) - 1)}"
        worker = replay.add(f"other-{n}", pool=name, priority=priority)
        for start, seconds in work:
            replay.burst(worker, seconds, when=start)
    replay.run_until(400.0)
    got = replay.gpu_seconds_by_pool(50.0, 400.0).get(steady, 0.0) / 350.0
    assert got >= pools[steady]["guarantee"] - 0.03


class AnyContention(RuleBasedStateMachine):
    """Random events on a two-GPU node with 16 GiB GPUs, checked after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.sched: Scheduler = make_scheduler(
            {"tq": 1.0, "grace": 2.0, "pools": {"a": {"guarantee": 0.3, "weight": 1,
                                                        "maximum": 0.8},
                                                  "b": {"guarantee": 0.4, "weight": 2,
                                                        "maximum": -1}}},
            gpus=2, memory=16 * GiB)
        self.dead: set[str] = set()
        self.last: list[Action] = []
        self.was_holding: set[str] = set()

    def _do(self, actions: list[Action]) -> None:
        self.last = actions

    def _before(self) -> None:
        self.was_holding = {c.id for c in self.sched.clients.values() if c.state == "holding"}

    @property
    def ids(self) -> list[str]:
        return sorted(self.sched.clients)

    @rule(pool=st.sampled_from(["a", "b", "elsewhere"]),
          priority=st.sampled_from(["HIGH", "NORMAL", "LOW"]), gpu=st.integers(0, 1),
          working_set=st.none() | st.integers(0, 16).map(lambda g: g * GiB))
    def register(self, pool, priority, gpu, working_set):
        self.sched.register(self.now, Registration(name="x", pool=pool, priority=priority, gpu=gpu,
                                                   working_set=working_set))

    @precondition(lambda self: self.sched.clients)
    @rule(pick=st.integers(0, 1000))
    def acquire(self, pick):
        self._before()
        self._do(self.sched.acquire(self.now, self.ids[pick % len(self.ids)]))

    @precondition(lambda self: self.sched.clients)
    @rule(pick=st.integers(0, 1000))
    def release(self, pick):
        self._before()
        self._do(self.sched.release(self.now, self.ids[pick % len(self.ids)]))

    @precondition(lambda self: self.sched.clients)
    @rule(pick=st.integers(0, 1000))
    def die(self, pick):
        victim = self.ids[pick % len(self.ids)]
        self.dead.add(victim)
        self._before()
        self._do(self.sched.unregister(self.now, victim))

    @precondition(lambda self: self.sched.clients)
    @rule(pick=st.integers(0, 1000), size=st.integers(0, 20))
    def report_working_set(self, pick, size):
        self._before()
        self._do(self.sched.report_working_set(self.now, self.ids[pick % len(self.ids)],
                                               size * GiB))

    @rule(mode=st.sampled_from(["on", "off", "auto"]))
    def set_mode(self, mode):
        self._before()
        self._do(self.sched.set_mode(self.now, mode))

    @rule(tq=st.sampled_from([0.25, 1.0, 3.0]), gpu=st.none() | st.integers(0, 1))
    def set_tq(self, tq, gpu):
        self._before()
        self._do(self.sched.set_tq(self.now, tq, gpu))

    @rule(dt=st.floats(0.0, 5.0))
    def time_passes(self, dt):
        self.now += dt
        self._before()
        self._do(self.sched.tick(self.now))

    @rule()
    def until_the_next_deadline(self):
        deadline = self.sched.next_deadline(self.now)
        if deadline is not None:
            self.now = max(self.now, deadline)
        self._before()
        self._do(self.sched.tick(self.now))

    @invariant()
    def no_grant_to_a_dead_client(self):
        for action in self.last:
            if isinstance(action, Grant):
                assert action.client not in self.dead
                assert action.client in self.sched.clients

    @invariant()
    def states_agree_with_the_queues(self):
        for gpu in self.sched.gpus.values():
            assert not set(gpu.holders) & set(gpu.waiters)
            assert all(c.state == "holding" and c.hold for c in gpu.holders.values())
            assert all(c.state == "waiting" for c in gpu.waiters.values())
        for client in self.sched.clients.values():
            # The explicit hold state says the same as the hold: DROPPING iff a drop is out.
            dropping = client.hold is not None and client.hold.drop_reason is not None
            assert (client.hold_state is HoldState.DROPPING) == dropping
            assert (client.hold is not None) == (client.state == "holding")

    @invariant()
    def queue_position_kept_incrementally_equals_the_rebuilt_queue(self):
        for index in self.sched.gpus:
            rebuilt = self.sched.queue(index, self.now)
            for place, client in enumerate(rebuilt, 1):
                assert self.sched.queue_position(client.id, self.now) == place

    @invariant()
    def cached_next_deadline_equals_a_fresh_one(self):
        fresh, _ = self.sched._compute_deadline(self.now)
        assert self.sched.next_deadline(self.now) == fresh

    @invariant()
    def mode_on_has_at_most_one_holder_not_leaving(self):
        if self.sched.mode != "on":
            return
        for gpu in self.sched.gpus.values():
            staying = [h for h in gpu.holders.values() if h.hold.drop_reason is None]
            assert len(staying) <= 1
            granted = [a for a in self.last if isinstance(a, Grant)
                       and a.gpu == gpu.spec.index and a.client not in self.was_holding]
            if granted:  # a grant in mode on only ever goes to a free GPU
                assert list(gpu.holders) == [granted[0].client]

    @invariant()
    def mode_auto_holders_not_leaving_fit(self):
        if self.sched.mode != "auto":
            return
        for gpu in self.sched.gpus.values():
            staying = [h for h in gpu.holders.values() if h.hold.drop_reason is None]
            reserve = self.sched.config.memory_reserve
            sizes = [h.working_set for h in staying]
            capacity = gpu.spec.memory_total
            # The arithmetic written out, not the ledger's fit asked again.
            assert len(staying) <= 1 or (capacity is not None and None not in sizes
                                         and sum(sizes) <= capacity - reserve)

    @invariant()
    def a_tick_settles_everything_due(self):
        # What the daemon does when a deadline passes: after it, nobody holds past the grace
        # of a drop, and the next deadline lies in the future (or the shell would spin).
        actions = self.sched.tick(self.now)
        assert not any(isinstance(a, Grant) and a.client in self.dead for a in actions)
        for gpu in self.sched.gpus.values():
            for holder in gpu.holders.values():
                sent = holder.hold.drop_sent_at
                assert sent is None or self.now < sent + self.sched.config.grace
        deadline = self.sched.next_deadline(self.now)
        assert deadline is None or deadline > self.now


AnyContention.TestCase.settings = settings(max_examples=60, stateful_step_count=40,
                                           deadline=None)
test_any_contention_keeps_the_invariants = AnyContention.TestCase


def test_scheduler_errors_do_not_change_state():
    sched = make_scheduler()
    with pytest.raises(SchedulerError):
        sched.register(0.0, Registration(name="x", priority="URGENT"))
    assert sched.clients == {}
