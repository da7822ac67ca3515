"""nodeside/deploy-namespaces: the opt-in switch for Kubernetes namespaces in the access policy
(host PID namespace, a token whose account may only read pods, NODE_NAME), built by kustomize
and validated against the Kubernetes schemas; alone, with the checkpoint switch, and the base
without any of it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_kustomize import (
    KUBERNETES_VERSIONS,
    NODESIDE,
    build,
    daemonset,
    needs_kubectl,
    scheduler_container,
    scheduler_pod,
)

RBAC_KINDS = {"ServiceAccount", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}

pytestmark = needs_kubectl


def overlay(tmp_path: Path, *components: str) -> Path:
    """A site's own overlay: the base with the named components of nodeside/deploy/components."""
    def rel(path: Path) -> str:
        return os.path.relpath(path, tmp_path)

    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [rel(NODESIDE / "deploy")],
        "components": [rel(NODESIDE / "deploy" / "components" / c) for c in components],
    }))
    return tmp_path


def by_kind_and_name(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


@pytest.fixture(scope="module")
def namespaces() -> list[dict[str, Any]]:
    return build(NODESIDE / "deploy-namespaces")


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_namespaces_variant_validates_against_the_kubernetes_schemas(
        namespaces, version) -> None:
    import kubernetes_validate

    assert {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"} <= {
        d["kind"] for d in namespaces}
    for doc in namespaces:
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_namespaces_variant_gives_the_scheduler_host_pids_and_its_accounts_token(
        namespaces) -> None:
    pod = scheduler_pod(namespaces)
    assert pod["hostPID"] is True
    assert pod["serviceAccountName"] == "kiwi-scheduler"
    assert pod["automountServiceAccountToken"] is True


def test_the_namespaces_variant_adds_neither_root_nor_capabilities(namespaces) -> None:
    pod = scheduler_pod(namespaces)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    container = scheduler_container(namespaces)
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"


def test_the_scheduler_lists_the_pods_of_the_node_it_runs_on(namespaces) -> None:
    env = {e["name"]: e for e in scheduler_container(namespaces)["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # The base's variables are still there: the patch merges into the list, by name.
    assert {"NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "PYTHONUNBUFFERED"} <= set(env)


def test_the_scheduler_may_only_read_pods_on_the_api_server(namespaces) -> None:
    objects = by_kind_and_name(namespaces)
    account = objects[("ServiceAccount", "kiwi-scheduler")]
    assert account["metadata"]["namespace"] == "kiwi-system"
    assert account["automountServiceAccountToken"] is False  # the pod asks for it itself
    role = objects[("ClusterRole", "kiwi-scheduler-pod-reader")]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"],
                              "verbs": ["get", "list", "watch"]}]
    binding = objects[("ClusterRoleBinding", "kiwi-scheduler-pod-reader")]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                  "kind": "ClusterRole", "name": "kiwi-scheduler-pod-reader"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kiwi-scheduler",
                                    "namespace": "kiwi-system"}]
    # Nothing else grants anything: one role, one binding, one account.
    rbac = sorted(k for k in objects if k[0] in RBAC_KINDS)
    assert rbac == [("ClusterRole", "kiwi-scheduler-pod-reader"),
                    ("ClusterRoleBinding", "kiwi-scheduler-pod-reader"),
                    ("ServiceAccount", "kiwi-scheduler")]
    for (kind, name), obj in objects.items():
        if kind in ("ClusterRole", "ClusterRoleBinding"):
            assert "namespace" not in obj["metadata"], f"{kind}/{name}"
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "kiwi", f"{kind}/{name}"


def test_the_namespaces_variant_leaves_the_device_plugin_alone(namespaces) -> None:
    plugin = daemonset(namespaces, "kiwi-device-plugin")["spec"]["template"]["spec"]
    assert not plugin.get("hostPID")
    assert plugin["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in plugin


def test_the_base_has_no_host_pids_no_token_and_no_rbac() -> None:
    docs = build(NODESIDE / "deploy")
    assert not {d["kind"] for d in docs} & RBAC_KINDS
    pod = scheduler_pod(docs)
    assert not pod.get("hostPID")
    assert pod["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in pod
    assert "NODE_NAME" not in {e["name"] for e in scheduler_container(docs)["env"]}


@pytest.mark.parametrize("components", [("namespaces",), ("checkpoint",),
                                        ("checkpoint", "namespaces"),
                                        ("namespaces", "checkpoint")], ids="+".join)
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_a_sites_overlay_with_either_component_or_both_builds_and_validates(
        tmp_path, components, version) -> None:
    import kubernetes_validate

    docs = build(overlay(tmp_path, *components))
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)
    pod = scheduler_pod(docs)
    container = scheduler_container(docs)
    env = {e["name"]: e for e in container["env"]}
    # Each component needs the host's pids, and gets them alone or with the other.
    assert pod["hostPID"] is True
    namespaces, checkpoint = "namespaces" in components, "checkpoint" in components
    assert ("NODE_NAME" in env) is namespaces
    assert pod["automountServiceAccountToken"] is namespaces
    assert bool({d["kind"] for d in docs} & RBAC_KINDS) is namespaces
    assert ("SYS_PTRACE" in container["securityContext"]["capabilities"].get("add", [])) \
        is checkpoint
    assert ("compute" in env["NVIDIA_DRIVER_CAPABILITIES"]["value"]) is checkpoint
    assert (pod["securityContext"]["runAsUser"] == 0) is checkpoint
    # No duplicate env entries or containers from the two patches.
    assert len(env) == len(container["env"])
    assert [c["name"] for c in pod["containers"]] == ["kiwi-scheduler"]
