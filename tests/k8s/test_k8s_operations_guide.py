"""The seed's operations guide, step by step, against the scheduler as the DaemonSet runs it.

The kubectl parts of the guide (select the pod by `name=kiwi-scheduler` in `kiwi-system`, exec
`kiwictl` in it, read its log) are checked on the manifests in test_k8s_manifests.py and on the
image in test_k8s_images.py; here the command the DaemonSet runs, with the config the ConfigMap
holds, answers `kiwictl -S on|off` and `-T` with the guide's lines, and exports its pools to KAI.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from k8s_schemas import kai_queue_errors

from nodeside.config import DEFAULT_SOCKET

DEPLOY = Path(__file__).resolve().parents[2] / "nodeside" / "deploy"


def _scheduler_args() -> list[str]:
    daemonset = yaml.safe_load((DEPLOY / "scheduler-daemonset.yaml").read_text())
    [container] = daemonset["spec"]["template"]["spec"]["containers"]
    return list(container["args"])


@pytest.fixture
def pod(start_daemon, tmp_path):
    """kiwi-scheduler started with the DaemonSet's arguments; its socket moved to a temporary
    directory and its config file written from the ConfigMap."""
    configmap = yaml.safe_load((DEPLOY / "configmap.yaml").read_text())
    config = tmp_path / "config.yaml"
    config.write_text(configmap["data"]["config.yaml"])
    args = _scheduler_args()
    assert args[args.index("--socket") + 1] == DEFAULT_SOCKET  # kiwictl's default finds it
    del args[args.index("--socket"):args.index("--socket") + 2]
    args[args.index("--config") + 1] = str(config)
    # What the kubelet does with the container's env (the downward API's pod IP), and a free
    # port for the metrics instead of the pod's own 9466.
    args = [arg.replace("$(POD_IP)", "127.0.0.1") for arg in args]
    args[args.index("--metrics-port") + 1] = "0"
    return start_daemon(*args)


def _kiwictl(pod, *args: str) -> subprocess.CompletedProcess[str]:
    # In the pod, KIWI_SOCKET is unset and kiwictl's default is the DaemonSet's socket; here the
    # socket lives elsewhere, so say where.
    return subprocess.run([sys.executable, "-m", "nodeside.ctl", *args],
                          env={**os.environ, "KIWI_SOCKET": pod.socket}, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("mode", ["on", "off"])
def test_toggling_the_scheduler_prints_and_logs_what_the_guide_shows(pod, mode):
    done = _kiwictl(pod, "-S", mode)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"[INFO] Successfully turned {mode} the Kiwi scheduler."
    pod.wait_log(rf"\[INFO\] Received SCHED_{mode.upper()} from <UNREGISTERED> \[FD=\d+\]")
    pod.wait_log(rf"\[INFO\] Scheduler status changed to {mode.upper()}, broadcasting it \.\.\.")


def test_setting_the_tq_prints_the_guide_line(pod):
    done = _kiwictl(pod, "-T", "10")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[INFO] Successfully set the Kiwi scheduler's TQ to 10 seconds."


def test_the_scheduler_starts_with_the_configmaps_tq_mode_and_pools(pod):
    done = _kiwictl(pod, "status", "--json")
    assert done.returncode == 0, done.stderr
    status = yaml.safe_load(done.stdout)
    assert status["mode"] == "on" and status["tq"] == 30
    pools = {p["name"]: p for p in status["pools"]}
    assert {"training", "simulation"} <= set(pools)


def test_kiwictl_exports_the_running_pools_as_kai_queues(pod):
    done = _kiwictl(pod, "pools", "export", "--kai", "--gpus", "100")
    assert done.returncode == 0, done.stderr
    queues = {q["metadata"]["name"]: q for q in yaml.safe_load_all(done.stdout)}
    assert queues["training"]["spec"]["resources"]["gpu"] == {
        "quota": 30, "overQuotaWeight": 1, "limit": 70}
    assert queues["simulation"]["spec"]["resources"]["gpu"] == {
        "quota": 50, "overQuotaWeight": 3, "limit": -1}
    assert all(kai_queue_errors(q) == [] for q in queues.values())


def test_kiwictl_exports_a_config_file_without_a_daemon(tmp_path):
    configmap = yaml.safe_load((DEPLOY / "configmap.yaml").read_text())
    config = tmp_path / "config.yaml"
    config.write_text(configmap["data"]["config.yaml"])
    done = subprocess.run([sys.executable, "-m", "nodeside.ctl", "--socket",
                           str(tmp_path / "none.sock"), "pools", "export", "--kai", "--config",
                           str(config), "--parent", "kiwi"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    names = [q["metadata"]["name"] for q in yaml.safe_load_all(done.stdout)]
    assert names == ["kiwi", "training", "simulation"]


def test_pools_export_needs_a_format():
    done = subprocess.run([sys.executable, "-m", "nodeside.ctl", "pools", "export"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--kai" in done.stderr
