"""The disk tier's spill directory on Kubernetes (issue 42): a notebook pod, as the examples make
one, gets ``KIWI_SPILL_DIR`` on a node-local volume that is disk, not memory, and that cannot get
the pod evicted for its size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_schemas import kubernetes_errors

EXAMPLES = Path(__file__).resolve().parents[2] / "nodeside" / "deploy" / "examples"


def _doc(name: str) -> dict[str, Any]:
    [doc] = [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]
    return doc


def _notebook_pod() -> tuple[dict[str, Any], dict[str, Any]]:
    pod = _doc("notebook-pod.yaml")
    return pod["spec"], pod["spec"]["containers"][0]


def _pod_default() -> tuple[dict[str, Any], dict[str, Any]]:
    """The PodDefault's injections, as the pod spec and container they become."""
    spec = _doc("kubeflow-poddefault.yaml")["spec"]
    container = {"name": "c", "image": "x:1", "env": spec["env"],
                 "volumeMounts": spec["volumeMounts"]}
    return {"containers": [container], "volumes": spec["volumes"]}, container


@pytest.mark.parametrize("example", [_notebook_pod, _pod_default], ids=["pod", "poddefault"])
def test_a_notebook_spills_to_a_node_local_disk_volume_at_kiwi_spill_dir(example: Any) -> None:
    spec, container = example()
    env = {e["name"]: e.get("value") for e in container["env"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volume_name = mounts[env["KIWI_SPILL_DIR"]]
    [volume] = [v for v in spec["volumes"] if v["name"] == volume_name]
    # Disk, not a tmpfs; no size limit the kubelet would evict the pod for.
    assert volume["emptyDir"].get("medium", "") == ""
    assert "sizeLimit" not in volume["emptyDir"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"}, "spec": spec}
    assert kubernetes_errors(pod) == []


def test_the_notebook_asks_for_room_for_its_spill_files_without_a_limit() -> None:
    _, container = _notebook_pod()
    assert "ephemeral-storage" in container["resources"]["requests"]
    assert "ephemeral-storage" not in container["resources"]["limits"]


def test_the_configmaps_tier_keys_are_valid_config_once_uncommented() -> None:
    from nodeside.config import from_mapping

    configmap = Path(__file__).resolve().parents[2] / "nodeside" / "deploy" / "configmap.yaml"
    [doc] = [d for d in yaml.safe_load_all(configmap.read_text()) if d]
    text = doc["data"]["config.yaml"]
    shown = [line.split("#", 1)[1].strip() for line in text.splitlines()
             if line.strip().startswith(("#   host_budget:", "#   spill_after:"))]
    assert len(shown) == 2
    config = from_mapping({**yaml.safe_load(text), **yaml.safe_load("\n".join(shown))})
    assert config.host_budget is not None and config.spill_after is not None
