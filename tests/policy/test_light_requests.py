"""``policy: interactive``: a light request may go ahead of a pool's rule once, and only once.

A pool whose demand is below its guarantee is owed it nearly always; a fresh request of another
pool that used at most half the owed request's GPU time goes first, for at most JUMP_QUANTUM,
once between two of the owed pool's grants (``LightRequests.over``, nodeside/scheduler/light.py).
Checked on the real scheduler core under random work, counted from the scheduler's queues and
meter.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from policy_helpers import greedy, make_scheduler

from nodeside.scheduler.core import Action, Grant
from nodeside.scheduler.interactive import JUMP_QUANTUM
from nodeside.testing import Replay

TQ = 10.0
RELEASE = 0.2
POOLS = {"owed": {"guarantee": 0.5, "weight": 1, "maximum": -1},
         "other": {"guarantee": 0.0, "weight": 1, "maximum": -1}}


class GoneAhead:
    """For each pool, the grants to other pools' requests not owed their guarantee, made while
    one of its requests waited owed its guarantee, since its own last grant."""

    def __init__(self) -> None:
        self.count: dict[str, int] = {}
        self.worst = 0
        self.jumps: list[tuple[str, float]] = []

    def observe(self, replay: Replay, actions: list[Action]) -> None:
        sched = replay.scheduler
        gpu = sched.gpus[0]
        for action in actions:
            if not isinstance(action, Grant) or action.client not in sched.clients:
                continue
            granted = sched.clients[action.client]
            self.count[granted.pool] = 0
            if sched.choice.below_guarantee(gpu, granted, replay.now):
                continue
            for pool in {w.pool for w in gpu.waiters.values() if w.pool != granted.pool
                         and sched.choice.below_guarantee(gpu, w, replay.now)}:
                self.count[pool] = self.count.get(pool, 0) + 1
                self.worst = max(self.worst, self.count[pool])
                self.jumps.append((granted.id, replay.now))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(heavy=st.lists(st.lists(st.tuples(st.floats(0, 200), st.floats(5, 60)),
                               min_size=1, max_size=4), min_size=1, max_size=2),
       light=st.lists(st.lists(st.tuples(st.floats(0, 200), st.floats(0.1, 5)),
                               min_size=1, max_size=6), min_size=1, max_size=4))
def test_a_pool_owed_its_guarantee_is_gone_ahead_of_at_most_once_per_turn(heavy, light):
    sched = make_scheduler({"tq": TQ, "window": 300.0, "pools": POOLS,
                            "policy": "interactive"})
    replay = Replay(sched, release_delay=RELEASE)
    gone = GoneAhead()
    replay.observers.append(gone.observe)
    # A training run keeps the other pool busy: the owed pool's long cells are owed its
    # guarantee, and the other pool's short cells are light beside them.
    greedy(replay, "trainer", "other")
    work = 0.0
    cells = [("owed", bursts) for bursts in heavy] + [("other", bursts) for bursts in light]
    for i, (pool, bursts) in enumerate(cells):
        worker = replay.add(f"c{i}", pool=pool)
        for when, seconds in bursts:
            replay.burst(worker, seconds, when=when)
            work += seconds
    replay.run_until(300.0 + 3 * work)
    assert gone.worst <= 1
    # Each request that went ahead held for one short quantum at most.
    for client, start in gone.jumps:
        span = next(s for s in replay.spans if s.client == client and s.start == start)
        if span.end is not None:
            assert span.end - span.start <= min(TQ, JUMP_QUANTUM) + RELEASE + 1e-6
    assert all(w.remaining == 0 for w in replay.workers.values() if w.name != "trainer")
