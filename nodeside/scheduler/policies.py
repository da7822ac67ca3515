"""The scheduling policies by their config name (``policy:``; docs/policy.md says which to use)."""

from __future__ import annotations

from nodeside.config import POLICY_INTERACTIVE, POLICY_ROUND_ROBIN
from nodeside.scheduler.choosing import PoolsPolicy
from nodeside.scheduler.interactive import InteractivePolicy

POLICIES: dict[str, type[PoolsPolicy]] = {
    POLICY_ROUND_ROBIN: PoolsPolicy,
    "pools": PoolsPolicy,  # the name the policy seam first had, still accepted
    POLICY_INTERACTIVE: InteractivePolicy,
}
