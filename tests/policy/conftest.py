"""Fixtures for the policy tests."""

from collections.abc import Callable
from typing import Any

import pytest
from policy_helpers import SEED_POOLS, make_scheduler

from nodeside.scheduler.core import Scheduler


@pytest.fixture
def seed_scheduler() -> Callable[..., Scheduler]:
    def build(tq: float = 1.0, **extra: Any) -> Scheduler:
        return make_scheduler({"tq": tq, "pools": SEED_POOLS, **extra})
    return build
