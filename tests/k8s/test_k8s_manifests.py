"""nodeside/deploy: every manifest validates against the Kubernetes schemas (offline, strict),
carries the names the operations guide uses, and runs as tightly as its job allows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_schemas import kubernetes_errors

from nodeside.config import from_mapping
from nodeside.deviceplugin.main import build_parser
from nodeside.deviceplugin.vgpus import Placement

DEPLOY = Path(__file__).resolve().parents[2] / "nodeside" / "deploy"
MANIFESTS = sorted(p for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml")
EXAMPLES = sorted((DEPLOY / "examples").glob("*.yaml"))
KUBERNETES_VERSIONS = ["1.27.0", "1.30.0", "1.33.0"]


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _objects() -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for p in MANIFESTS for d in _docs(p)}


def _daemonset(name: str) -> dict[str, Any]:
    return _objects()[("DaemonSet", name)]


def _pod_spec(name: str) -> dict[str, Any]:
    return _daemonset(name)["spec"]["template"]["spec"]


def _container(name: str) -> dict[str, Any]:
    [main] = [c for c in _pod_spec(name)["containers"] if c["name"] == name]
    return main


def _flag(args: list[str], flag: str) -> str:
    """The value of ``--flag VALUE`` or ``--flag=VALUE`` in a container's args."""
    for i, arg in enumerate(args):
        if arg == flag:
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{flag} not in {args}")


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS + EXAMPLES, ids=lambda p: p.name)
def test_manifest_validates_against_the_kubernetes_schemas(path, version):
    import kubernetes_validate

    for doc in _docs(path):
        if doc["apiVersion"].startswith("kubeflow.org/"):
            continue  # a Kubeflow CRD: its pod parts are checked below
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{path.name}: {doc['kind']}/{doc['metadata']['name']}: "
                        f"{'.'.join(map(str, exc.path))}: {exc.message}")


def test_the_schema_check_catches_a_misspelt_field():
    ds = _daemonset("kiwi-scheduler")
    ds["spec"]["template"]["spec"]["tolerration"] = []
    assert kubernetes_errors(ds) != []


def test_kubeflow_poddefault_injects_valid_pod_environment():
    [pod_default] = _docs(DEPLOY / "examples" / "kubeflow-poddefault.yaml")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
           "spec": {"containers": [{"name": "c", "image": "x:1",
                                    "env": pod_default["spec"]["env"]}]}}
    assert kubernetes_errors(pod) == []
    assert {e["name"] for e in pod_default["spec"]["env"]} == {
        "KIWI_POOL", "KIWI_KAI_PRIORITY_CLASS", "KIWI_POD_NAME", "KIWI_POD_NAMESPACE",
        "KIWI_SPILL_DIR"}


def test_kustomization_lists_every_manifest_and_only_existing_ones():
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(p.name for p in MANIFESTS)
    assert kustomization["namespace"] == "kiwi-system"
    used = {c["image"].split(":")[0] for d in _objects().values() if d["kind"] == "DaemonSet"
            for c in d["spec"]["template"]["spec"]["containers"]
            + d["spec"]["template"]["spec"].get("initContainers", [])}
    assert used == {i["name"] for i in kustomization["images"]}


def test_everything_lives_in_the_kiwi_system_namespace():
    objects = _objects()
    assert ("Namespace", "kiwi-system") in objects
    for (kind, name), obj in objects.items():
        if kind != "Namespace":
            assert obj["metadata"]["namespace"] == "kiwi-system", f"{kind}/{name}"


def test_scheduler_pods_carry_the_label_the_operations_guide_selects_on():
    ds = _daemonset("kiwi-scheduler")
    assert ds["spec"]["selector"]["matchLabels"] == {"name": "kiwi-scheduler"}
    assert ds["spec"]["template"]["metadata"]["labels"]["name"] == "kiwi-scheduler"


def test_scheduler_runs_kiwi_scheduler_with_the_configmap_and_the_default_socket():
    container = _container("kiwi-scheduler")
    assert container["command"] == ["kiwi-scheduler"]
    assert _flag(container["args"], "--socket") == Placement().kiwi_socket
    config_path = _flag(container["args"], "--config")
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in _pod_spec("kiwi-scheduler")["volumes"]}
    assert volumes[mounts[str(Path(config_path).parent)]]["configMap"]["name"] == "kiwi-config"
    # no state file: the guide says runtime changes do not survive a pod restart
    assert "--state-file" not in container["args"]


def test_configmap_holds_a_valid_config_with_the_contract_pools():
    configmap = _objects()[("ConfigMap", "kiwi-config")]
    config = from_mapping(yaml.safe_load(configmap["data"]["config.yaml"]))
    assert config.tq == 30 and config.mode == "on"
    training, simulation = config.pools["training"], config.pools["simulation"]
    assert (training.guarantee, training.weight, training.maximum) == (0.3, 1, 0.7)
    assert (simulation.guarantee, simulation.weight, simulation.maximum) == (0.5, 3, -1)


def test_device_plugin_serves_arrikto_gpu_with_ten_vgpus_per_gpu():
    args = build_parser().parse_args(_container("kiwi-device-plugin")["args"])
    assert args.resource_name == "arrikto.com/gpu"
    assert args.vgpus_per_gpu == 10


def test_device_plugin_hands_pods_the_socket_directory_the_scheduler_serves():
    args = build_parser().parse_args(_container("kiwi-device-plugin")["args"])
    scheduler_volumes = {v["name"]: v for v in _pod_spec("kiwi-scheduler")["volumes"]}
    scheduler_socket = _flag(_container("kiwi-scheduler")["args"], "--socket")
    [socket_mount] = [m for m in _container("kiwi-scheduler")["volumeMounts"]
                      if scheduler_socket.startswith(m["mountPath"] + "/")]
    host_dir = scheduler_volumes[socket_mount["name"]]["hostPath"]["path"]
    assert args.kiwi_socket_host_dir == host_dir
    assert args.kiwi_socket == scheduler_socket


def test_device_plugin_hands_pods_the_shim_its_init_container_installs():
    args = build_parser().parse_args(_container("kiwi-device-plugin")["args"])
    spec = _pod_spec("kiwi-device-plugin")
    volumes = {v["name"]: v for v in spec["volumes"]}
    [install] = spec["initContainers"]
    [mount] = install["volumeMounts"]
    installed = volumes[mount["name"]]["hostPath"]["path"] + "/libkiwi.so"
    assert args.shim_host_path == installed
    assert f"{mount['mountPath']}/libkiwi.so" in install["command"][-1]


def test_device_plugin_mounts_the_kubelets_device_plugin_directory():
    spec = _pod_spec("kiwi-device-plugin")
    volumes = {v["name"]: v for v in spec["volumes"]}
    [mount] = _container("kiwi-device-plugin")["volumeMounts"]
    assert volumes[mount["name"]]["hostPath"]["path"] == "/var/lib/kubelet/device-plugins"
    assert mount["mountPath"] == build_parser().parse_args([]).device_plugin_dir


@pytest.mark.parametrize("name", ["kiwi-scheduler", "kiwi-device-plugin"])
def test_daemonset_tolerates_gpu_taints(name):
    keys = {t["key"] for t in _pod_spec(name)["tolerations"]}
    assert {"nvidia.com/gpu", "arrikto.com/gpu"} <= keys


@pytest.mark.parametrize("name", ["kiwi-scheduler", "kiwi-device-plugin"])
def test_daemonset_pods_are_locked_down(name):
    spec = _pod_spec(name)
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
    for container in spec["containers"] + spec.get("initContainers", []):
        ctx = container["securityContext"]
        assert ctx["allowPrivilegeEscalation"] is False, container["name"]
        assert ctx["readOnlyRootFilesystem"] is True, container["name"]
        assert ctx["capabilities"]["drop"] == ["ALL"], container["name"]
        assert not ctx.get("privileged"), container["name"]
        assert set(ctx["capabilities"].get("add", [])) <= {"CHOWN"}, container["name"]
        resources = container["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]), container["name"]
        assert {"cpu", "memory"} <= set(resources["limits"]), container["name"]


def test_the_scheduler_itself_runs_as_a_non_root_user():
    spec = _pod_spec("kiwi-scheduler")
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    assert "runAsUser" not in _container("kiwi-scheduler")["securityContext"]


def test_notebook_example_gets_its_pool_from_the_kai_queue_label():
    [pod] = _docs(DEPLOY / "examples" / "notebook-pod.yaml")
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["KIWI_POOL"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.labels['kai.scheduler/queue']"
    assert "kai.scheduler/queue" in pod["metadata"]["labels"]
    assert pod["spec"]["containers"][0]["resources"]["limits"]["arrikto.com/gpu"] == 1
