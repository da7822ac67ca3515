"""The scheduler DaemonSet's pod as it runs: its init container on a first start and on every
restart after, with exactly the capabilities it is granted, and its metrics served on the port
it declares."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodeside.daemon.main import build_parser

DAEMONSET = Path(__file__).resolve().parents[2] / "nodeside" / "deploy" / "scheduler-daemonset.yaml"
SCHEDULER_UID = 65532


def _pod_spec() -> dict[str, Any]:
    [daemonset] = [d for d in yaml.safe_load_all(DAEMONSET.read_text()) if d]
    spec: dict[str, Any] = daemonset["spec"]["template"]["spec"]
    return spec


def _init_container() -> dict[str, Any]:
    [init] = [c for c in _pod_spec()["initContainers"] if c["name"] == "own-socket-dir"]
    return init


def _run_init_container(socket_dir: Path) -> subprocess.CompletedProcess[str]:
    """The init container's command, as root with only the capabilities its securityContext
    adds (every other one dropped from the bounding set, so root cannot use it), on
    ``socket_dir`` mounted where the manifest mounts the host directory."""
    init = _init_container()
    security = init["securityContext"]
    assert security["runAsUser"] == 0 and security["capabilities"]["drop"] == ["ALL"]
    granted = ",".join(f"+{c.lower()}" for c in security["capabilities"]["add"])
    [mount] = init["volumeMounts"]
    command = [part.replace(mount["mountPath"], str(socket_dir)) for part in init["command"]]
    return subprocess.run(["setpriv", f"--bounding-set=-all,{granted}", "--inh-caps=-all",
                           "--", *command], capture_output=True, text=True, timeout=30)


needs_root_and_setpriv = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="runs the init container's script as root under setpriv (util-linux)")


@needs_root_and_setpriv
def test_the_socket_dir_init_container_succeeds_on_every_restart_of_the_pod(tmp_path):
    socket_dir = tmp_path / "kiwi"
    socket_dir.mkdir(mode=0o700)  # a host path the kubelet created as root
    os.chown(socket_dir, 0, 0)

    first = _run_init_container(socket_dir)
    restart = _run_init_container(socket_dir)  # `kubectl rollout restart`: already handed over

    assert first.returncode == 0, first.stderr
    assert restart.returncode == 0, restart.stderr
    info = socket_dir.stat()
    assert (info.st_uid, info.st_gid) == (SCHEDULER_UID, SCHEDULER_UID)
    assert stat.S_IMODE(info.st_mode) == 0o755


@needs_root_and_setpriv
def test_the_init_container_test_runs_without_the_capabilities_it_is_not_granted(tmp_path):
    # What makes the test above mean something: under the same setpriv, root cannot chmod a
    # directory it does not own, as in the pod.
    socket_dir = tmp_path / "kiwi"
    socket_dir.mkdir(mode=0o700)
    os.chown(socket_dir, SCHEDULER_UID, SCHEDULER_UID)
    granted = ",".join(f"+{c.lower()}" for c in
                       _init_container()["securityContext"]["capabilities"]["add"])
    denied = subprocess.run(["setpriv", f"--bounding-set=-all,{granted}", "--inh-caps=-all",
                             "--", "chmod", "0755", str(socket_dir)],
                            capture_output=True, text=True, timeout=30)
    assert denied.returncode != 0
    assert "Operation not permitted" in denied.stderr


def test_the_scheduler_serves_metrics_on_the_port_its_pod_declares():
    [container] = [c for c in _pod_spec()["containers"] if c["name"] == "kiwi-scheduler"]
    args = build_parser().parse_args(container["args"])
    declared = {p["name"]: p for p in container["ports"]}
    assert args.metrics_port is not None, "metrics are off in Kubernetes"
    assert declared["metrics"]["containerPort"] == args.metrics_port
    assert declared["metrics"]["protocol"] == "TCP"
    # Reachable from outside the pod on the pod's own IP (the kubelet expands $(POD_IP) from
    # the downward API), not on every address the pod has (issue 34.8).
    assert args.metrics_address == "$(POD_IP)"
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert not args.metrics_pod_labels  # pods and namespaces only where the operator asks
