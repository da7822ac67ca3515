"""nodeside/deploy-checkpoint: the documented switch that lets the node daemon checkpoint
kernels (host PID namespace, CAP_SYS_PTRACE, the GPU for compute), built by kustomize and
validated against the Kubernetes schemas; the base manifests stay without any of it."""

from __future__ import annotations

import pytest
from k8s_kustomize import (
    KUBERNETES_VERSIONS,
    NODESIDE,
    build,
    daemonset,
    needs_kubectl,
    scheduler_container,
    scheduler_pod,
)

pytestmark = needs_kubectl


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_checkpoint_variant_validates_against_the_kubernetes_schemas(version) -> None:
    import kubernetes_validate

    for doc in build(NODESIDE / "deploy-checkpoint"):
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_checkpoint_variant_gives_the_scheduler_host_pids_ptrace_and_the_gpu() -> None:
    docs = build(NODESIDE / "deploy-checkpoint")
    assert scheduler_pod(docs)["hostPID"] is True
    container = scheduler_container(docs)
    capabilities = container["securityContext"]["capabilities"]
    assert capabilities == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert "compute" in env["NVIDIA_DRIVER_CAPABILITIES"].split(",")
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"


def test_the_checkpoint_variant_leaves_the_device_plugin_alone() -> None:
    docs = build(NODESIDE / "deploy-checkpoint")
    plugin = daemonset(docs, "kiwi-device-plugin")
    assert not plugin["spec"]["template"]["spec"].get("hostPID")


def test_the_base_manifests_stay_without_host_pids() -> None:
    pod = scheduler_pod(build(NODESIDE / "deploy"))
    assert not pod.get("hostPID")
