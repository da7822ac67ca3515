"""Config files: YAML and TOML read alike, and every mistake is a clear error naming the key."""

import pytest

from nodeside.config import ConfigError, from_mapping, load
from nodeside.model import UNLIMITED

YAML = """\
tq: 30
mode: on
pools:
  training:   {guarantee: 0.3, weight: 1, maximum: 0.7}
  simulation: {guarantee: 0.5, weight: 3, maximum: -1}
gpus:
  1: {tq: 5}
"""

TOML = """\
tq = 30
mode = "on"
[pools.training]
guarantee = 0.3
weight = 1
maximum = 0.7
[pools.simulation]
guarantee = 0.5
weight = 3
maximum = -1
[gpus.1]
tq = 5
"""


def test_yaml_and_toml_give_the_same_config(tmp_path):
    (tmp_path / "kiwi.yaml").write_text(YAML)
    (tmp_path / "kiwi.toml").write_text(TOML)
    from_yaml, from_toml = load(tmp_path / "kiwi.yaml"), load(tmp_path / "kiwi.toml")
    assert from_yaml == from_toml
    assert from_yaml.mode == "on"  # YAML's bare `on` is a boolean; it means the mode here
    assert from_yaml.pools["simulation"].maximum == UNLIMITED
    assert from_yaml.tq_for(1) == 5.0 and from_yaml.tq_for(0) == 30.0


@pytest.mark.parametrize("raw, words", [
    ({"tqq": 3}, ["top level", "unknown key", "tqq", "known keys are", "interactive"]),
    ({"pools": {"a": "x"}}, ["pools.a", "expected a mapping with guarantee, maximum, weight"]),
    ({"interactive": {"halflife": 3}}, ["interactive", "halflife", "known keys are", "half_life"]),
    ({"access": {"rule": []}}, ["access", "rule", "known keys are", "rules"]),
    ({"connections": 3}, ["connections", "expected a mapping with", "idle_timeout"]),
    ({"connections": {"idle": 3}}, ["connections", "unknown key", "idle", "per_uid"]),
    ({"pools": {"a": {"guarantee": 0.1, "wieght": 2}}}, ["pools.a", "unknown key", "wieght"]),
    ({"pools": {"a": {"guarantee": "lots"}}}, ["pools.a.guarantee", "expected a number"]),
    ({"pools": {"a": {"weight": -2}}}, ["pools.a.weight", "non-negative"]),
    ({"pools": {"a": {"maximum": -0.5}}}, ["pools.a.maximum", "-1 for no maximum"]),
    ({"pools": {"a": {"guarantee": 0.5, "maximum": 0.4}}}, ["maximum 0.4", "below guarantee"]),
    ({"pools": {"a": {"guarantee": 1.5}}}, ["pools.a.guarantee", "more than one GPU"]),
    ({"pools": ["a", "b"]}, ["pools", "mapping"]),
    ({"mode": "sometimes"}, ["mode", "on, off, auto"]),
    ({"tq": 0}, ["tq", "between 0.01 and 86400 seconds"]),
    ({"tq": "soon"}, ["tq", "expected a number of seconds"]),
    ({"gpus": {"x": {"tq": 1}}}, ["gpus", "integer"]),
    ({"gpus": {0: {"quantum": 1}}}, ["gpus.0"]),
    ({"memory_reserve": "lots"}, ["not a size"]),
])
def test_bad_values_are_errors_naming_the_key(raw, words):
    with pytest.raises(ConfigError) as caught:
        from_mapping(raw)
    for word in words:
        assert word in str(caught.value)


def test_guarantees_over_one_gpu_are_rejected_with_the_sum_and_each_pool():
    with pytest.raises(ConfigError) as caught:
        from_mapping({"pools": {"training": {"guarantee": 0.6, "weight": 1, "maximum": -1},
                                "simulation": {"guarantee": 0.5, "weight": 3, "maximum": -1}}})
    message = str(caught.value)
    assert "add up to 1.1" in message
    assert "training 0.6" in message and "simulation 0.5" in message


def test_guarantees_adding_to_exactly_one_are_fine():
    config = from_mapping({"pools": {"a": {"guarantee": 0.7}, "b": {"guarantee": 0.3}}})
    assert sum(p.guarantee for p in config.pools.values()) == pytest.approx(1.0)


def test_a_pool_missing_settings_is_partial_and_says_which():
    config = from_mapping({"pools": {"a": {"guarantee": 0.2}}})
    assert not config.pools["a"].complete
    assert config.pools["a"].missing == ("weight", "maximum")


def test_config_errors_in_a_file_name_the_file(tmp_path):
    path = tmp_path / "kiwi.yaml"
    path.write_text("pools:\n  a: {guarantee: 2}\n")
    with pytest.raises(ConfigError, match=r"kiwi\.yaml: pools\.a\.guarantee"):
        load(path)


def test_unparsable_files_are_config_errors(tmp_path):
    broken_yaml = tmp_path / "kiwi.yaml"
    broken_yaml.write_text("pools: {a: [\n")
    broken_toml = tmp_path / "kiwi.toml"
    broken_toml.write_text("tq = \n")
    for path in (broken_yaml, broken_toml):
        with pytest.raises(ConfigError, match=path.name):
            load(path)


def test_a_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config"):
        load(tmp_path / "nope.yaml")


@pytest.mark.parametrize("raw", [
    {"tq": float("nan")}, {"tq": float("inf")}, {"tq": 10**400}, {"tq": 86_401},
    {"tq": 0.001}, {"gpus": {0: {"tq": float("nan")}}}, {"grace": float("inf")},
])
def test_a_number_outside_the_one_tq_range_is_a_config_error(raw) -> None:
    with pytest.raises(ConfigError, match="between 0.01 and 86400 seconds|expected a number"):
        from_mapping(raw)


def test_connection_limits_are_read_from_their_section() -> None:
    config = from_mapping({"connections": {"hello_timeout": 2, "idle_timeout": 60,
                                           "per_uid": 100, "backlog": 512}})
    limits = config.connections
    assert (limits.hello_timeout, limits.idle_timeout, limits.per_uid, limits.backlog) == (
        2.0, 60.0, 100, 512)
    assert from_mapping({}).connections.per_uid == 4096  # the default


@pytest.mark.parametrize("raw, where", [
    ({"connections": {"per_uid": 0}}, "connections.per_uid"),
    ({"connections": {"backlog": True}}, "connections.backlog"),
    ({"connections": {"hello_timeout": float("nan")}}, "connections.hello_timeout"),
    ({"connections": {"dial_tone": 1}}, "dial_tone"),
    ({"connections": 5}, "connections"),
])
def test_bad_connection_limits_name_the_key(raw, where) -> None:
    with pytest.raises(ConfigError, match=where):
        from_mapping(raw)


@pytest.mark.parametrize("raw", [{"memory_reserve": "9" * 400}, {"memory_reserve": "3000000TiB"},
                                 {"memory_reserve": 2**60}, {"memory_reserve": "1e3"},
                                 {"pools": {"a": {"guarantee": 10**400}}},
                                 {"pools": {"a": {"weight": 10**400}}}])
def test_a_number_past_its_bound_is_a_config_error_not_a_crash(raw) -> None:
    with pytest.raises(ConfigError):
        from_mapping(raw)


def test_the_configs_words_are_read_whatever_their_case_and_kept_in_one_spelling(tmp_path):
    # The seeds' examples write `mode: on`; a ConfigMap written by hand says `Interactive` or
    # `ROUND-ROBIN` as readily, and means the same: mode and priorities were always read so.
    path = tmp_path / "kiwi.yaml"
    path.write_text("mode: AUTO\npolicy: Interactive\n"
                    "access:\n  on_violation: Downgrade\n  default: {priorities: [low]}\n")
    config = load(path)
    assert (config.mode, config.policy) == ("auto", "interactive")
    assert config.access is not None and config.access.on_violation == "downgrade"
    assert config.access.default.priorities == frozenset({"LOW"})
    assert from_mapping({"policy": "ROUND-ROBIN"}).policy == "round-robin"


@pytest.mark.parametrize("raw, where, spellings", [
    ({"policy": "fastest"}, "policy", "interactive, pools, round-robin"),
    ({"policy": "Round Robin"}, "policy", "interactive, pools, round-robin"),
    ({"mode": "sometimes"}, "mode", "on, off, auto"),
    ({"access": {"on_violation": "Shrug"}}, "access.on_violation", "refuse, downgrade"),
])
def test_a_word_the_config_does_not_know_is_refused_naming_the_ones_it_does(raw, where, spellings):
    with pytest.raises(ConfigError) as caught:
        from_mapping(raw)
    assert str(caught.value).startswith(f"{where}: must be one of {spellings} (any case), got ")
