"""``policy: interactive``: least attained service within the pools' and priorities' rules.

Every test runs the real scheduler core on an injected clock, most through ``Replay``.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from policy_helpers import SEED_POOLS, GiB, greedy, kinds, make_scheduler
from test_policy_properties import AnyContention, pool_configs

from nodeside.config import ConfigError, from_mapping
from nodeside.model import Registration
from nodeside.scheduler.core import Action, Drop, Grant
from nodeside.scheduler.interactive import JUMP_QUANTUM
from nodeside.scheduler.pools import entitlements
from nodeside.testing import Replay

INTERACTIVE = {"policy": "interactive"}


def finish_time(replay: Replay, name: str) -> float:
    ends = [s.end for s in replay.spans if s.name == name and s.end is not None]
    return max(ends)


def short_cell_behind_a_training_run(config: dict) -> Replay:
    """A trains without pause from t=0; B runs a 1 s cell at t=10. TQ 30 s."""
    replay = Replay(make_scheduler({"tq": 30.0, **config}), release_delay=0.2)
    greedy(replay, "A")
    b = replay.add("B")
    replay.burst(b, 1.0, when=10.0)
    replay.run_until(100.0)
    return replay


def test_round_robin_stays_the_default():
    assert from_mapping({}).policy == "round-robin"
    assert make_scheduler().choice.name == "round-robin"
    # The seed's rule: the short cell waits for the training run's quantum to end.
    assert finish_time(short_cell_behind_a_training_run({}), "B") == pytest.approx(31.2)


def test_a_short_cell_goes_ahead_of_a_training_run():
    replay = short_cell_behind_a_training_run(INTERACTIVE)
    # A has held for 10 s, far more than the first quantum: it is asked to drop at once.
    assert finish_time(replay, "B") == pytest.approx(10.0 + 0.2 + 1.0)
    drops = [a for _, a in replay.actions if isinstance(a, Drop)]
    assert drops[0].reason == "quantum"


def test_a_cell_after_a_minute_of_thought_counts_as_light_again():
    """A ran a 60 s cell, read its output for a minute and runs a 1 s cell, while B's training
    run has held the GPU for that minute. What A used before its minute of thought is history:
    its new cell cuts B's quantum short instead of waiting out B's TQ."""
    replay = Replay(make_scheduler({"tq": 30.0, **INTERACTIVE}), release_delay=0.2)
    a, b = replay.add("A"), replay.add("B")
    replay.burst(a, 60.0, when=0.0)
    replay.burst(b, 1e12, when=60.0)
    replay.burst(a, 1.0, when=120.0)
    replay.run_until(200.0)
    # B is asked to drop after the first quantum (0.25 s), then gives back in 0.2 s.
    assert finish_time(replay, "A") == pytest.approx(120.0 + 0.25 + 0.2 + 1.0)


def test_a_cell_that_ends_as_a_drop_arrives_is_over():
    """A's cell ends just as B's request has A asked to drop: the release answers both. When A
    asks again much later, that is a new request; the 10 s it used are history (half-life
    30 s), not a request still in progress counted in full."""
    sched = make_scheduler({"tq": 30.0, **INTERACTIVE})
    a = sched.register(0.0, Registration(name="A"))
    b = sched.register(0.0, Registration(name="B"))
    sched.acquire(0.0, a.id)
    assert ("Drop", a.id) in kinds(sched.acquire(10.0, b.id))
    sched.release(10.0, a.id)
    sched.release(20.0, b.id)
    sched.acquire(100.0, a.id)
    assert sched.choice.attained(a.id, 100.0) == pytest.approx(10.0 * 0.5 ** 3)


def test_the_waiter_that_used_least_recently_goes_first():
    replay = Replay(make_scheduler({"tq": 5.0, **INTERACTIVE}))
    greedy(replay, "trainer")
    heavy, light = replay.add("heavy"), replay.add("light")
    replay.burst(heavy, 20.0, when=0.0)  # asks first, and has used the GPU a lot
    replay.run_until(60.0)
    replay.burst(heavy, 1.0, when=60.0)
    replay.burst(light, 1.0, when=60.5)
    replay.run_until(200.0)
    assert finish_time(replay, "light") < finish_time(replay, "heavy")


def test_two_training_runs_reach_full_quanta_after_a_few_growing_ones():
    """A request that goes on after a drop keeps what it used: two training runs cut each other
    short only while one has used less than half of the other's time, so their quanta double
    from the first quantum up to the TQ and stay there (a multi-level feedback queue's shape)."""
    replay = Replay(make_scheduler({"tq": 10.0, **INTERACTIVE}))
    greedy(replay, "A")
    greedy(replay, "B")
    replay.run_until(300.0)
    lengths = [s.end - s.start for s in replay.spans if s.end is not None]
    short = [length for length in lengths if length < 10.0 - 1e-6]
    assert len(short) <= 7  # 0.25 s doubling to 10 s: about log2(40) steps
    assert lengths[len(short):] == [pytest.approx(10.0)] * (len(lengths) - len(short))
    assert lengths[:len(short)] == sorted(short)


def test_a_low_request_never_cuts_a_quantum_short():
    """B's pool is owed the GPU's time, so B goes next, but not before A's quantum ends."""
    pools = {"x": {"guarantee": 0.0, "weight": 1, "maximum": -1},
             "y": {"guarantee": 0.0, "weight": 1, "maximum": -1}}
    replay = Replay(make_scheduler({"tq": 30.0, "pools": pools, **INTERACTIVE}))
    greedy(replay, "A", "x")
    b = replay.add("B", pool="y", priority="LOW")
    replay.burst(b, 1.0, when=10.0)
    replay.run_until(100.0)
    assert finish_time(replay, "B") == pytest.approx(31.0)


@pytest.mark.parametrize(("bandwidth", "cut_at"), [
    (10 * GiB, 12.0),  # moving 30 + 30 GiB takes 6 s: the holder keeps twice that
    (2 * GiB, None),   # 30 s: the wait saved is worth less than moving memory there and back
])
def test_a_quantum_is_cut_short_only_when_moving_memory_pays(bandwidth, cut_at):
    sched = make_scheduler({"tq": 30.0, "memory_reserve": 0, **INTERACTIVE,
                            "interactive": {"link_bandwidth": bandwidth}}, memory=40 * GiB)
    a = sched.register(0.0, Registration(name="A", working_set=30 * GiB))
    b = sched.register(0.0, Registration(name="B", working_set=30 * GiB))
    sched.acquire(0.0, a.id)
    assert sched.acquire(1.0, b.id) == []
    deadline = sched.next_deadline(1.0)
    if cut_at is None:
        assert kinds(sched.tick(29.0)) == []
        assert kinds(sched.tick(30.0)) == [("Drop", a.id)]
    else:
        assert deadline is not None and deadline <= cut_at
        assert kinds(sched.tick(cut_at - 0.01)) == []
        assert kinds(sched.tick(cut_at)) == [("Drop", a.id)]


def test_guarantees_come_before_least_attained_service():
    """Pool a is below its guarantee: its request goes next, though b's used less (but more
    than half of a's: not light enough to go ahead once, as the next test's does)."""
    pools = {"a": {"guarantee": 0.5, "weight": 1, "maximum": -1},
             "b": {"guarantee": 0.0, "weight": 1, "maximum": -1}}
    sched = make_scheduler({"tq": 1.0, "window": 100.0, "pools": pools, **INTERACTIVE})
    a1 = sched.register(0.0, Registration(name="a1", pool="a"))
    b1, b2, b3 = (sched.register(0.0, Registration(name=f"b{i}", pool="b")) for i in (1, 2, 3))
    sched.acquire(0.0, a1.id)
    sched.release(5.0, a1.id)
    sched.acquire(5.0, b3.id)  # b3 has used 2 s, a1 5 s, both 15 s ago
    sched.release(7.0, b3.id)
    sched.acquire(7.0, b1.id)
    sched.release(20.0, b1.id)
    assert kinds(sched.acquire(20.0, b2.id)) == [("Grant", b2.id)]
    assert sched.acquire(20.1, a1.id) == []
    assert sched.acquire(20.2, b3.id) == []
    assert kinds(sched.tick(21.0)) == [("Drop", b2.id)]
    assert sched.release(21.1, b2.id)[-1] == Grant(a1.id, 0, 1.0)


def test_a_light_request_goes_once_ahead_of_a_heavier_request_owed_its_guarantee():
    """a1 (pool a, below its guarantee) used 20 s half a minute ago; b3's is a fresh request.
    b3 goes first, once, for JUMP_QUANTUM; then a1, though b4 is as light as b3 was."""
    pools = {"a": {"guarantee": 0.5, "weight": 1, "maximum": -1},
             "b": {"guarantee": 0.0, "weight": 1, "maximum": -1}}
    sched = make_scheduler({"tq": 30.0, "window": 300.0, "pools": pools, **INTERACTIVE})
    a1 = sched.register(0.0, Registration(name="a1", pool="a"))
    b1, b2, b3, b4 = (sched.register(0.0, Registration(name=f"b{i}", pool="b"))
                      for i in (1, 2, 3, 4))
    sched.acquire(0.0, a1.id)
    sched.release(20.0, a1.id)
    sched.acquire(20.0, b1.id)
    sched.acquire(59.0, b2.id)
    assert kinds(sched.release(60.0, b1.id))[-1] == ("Grant", b2.id)
    assert sched.acquire(61.0, a1.id) == []  # owed, but not light: b2's quantum runs on
    assert sched.choice.below_guarantee(sched.gpus[0], a1, 61.0)
    # b3 is light: b2's quantum is cut short for it, and it goes ahead of a1.
    assert kinds(sched.acquire(62.0, b3.id)) == [("Drop", b2.id)]
    assert kinds(sched.release(62.2, b2.id))[-1] == ("Grant", b3.id)
    assert sched.acquire(63.0, b4.id) == []
    assert kinds(sched.tick(62.2 + JUMP_QUANTUM - 0.01)) == []
    assert kinds(sched.tick(62.2 + JUMP_QUANTUM)) == [("Drop", b3.id)]
    assert kinds(sched.release(62.4 + JUMP_QUANTUM, b3.id))[-1] == ("Grant", a1.id)


def test_a_low_request_never_cuts_the_quantum_of_a_light_request_that_went_ahead():
    """As above, b3 goes ahead of a1 for JUMP_QUANTUM; but a1 then withdraws, and only a LOW
    request of pool a waits: b3's quantum is not cut short for it."""
    pools = {"a": {"guarantee": 0.5, "weight": 1, "maximum": -1},
             "b": {"guarantee": 0.0, "weight": 1, "maximum": -1}}
    sched = make_scheduler({"tq": 30.0, "window": 300.0, "pools": pools, **INTERACTIVE})
    a1 = sched.register(0.0, Registration(name="a1", pool="a"))
    low = sched.register(0.0, Registration(name="low", pool="a", priority="LOW"))
    b1, b2, b3 = (sched.register(0.0, Registration(name=f"b{i}", pool="b")) for i in (1, 2, 3))
    sched.acquire(0.0, a1.id)
    sched.release(20.0, a1.id)
    sched.acquire(20.0, b1.id)
    sched.acquire(59.0, b2.id)
    sched.release(60.0, b1.id)
    sched.acquire(61.0, a1.id)
    assert kinds(sched.acquire(62.0, b3.id)) == [("Drop", b2.id)]
    assert kinds(sched.release(62.2, b2.id))[-1] == ("Grant", b3.id)
    sched.release(63.0, a1.id)  # withdraws its request
    assert sched.acquire(63.5, low.id) == []
    assert kinds(sched.tick(62.2 + JUMP_QUANTUM)) == []
    assert kinds(sched.tick(62.2 + 29.9)) == []


def test_a_low_holder_is_preempted_at_once_under_interactive():
    sched = make_scheduler({"tq": 5.0, "window": 10.0, "pools": SEED_POOLS, **INTERACTIVE})
    low = sched.register(0.0, Registration(name="low", pool="training", priority="LOW"))
    sim = sched.register(0.0, Registration(name="sim", pool="simulation"))
    sched.acquire(0.0, low.id)
    out = sched.acquire(1.0, sim.id)
    assert [(type(a).__name__, a.client, getattr(a, "reason", None)) for a in out] == [
        ("Drop", low.id, "preempt")]


def test_interactive_settings_are_checked():
    with pytest.raises(ConfigError, match="policy"):
        from_mapping({"policy": "fastest"})
    with pytest.raises(ConfigError, match="interactive.pass_bound"):
        from_mapping({"interactive": {"pass_bound": -1}})
    with pytest.raises(ConfigError, match="interactive: unknown key"):
        from_mapping({"interactive": {"quantum": 1}})
    with pytest.raises(ConfigError, match="interactive.first_quantum"):
        from_mapping({"interactive": {"first_quantum": 0}})
    config = from_mapping({"policy": "interactive",
                           "interactive": {"half_life": 60, "link_bandwidth": "55GB"}})
    assert config.policy == "interactive"
    assert config.interactive.half_life == 60.0
    assert config.interactive.link_bandwidth == 55 * 10**9


# -- never starving anyone ------------------------------------------------------------------

class Overtakes:
    """Counts, for each waiter, the times a later request of its pool and priority was served
    first: by a grant, or by a holder winning again at its quantum's end. Counted here from the
    scheduler's queues, independently of the policy's own count. A holder's quantum restarting
    counts only against waiters that already waited before the event: one that just arrived
    sees the quanta brought up to date (``_renew_lone_quanta``), not passed."""

    def __init__(self) -> None:
        self.count: dict[str, int] = {}
        self.worst = 0
        self._quanta: dict[str, float] = {}
        self._waiting: set[str] = set()

    def observe(self, replay: Replay, actions: list[Action]) -> None:
        sched = replay.scheduler
        for action in actions:
            if isinstance(action, Grant) and action.client in sched.clients:
                self.count.pop(action.client, None)
                self._passed(replay, sched.clients[action.client])
        for gpu in sched.gpus.values():
            for holder in gpu.holders.values():
                assert holder.hold is not None
                start = holder.hold.quantum_start
                if self._quanta.get(holder.id, start) != start and start > holder.hold.granted_at:
                    self._passed(replay, holder, tail=True)  # won again, at the tail
                self._quanta[holder.id] = start
        for client_id in [c for c in self._quanta if c not in sched.clients
                          or sched.clients[c].state != "holding"]:
            del self._quanta[client_id]
        self._waiting = {c for gpu in sched.gpus.values() for c in gpu.waiters}

    def _passed(self, replay: Replay, winner, tail: bool = False) -> None:
        gpu = replay.scheduler.gpus[winner.gpu]
        for waiter in gpu.waiters.values():
            if (waiter.pool, waiter.priority) != (winner.pool, winner.priority):
                continue
            if tail and waiter.id not in self._waiting:
                continue
            if tail or waiter.request_order < winner.request_order:
                self.count[waiter.id] = self.count.get(waiter.id, 0) + 1
                self.worst = max(self.worst, self.count[waiter.id])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bound=st.integers(0, 4),
       clients=st.lists(st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(["NORMAL", "LOW"]),
                                  st.lists(st.tuples(st.floats(0, 30), st.floats(0.1, 10)),
                                           min_size=1, max_size=4)),
                        min_size=2, max_size=5))
def test_no_waiter_is_passed_over_more_than_the_bound(bound, clients):
    sched = make_scheduler({"tq": 2.0, **INTERACTIVE,
                            "interactive": {"pass_bound": bound, "first_quantum": 0.5},
                            "pools": {"a": {"guarantee": 0.3, "weight": 1, "maximum": -1},
                                      "b": {"guarantee": 0.3, "weight": 2, "maximum": -1}}})
    replay = Replay(sched, release_delay=0.05)
    overtakes = Overtakes()
    replay.observers.append(overtakes.observe)
    # Always wants the GPU; LOW, so that the priorities alone never starve anyone here.
    greedy(replay, "trainer", "a", "LOW")
    work = 0.0
    for i, (pool, priority, cells) in enumerate(clients):
        worker = replay.add(f"c{i}", pool=pool, priority=priority)
        for when, seconds in cells:
            replay.burst(worker, seconds, when=when)
            work += seconds
    replay.run_until(100.0 + 3 * work)
    assert overtakes.worst <= bound
    # Nobody starves: every cell got done, the trainer's endless one aside.
    assert all(w.remaining == 0 for w in replay.workers.values() if w.name != "trainer")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pools=pool_configs(), clients=st.lists(st.integers(1, 3), min_size=3, max_size=3))
def test_contending_pools_stay_near_their_entitlement_under_interactive(pools, clients):
    sched = make_scheduler({"tq": 1.0, "pools": pools, **INTERACTIVE})
    replay = Replay(sched)
    for (name, _), count in zip(pools.items(), clients, strict=False):
        for i in range(count):
            greedy(replay, f"{name}-{i}", name)
    replay.run_until(400.0)
    expected = entitlements(sched.pool(name) for name in pools)
    used = replay.gpu_seconds_by_pool(100.0, 400.0)
    for name in pools:
        # Least attained service decides between pools within SHARE_TOLERANCE (0.05).
        assert used.get(name, 0.0) / 300.0 == pytest.approx(expected[name], abs=0.08), name


class AnyContentionInteractive(AnyContention):
    """The invariants of any contention hold under the interactive policy too."""

    def __init__(self) -> None:
        super().__init__()
        self.sched = make_scheduler(
            {"tq": 1.0, "grace": 2.0, **INTERACTIVE,
             "pools": {"a": {"guarantee": 0.3, "weight": 1, "maximum": 0.8},
                       "b": {"guarantee": 0.4, "weight": 2, "maximum": -1}}},
            gpus=2, memory=16 * GiB)


AnyContentionInteractive.TestCase.settings = settings(max_examples=40,
                                                      stateful_step_count=40, deadline=None)
test_any_contention_keeps_the_invariants_under_interactive = AnyContentionInteractive.TestCase


def test_a_request_that_goes_on_after_a_drop_keeps_its_work_however_long_it_waited():
    """A holder dropped mid-cell asks again at once; granted a TQ later, its cell has still
    done what it did (attained.py decides by when it asked, not when it was granted: the
    core tells the policy of a grant before it forgets when the request came)."""
    sched = make_scheduler({"mode": "on", "policy": "interactive", "tq": 10.0})
    trainer = sched.register(0.0, Registration(name="trainer"))
    other = sched.register(0.0, Registration(name="other"))
    sched.acquire(0.0, trainer.id)
    [drop] = sched.acquire(1.0, other.id)  # a light request: the trainer's quantum is cut
    assert drop.client == trainer.id
    sched.release(1.0, trainer.id)
    sched.acquire(1.0, trainer.id)  # at once: the cell goes on
    sched.release(25.0, other.id)  # granted 24 s after it asked
    assert trainer.state == "holding"
    assert sched.choice.request_seconds(trainer.id) == pytest.approx(1.0)
