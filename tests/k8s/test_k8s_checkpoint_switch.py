"""nodeside/deploy-checkpoint: the documented switch that lets the node daemon checkpoint
kernels (host PID namespace, CAP_SYS_PTRACE, the GPU for compute), built by kustomize and
validated against the Kubernetes schemas; the base manifests stay without any of it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
KUBERNETES_VERSIONS = ["1.27.0", "1.33.0"]

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None,
                                reason="kubectl (its built-in kustomize) is not installed")


def build(directory: str) -> list[dict[str, Any]]:
    result = subprocess.run(["kubectl", "kustomize", str(REPO / "nodeside" / directory)],
                            check=True, capture_output=True, text=True)
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def scheduler_pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [ds] = [d for d in docs if d["kind"] == "DaemonSet" and
            d["metadata"]["name"] == "kiwi-scheduler"]
    return ds["spec"]["template"]["spec"]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_checkpoint_variant_validates_against_the_kubernetes_schemas(version) -> None:
    import kubernetes_validate

    for doc in build("deploy-checkpoint"):
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_checkpoint_variant_gives_the_scheduler_host_pids_ptrace_and_the_gpu() -> None:
    pod = scheduler_pod(build("deploy-checkpoint"))
    assert pod["hostPID"] is True
    [container] = [c for c in pod["containers"] if c["name"] == "kiwi-scheduler"]
    capabilities = container["securityContext"]["capabilities"]
    assert capabilities == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert "compute" in env["NVIDIA_DRIVER_CAPABILITIES"].split(",")
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"


def test_the_checkpoint_variant_leaves_the_device_plugin_alone() -> None:
    docs = build("deploy-checkpoint")
    [plugin] = [d for d in docs if d["kind"] == "DaemonSet" and
                d["metadata"]["name"] == "kiwi-device-plugin"]
    assert not plugin["spec"]["template"]["spec"].get("hostPID")


def test_the_base_manifests_stay_without_host_pids() -> None:
    pod = scheduler_pod(build("deploy"))
    assert not pod.get("hostPID")
