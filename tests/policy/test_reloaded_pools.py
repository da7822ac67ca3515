"""What the scheduler reads off its config once (is any pool capped, is preemption on) is read
again when the config is reloaded: a maximum or a partial pool added by SIGHUP applies at once."""

from __future__ import annotations

from policy_helpers import SEED_POOLS, make_scheduler

from nodeside.config import from_mapping
from nodeside.model import Registration


def test_a_maximum_added_by_a_reload_holds_a_pool_back_at_once() -> None:
    scheduler = make_scheduler({"window": 10})
    client = scheduler.register(0.0, Registration(name="t", pool="training"))
    scheduler.acquire(0.0, client.id)
    gpu = scheduler.gpus[0]
    assert not scheduler.capped
    assert not scheduler.choice.over_maximum(gpu, "training", 5.0)
    scheduler.reconfigure(from_mapping({"window": 10, "pools": SEED_POOLS}), 5.0)
    assert scheduler.capped
    assert scheduler.choice.over_maximum(gpu, "training", 5.0)  # it held all 5 s: over 0.7


def test_a_partial_pool_added_by_a_reload_turns_preemption_off() -> None:
    scheduler = make_scheduler({"pools": SEED_POOLS})
    assert scheduler.preemption
    scheduler.reconfigure(from_mapping({"pools": {**SEED_POOLS, "odd": {"weight": 1}}}), 1.0)
    assert not scheduler.preemption
