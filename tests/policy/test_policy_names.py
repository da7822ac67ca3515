"""The policy names: the config checks ``policy:`` against the domain's names without importing
the scheduler, so the scheduler must have a policy for each name, and a name for each policy."""

from nodeside.model import POLICY_NAMES
from nodeside.scheduler.policies import POLICIES


def test_every_name_the_config_accepts_has_a_policy_and_every_policy_a_name() -> None:
    assert sorted(POLICIES) == sorted(POLICY_NAMES)
