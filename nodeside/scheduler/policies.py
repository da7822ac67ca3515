"""The scheduling policies by their config name (``policy:``; docs/policy.md says which to use).

The names are the domain's (``nodeside.model.POLICY_NAMES``: the config checks a file's
``policy:`` against them without importing the scheduler); this is the policy for each.
"""

from __future__ import annotations

from nodeside.model import POLICY_INTERACTIVE, POLICY_POOLS, POLICY_ROUND_ROBIN
from nodeside.scheduler.choosing import PoolsPolicy
from nodeside.scheduler.interactive import InteractivePolicy

POLICIES: dict[str, type[PoolsPolicy]] = {
    POLICY_ROUND_ROBIN: PoolsPolicy,
    POLICY_POOLS: PoolsPolicy,
    POLICY_INTERACTIVE: InteractivePolicy,
}
