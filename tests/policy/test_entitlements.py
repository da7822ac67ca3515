"""How GPU time is divided between contending pools: guarantees, then weights, under caps."""

import pytest

from nodeside.model import Pool
from nodeside.scheduler.pools import entitlements


def test_seed_pools_get_035_and_065():
    ent = entitlements([Pool("training", 0.3, 1, 0.7), Pool("simulation", 0.5, 3, -1)])
    assert ent == pytest.approx({"training": 0.35, "simulation": 0.65})


def test_remainder_split_by_weight_after_guarantees():
    # 20 GPUs of 100 left after guarantees, weights 1:3 -> 5 and 15 (the guide's example).
    ent = entitlements([Pool("a", 0.3, 1, -1), Pool("b", 0.5, 3, -1)])
    assert ent["a"] == pytest.approx(0.3 + 0.05)
    assert ent["b"] == pytest.approx(0.5 + 0.15)


def test_a_pool_never_entitled_past_its_maximum():
    ent = entitlements([Pool("capped", 0.0, 10, 0.2), Pool("open", 0.0, 1, -1)])
    assert ent == pytest.approx({"capped": 0.2, "open": 0.8})


def test_water_filling_gives_a_capped_pools_part_to_the_others():
    ent = entitlements([Pool("a", 0, 1, 0.2), Pool("b", 0, 1, -1), Pool("c", 0, 1, 0.3)])
    assert ent == pytest.approx({"a": 0.2, "b": 0.5, "c": 0.3})


def test_guarantee_is_clipped_to_the_maximum():
    assert entitlements([Pool("a", 0.6, 1, 0.4)])["a"] == pytest.approx(0.4)


def test_a_pool_alone_is_entitled_to_its_maximum():
    assert entitlements([Pool("training", 0.3, 1, 0.7)]) == pytest.approx({"training": 0.7})


def test_all_pools_capped_leaves_the_rest_unassigned():
    ent = entitlements([Pool("a", 0.1, 1, 0.3), Pool("b", 0.1, 1, 0.3)])
    assert ent == pytest.approx({"a": 0.3, "b": 0.3})


def test_zero_weight_pool_gets_only_its_guarantee():
    ent = entitlements([Pool("a", 0.2, 0, -1), Pool("b", 0.0, 1, -1)])
    assert ent == pytest.approx({"a": 0.2, "b": 0.8})
