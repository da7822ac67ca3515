"""The fleet benchmark's clairvoyant reference (``benchmarks.fleet.oracle``): the interactive
policy told each cell's length, on the real scheduler core through ``Replay``.

The oracle subclasses the interactive policy, which only the pure Python core allows: the tests
that run it in this process run where ``KIWI_PURE_PYTHON`` is set, which the compiled run
arranges by running this file again in a child pytest. The fleet's own command runs it in pure
worker processes whatever core the caller runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from policy_helpers import SEED_POOLS, GiB, greedy, make_scheduler
from support import scaled
from test_interactive_policy import AnyContentionInteractive, Overtakes

from benchmarks.fleet.cli import main
from benchmarks.fleet.oracle import ClairvoyantPolicy, install
from benchmarks.fleet.runs import ORACLE_RUNS, run
from benchmarks.fleet.seeds import KEY_RUNS
from nodeside import compiled
from nodeside.scheduler.core import Action, Grant
from nodeside.testing import Replay

PURE = compiled.pure_asked(os.environ)
pure_only = pytest.mark.skipif(not PURE, reason="runs on the pure core (the child run below)")
REPO = Path(__file__).resolve().parents[2]
INTERACTIVE = {"policy": "interactive"}


def grants(replay: Replay) -> list[str]:
    """Who was granted, in order (names)."""
    names = {w.id: w.name for w in replay.workers.values()}
    return [names[a.client] for _, a in replay.actions if isinstance(a, Grant)]


def finish_time(replay: Replay, name: str) -> float:
    return max(s.end for s in replay.spans if s.name == name and s.end is not None)


def heavy_short_and_fresh_long(oracle: bool) -> Replay:
    """``used`` ran a 20 s cell alone, then asks for 1 s at 21; ``fresh`` has used nothing and
    asks for 30 s at 22; both wait for ``holder``'s 5 s cell (20.5 to 25.5), which neither cuts
    short: moving their 30 GiB working sets over a 1 GiB/s link costs more than it saves."""
    sched = make_scheduler({"tq": 10.0, "memory_reserve": 0, **INTERACTIVE,
                            "interactive": {"link_bandwidth": GiB}}, memory=40 * GiB)
    replay = Replay(sched)
    used, holder, fresh = (replay.add(name, working_set=30 * GiB)
                           for name in ("used", "holder", "fresh"))
    if oracle:
        install(replay)
    replay.burst(used, 20.0, when=0.0)
    replay.burst(holder, 5.0, when=20.5)
    replay.burst(used, 1.0, when=21.0)
    replay.burst(fresh, 30.0, when=22.0)
    replay.run_until(200.0)
    return replay


def test_interactive_serves_the_waiter_that_used_least_first():
    """The other half of the oracle's test: by attained service, ``fresh`` goes first."""
    assert grants(heavy_short_and_fresh_long(oracle=False))[:3] == ["used", "holder", "fresh"]


@pure_only
def test_the_oracle_serves_the_shortest_remaining_cell_first_not_the_least_used():
    replay = heavy_short_and_fresh_long(oracle=True)
    assert grants(replay) == ["used", "holder", "used", "fresh"]
    assert finish_time(replay, "used") == pytest.approx(25.5 + 1.0)


@pure_only
@pytest.mark.parametrize(("bandwidth", "finished"), [
    (30 * GiB, 1.0 + 1.0),  # 2 s each way: 1 s + 4 s of moves < the holder's 19 s left
    (6 * GiB, 20.0 + 1.0),  # 10 s each way: 1 s + 20 s > 19 s, so the holder finishes first
])
def test_the_oracle_cuts_a_quantum_exactly_when_the_waiters_work_and_the_moves_are_less(
        bandwidth, finished):
    """A holder with 20 s of work from 0; at 1 a 1 s cell asks. Cutting moves 60 GiB twice
    (to the waiter and back). TQ 30 s: without a cut the waiter goes once the holder is done."""
    sched = make_scheduler({"tq": 30.0, "memory_reserve": 0, **INTERACTIVE,
                            "interactive": {"link_bandwidth": bandwidth}}, memory=40 * GiB)
    replay = Replay(sched)
    holder, waiter = (replay.add(name, working_set=30 * GiB) for name in ("holder", "waiter"))
    install(replay)
    replay.burst(holder, 20.0, when=0.0)
    replay.burst(waiter, 1.0, when=1.0)
    replay.run_until(100.0)
    assert finish_time(replay, "waiter") == pytest.approx(finished)


@pure_only
@pytest.mark.parametrize(("low_cuts", "finished"), [(False, 31.0), (True, 11.0)])
def test_a_low_request_never_cuts_a_quantum_short_unless_the_variant_lifts_the_rule(
        low_cuts, finished):
    """A trains from 0 (pool x); a LOW 1 s cell of pool y asks at 10. TQ 30 s."""
    pools = {"x": {"guarantee": 0.0, "weight": 1, "maximum": -1},
             "y": {"guarantee": 0.0, "weight": 1, "maximum": -1}}
    replay = Replay(make_scheduler({"tq": 30.0, "pools": pools, **INTERACTIVE}))
    install(replay, low_cuts=low_cuts)
    greedy(replay, "A", "x")
    low = replay.add("B", pool="y", priority="LOW")
    replay.burst(low, 1.0, when=10.0)
    replay.run_until(100.0)
    assert finish_time(replay, "B") == pytest.approx(finished)


@pure_only
def test_a_low_request_never_goes_ahead_of_its_pools_normal_one_however_short():
    replay = Replay(make_scheduler({"tq": 30.0, **INTERACTIVE}))
    install(replay)
    holder, normal = replay.add("holder"), replay.add("normal")
    low = replay.add("low", priority="LOW")
    replay.burst(holder, 5.0, when=0.0)
    replay.burst(normal, 50.0, when=1.0)
    replay.burst(low, 1.0, when=1.0)
    replay.run_until(200.0)
    assert grants(replay) == ["holder", "normal", "low"]


class PickKeepsTheRules:
    """After every batch of actions, whom the oracle would serve next on each GPU: never a
    pool at its maximum, never a LOW request while its pool has a NORMAL one waiting."""

    def __init__(self) -> None:
        self.picks = 0

    def observe(self, replay: Replay, actions: list[Action]) -> None:
        sched = replay.scheduler
        for gpu in sched.gpus.values():
            chosen = sched.choice.pick(gpu, replay.now)
            if chosen is None:
                continue
            self.picks += 1
            assert not sched.choice.over_maximum(gpu, chosen.pool, replay.now)
            if chosen.priority == "LOW":
                assert not [w for w in gpu.waiters.values()
                            if w.pool == chosen.pool and w.priority != "LOW"]


@pure_only
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(clients=st.lists(st.tuples(st.sampled_from(["training", "simulation"]),
                                  st.sampled_from(["NORMAL", "LOW"]),
                                  st.integers(1, 30),
                                  st.lists(st.tuples(st.floats(0, 60), st.floats(0.1, 20)),
                                           min_size=1, max_size=4)),
                        min_size=2, max_size=6))
def test_the_oracle_keeps_maximums_priorities_and_the_starvation_bound(clients):
    """The seed's pools (training capped at 0.7), a LOW trainer that never stops, and random
    cells with working sets that do not all fit in the GPU."""
    sched = make_scheduler({"tq": 5.0, "pools": SEED_POOLS, "memory_reserve": 0, **INTERACTIVE,
                            "interactive": {"link_bandwidth": 10 * GiB}}, memory=40 * GiB)
    replay = Replay(sched, release_delay=0.05)
    install(replay)
    rules, overtakes = PickKeepsTheRules(), Overtakes()
    replay.observers += [rules.observe, overtakes.observe]
    greedy(replay, "trainer", "training", "LOW", working_set=20 * GiB)
    work = 0.0
    for i, (pool, priority, size, cells) in enumerate(clients):
        worker = replay.add(f"c{i}", pool=pool, priority=priority, working_set=size * GiB)
        for when, seconds in cells:
            replay.burst(worker, seconds, when=when)
            work += seconds
    replay.run_until(200.0 + 4 * work)
    assert rules.picks > 0
    assert overtakes.worst <= sched.config.interactive.pass_bound
    assert all(w.remaining == 0 for w in replay.workers.values() if w.name != "trainer")


class AnyContentionClairvoyant(AnyContentionInteractive):
    """The invariants of any contention (deadlines, hold states, queue positions, ticks that
    settle what is due) hold with the oracle too. Each client has a fixed amount of work left,
    less the later it registered (c1 30 s, c2 15 s, ...), so later clients' requests often cut
    a quantum at once (a quantum of 0)."""

    def __init__(self) -> None:
        super().__init__()
        self.sched.choice = ClairvoyantPolicy(
            self.sched, lambda client, now: 30.0 / int(client[1:]), low_cuts=True)


AnyContentionClairvoyant.TestCase.settings = settings(max_examples=40, stateful_step_count=40,
                                                      deadline=None)
test_any_contention_keeps_the_invariants_under_the_oracle = pure_only(
    AnyContentionClairvoyant.TestCase)


@pure_only
def test_the_fleet_replays_the_oracle_and_reports_the_same_figures_as_the_others():
    oracle = run(notebooks=8, gpus=1, hours=0.5, seed=1, tq=10.0, policy="clairvoyant")
    interactive = run(notebooks=8, gpus=1, hours=0.5, seed=1, tq=10.0, policy="interactive")
    assert oracle.keys() == interactive.keys()
    assert oracle["policy"] == "clairvoyant" and oracle["cells"] > 0
    assert 1.0 <= oracle["short_slowdown_mean_floor"] <= oracle["short_slowdown_mean"]


def test_the_seed_summary_and_the_side_by_side_carry_the_oracle_columns(capsys):
    """Whatever core this process runs: the oracle runs in pure worker processes."""
    small = ["--notebooks", "8", "--gpus", "1", "--hours", "0.25", "--jobs", "1"]
    main(["--seeds", "1-2", *small, "--oracle"])
    out = capsys.readouterr().out
    assert out.count("of 2") == 2 * (len(KEY_RUNS) + len(ORACLE_RUNS))  # all, NORMAL notebooks'
    assert all(label in out for label, *_ in ORACLE_RUNS)
    main(["--seed", "2", *small, "--oracle"])
    header = capsys.readouterr().out.splitlines()[2]
    assert all(label in header for label, *_ in ORACLE_RUNS)
    assert os.environ.get(compiled.PURE_ENV) == ("1" if PURE else None)  # put back


@pytest.mark.skipif(PURE, reason="the compiled core runs only without KIWI_PURE_PYTHON")
def test_the_oracle_on_the_compiled_core_is_refused_with_the_way_out():
    with pytest.raises(RuntimeError, match="KIWI_PURE_PYTHON=1"):
        install(Replay(make_scheduler(INTERACTIVE)))


def test_the_oracle_replaces_only_the_interactive_policy():
    with pytest.raises(ValueError, match="interactive"):
        install(Replay(make_scheduler({"tq": 1.0})))


@pytest.mark.slow
@pytest.mark.timeout(int(scaled(300)))
@pytest.mark.skipif(PURE, reason="this is the pure run")
def test_the_oracle_tests_pass_on_the_pure_core():
    """This file's and test_fleet_hints.py's (the reference on hinted estimates)."""
    env = {**os.environ, compiled.PURE_ENV: "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                           __file__, str(Path(__file__).with_name("test_fleet_hints.py"))],
                          cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=scaled(280))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" in done.stdout
