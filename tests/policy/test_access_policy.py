"""Pool and priority as permissions: the admin's access policy judges each claim by the peer's
uid and groups (read from the socket), refusing it or downgrading it with a warning."""

import pytest
from policy_helpers import SEED_POOLS, make_scheduler

from nodeside import protocol as p
from nodeside.config import ConfigError, from_mapping
from nodeside.model import Registration
from nodeside.scheduler.core import Drop, SchedulerError

ACCESS = {
    "default": {"pools": ["default", "training"], "priorities": ["NORMAL", "LOW"]},
    "rules": [{"uids": [1001], "pools": ["simulation"], "priorities": ["HIGH", "NORMAL"]},
              {"gids": [500], "pools": ["*"], "priorities": ["HIGH", "NORMAL", "LOW"]}],
}


def scheduler(on_violation: str = "refuse"):
    return make_scheduler({"tq": 5.0, "pools": SEED_POOLS,
                           "access": {**ACCESS, "on_violation": on_violation}})


def test_without_an_access_policy_every_claim_stands():
    sched = make_scheduler({"pools": SEED_POOLS})
    client = sched.register(0.0, Registration(name="x", uid=1234, pool="simulation",
                                              priority="HIGH"))
    assert (client.pool, client.priority, client.warning) == ("simulation", "HIGH", None)


def test_a_claim_the_policy_allows_stands():
    sched = scheduler()
    client = sched.register(0.0, Registration(name="x", uid=1001, pool="simulation",
                                              priority="HIGH"))
    assert (client.pool, client.priority, client.warning) == ("simulation", "HIGH", None)


def test_a_claim_outside_the_policy_is_refused_with_a_permission_error():
    sched = scheduler()
    with pytest.raises(SchedulerError, match="uid 1234 may not use pool 'simulation'") as exc:
        sched.register(0.0, Registration(name="x", uid=1234, pool="simulation", priority="HIGH"))
    assert exc.value.code == p.E_PERMISSION
    assert sched.clients == {}


def test_a_group_the_peer_belongs_to_grants_the_claim():
    sched = scheduler()
    client = sched.register(0.0, Registration(name="x", uid=1234, gids=(20, 500), pool="simulation",
                                              priority="HIGH"))
    assert (client.pool, client.priority) == ("simulation", "HIGH")


def test_root_may_claim_anything():
    sched = scheduler()
    assert sched.register(0.0, Registration(name="x", uid=0, pool="simulation",
                                            priority="HIGH")).pool \
        == "simulation"


def test_downgrade_keeps_the_pool_and_lowers_the_priority_with_a_warning():
    sched = scheduler("downgrade")
    client = sched.register(0.0, Registration(name="x", uid=1234, pool="training", priority="HIGH"))
    assert (client.pool, client.priority) == ("training", "NORMAL")
    assert "uid 1234 may not use pool 'training' at priority HIGH" in client.warning
    assert "NORMAL instead" in client.warning


def test_downgrade_moves_a_claim_on_a_closed_pool_to_the_default_pool():
    sched = scheduler("downgrade")
    client = sched.register(0.0, Registration(name="x", uid=1234, pool="simulation",
                                              priority="HIGH"))
    assert (client.pool, client.priority) == ("default", "NORMAL")
    assert "registered in pool 'default'" in client.warning


def test_a_peer_without_rights_can_no_longer_preempt_another_users_low_holder():
    # The attack: a non-root peer claimed HIGH in a guaranteed pool and preempted.
    sched = scheduler("downgrade")
    victim = sched.register(0.0, Registration(name="victim", uid=1001, pool="training",
                                              priority="LOW"))
    sched.acquire(0.0, victim.id)
    attacker = sched.register(1.0, Registration(name="attacker", uid=1234, pool="simulation",
                                                priority="HIGH"))
    actions = sched.acquire(1.0, attacker.id)
    assert not any(isinstance(a, Drop) for a in actions)
    assert victim.state == "holding"


def test_the_access_section_is_validated_with_clear_errors():
    with pytest.raises(ConfigError, match="access.on_violation"):
        from_mapping({"access": {"on_violation": "shrug"}})
    with pytest.raises(ConfigError, match=r"access.rules\[0\]: names nobody"):
        from_mapping({"access": {"rules": [{"pools": ["a"]}]}})
    with pytest.raises(ConfigError, match="URGENT is not one of"):
        from_mapping({"access": {"default": {"priorities": ["URGENT"]}}})
    with pytest.raises(ConfigError, match="no such name on this node"):
        from_mapping({"access": {"rules": [{"uids": ["no-such-user-kiwi"]}]}})


def test_an_access_section_without_default_opens_only_the_default_pool_at_normal_and_low():
    config = from_mapping({"access": {}})
    assert config.access is not None
    assert config.access.allowed(1234, (), "default", "NORMAL")
    assert not config.access.allowed(1234, (), "default", "HIGH")
    assert not config.access.allowed(1234, (), "training", "LOW")
