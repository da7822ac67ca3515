"""Pools exported as KAI Scheduler Queues, and KAI priority classes mapped to Kiwi priorities."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from k8s_schemas import kai_queue_errors

from nodeside import kai
from nodeside.config import parse_pools

REPO = Path(__file__).resolve().parents[2]
# The pools of docs/interfaces.md section 6 (the seed's Training and Simulation pools).
SEED_POOLS = {"training": {"guarantee": 0.3, "weight": 1, "maximum": 0.7},
              "simulation": {"guarantee": 0.5, "weight": 3, "maximum": -1}}


def _gpu(queue: dict) -> dict:
    return queue["spec"]["resources"]["gpu"]


def test_exported_queues_validate_against_the_kai_queue_crd_schema():
    queues = kai.queues(parse_pools(SEED_POOLS), gpus=100, parent="kiwi")
    assert len(queues) == 3
    for queue in queues:
        assert kai_queue_errors(queue) == []
        assert queue["apiVersion"] == "scheduling.run.ai/v2" and queue["kind"] == "Queue"


def test_the_schema_check_catches_a_misspelt_field():
    queue = kai.queue(parse_pools(SEED_POOLS)["training"])
    _gpu(queue)["overQuotaWieght"] = _gpu(queue).pop("overQuotaWeight")
    assert kai_queue_errors(queue) != []


def test_seed_pools_on_100_gpus_become_the_seeds_queues():
    training, simulation = kai.queues(parse_pools(SEED_POOLS), gpus=100)
    assert training["metadata"]["name"] == "training"
    assert _gpu(training) == {"quota": 30, "overQuotaWeight": 1, "limit": 70}
    assert simulation["metadata"]["name"] == "simulation"
    assert _gpu(simulation) == {"quota": 50, "overQuotaWeight": 3, "limit": -1}


def test_without_gpus_the_quotas_are_fractions_of_one_gpu():
    training = kai.queues(parse_pools(SEED_POOLS))[0]
    assert _gpu(training) == {"quota": 0.3, "overQuotaWeight": 1, "limit": 0.7}


def test_a_parent_queue_comes_first_and_every_pool_is_its_child():
    parent, *children = kai.queues(parse_pools(SEED_POOLS), gpus=8, parent="kiwi")
    assert parent["metadata"]["name"] == "kiwi"
    assert "parentQueue" not in parent["spec"]
    assert _gpu(parent) == {"quota": 8, "overQuotaWeight": 1, "limit": -1}
    assert {c["spec"]["parentQueue"] for c in children} == {"kiwi"}


#: KAI's Queue semantics, per resource of spec.resources (cpu in millicores, memory in bytes,
#: gpu in GPUs): ``quota`` is what the queue deserves, ``limit`` the most it may use, -1 means
#: no bound, and a resource or field the queue leaves out reads as 0. A pod joins a queue only if
#: every resource it requests stays within the queue's limit (and its parent's).
KAI_MISSING = 0.0


def kai_bound(queue: dict, resource: str, field: str) -> float:
    return float(queue["spec"]["resources"].get(resource, {}).get(field, KAI_MISSING))


def kai_admits(queues: list[dict], name: str, requests: dict[str, float]) -> bool:
    by_name = {q["metadata"]["name"]: q for q in queues}
    queue: dict | None = by_name[name]
    while queue is not None:
        for resource, amount in requests.items():
            limit = kai_bound(queue, resource, "limit")
            if limit != -1 and amount > limit:
                return False
        parent = queue["spec"].get("parentQueue")
        queue = by_name[parent] if parent else None
    return True


#: A notebook pod: a share of a GPU, and the CPU and memory every pod requests.
NOTEBOOK_POD = {"cpu": 500.0, "memory": 4.0 * 2**30, "gpu": 0.5}


@pytest.mark.parametrize("parent", [None, "kiwi"])
def test_every_exported_queue_admits_a_pod_that_requests_cpu_and_memory(parent):
    queues = kai.queues(parse_pools(SEED_POOLS), gpus=8, parent=parent)
    for pool in SEED_POOLS:
        assert kai_admits(queues, pool, NOTEBOOK_POD), f"KAI refuses {pool}'s pods"


def test_cpu_and_memory_are_unlimited_like_kais_default_queues():
    for queue in kai.queues(parse_pools(SEED_POOLS), gpus=8, parent="kiwi"):
        for resource in ("cpu", "memory"):
            assert queue["spec"]["resources"][resource] == {
                "quota": -1, "overQuotaWeight": 1, "limit": -1}
        assert kai_queue_errors(queue) == []


def test_the_kai_semantics_refuse_what_a_queue_leaves_out():
    # What makes the two tests above mean something: KAI's reading of a gpu-only queue.
    gpu_only = {"metadata": {"name": "q"},
                "spec": {"resources": {"gpu": {"quota": 1, "overQuotaWeight": 1, "limit": -1}}}}
    assert not kai_admits([gpu_only], "q", NOTEBOOK_POD)
    assert kai_admits([gpu_only], "q", {"gpu": 0.5})
    assert not kai_admits(kai.queues(parse_pools(SEED_POOLS), gpus=1), "training",
                          {"gpu": 0.8})  # over its maximum of 0.7


def test_a_pool_name_that_cannot_be_a_queue_name_is_refused_with_the_reason():
    with pytest.raises(kai.KaiExportError, match="Team_A"):
        kai.queues(parse_pools({"Team_A": {"guarantee": 0.5}}))


def test_no_gpus_is_refused():
    with pytest.raises(kai.KaiExportError, match="positive"):
        kai.queues(parse_pools(SEED_POOLS), gpus=0)


@pytest.mark.parametrize(("kai_class", "kiwi"), [
    ("train", "LOW"), ("build-preemptible", "LOW"), ("build", "NORMAL"),
    ("inference", "HIGH"), (99, "LOW"), (100, "NORMAL"), ("124", "NORMAL"), (1000, "HIGH")])
def test_kai_priority_classes_map_to_kiwi_priorities(kai_class, kiwi):
    assert kai.priority_for(kai_class) == kiwi


def test_an_unknown_priority_class_is_an_error_naming_the_known_ones():
    with pytest.raises(kai.UnknownPriorityClass) as err:
        kai.priority_for("urgent")
    assert "train" in str(err.value) and "urgent" in str(err.value)


def test_module_command_prints_queues_of_a_config_file(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"tq": 30, "pools": SEED_POOLS}, sort_keys=False))
    done = subprocess.run([sys.executable, "-m", "nodeside.kai", "queues", "--config",
                           str(config), "--gpus", "10"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    queues = list(yaml.safe_load_all(done.stdout))
    assert [q["metadata"]["name"] for q in queues] == ["training", "simulation"]
    assert all(kai_queue_errors(q) == [] for q in queues)


def test_partial_pools_are_exported_with_a_warning_about_preemption(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"pools": {"research": {"guarantee": 0.2}}}))
    done = subprocess.run([sys.executable, "-m", "nodeside.kai", "queues", "--config",
                           str(config)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    assert "research" in done.stderr and "preemption" in done.stderr
    assert _gpu(yaml.safe_load(done.stdout)) == {"quota": 0.2, "overQuotaWeight": 1,
                                                 "limit": -1}
