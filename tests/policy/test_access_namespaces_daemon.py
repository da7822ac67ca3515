"""Access rules by namespace in a running daemon, over its real socket.

The daemon reads the pod list from a stand-in API server (pod_api_standin.py) and each peer's
cgroup file under a fake /proc root (the hidden ``--proc-root``), keyed by the peer's real pid
as ``SO_PEERCRED`` gives it. The peer runs as another uid when the tests run as root, whom the
policy exempts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pod_api_standin import PodApi, pod_api
from support import wait_for
from test_access_daemon import NOBODY, SYSTEM_PYTHON
from test_access_daemon import PEER as SPEAKER
from test_access_namespaces import TEAM_A_POD, TEAM_B_POD, fake_proc

UNLISTED_POD = "cccccccc-5678-90ef-1234-567890abcdef"

CONFIG = """\
socket_mode: "0666"
access:
  on_violation: {on_violation}
  default: {{pools: [default], priorities: [NORMAL, LOW]}}
  rules:
    - {{namespaces: [team-a], pools: [default], priorities: [HIGH, NORMAL, LOW]}}
"""

# Prints its pid, waits until the test has put its pod in the fake /proc, then speaks as
# test_access_daemon's peer does.
PEER = """\
import os, sys
print(os.getpid(), flush=True)
sys.stdin.readline()
""" + SPEAKER


def register_from_pod(daemon_socket: str, proc_root: Path, pod_uid: str | None,
                      claim: dict) -> dict:
    """Register as a peer whose pid the fake /proc puts in ``pod_uid``; the register's answer."""
    as_other = os.geteuid() == 0
    python = (SYSTEM_PYTHON or "python3") if as_other else sys.executable
    messages = [{"op": "hello", "version": 1}, {"op": "register", **claim},
                {"op": "status"}]
    peer = subprocess.Popen([python, "-c", PEER, daemon_socket, json.dumps(messages)],
                            cwd="/", stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            **({"user": NOBODY, "group": NOBODY, "extra_groups": []}
                               if as_other else {}))
    assert peer.stdout is not None and peer.stdin is not None
    pid = int(peer.stdout.readline())
    if pod_uid is not None:
        fake_proc(proc_root, pid, pod_uid)
    out, err = peer.communicate("go\n", timeout=30)
    assert peer.returncode == 0, err
    _, registered, status = (json.loads(line) for line in out.splitlines())
    registered["status"] = status["status"]
    return registered


@pytest.fixture
def api() -> Iterator[PodApi]:
    with pod_api() as standin:
        standin.pods = {"gpu-node": [(TEAM_A_POD, "team-a", "nb-a"),
                                     (TEAM_B_POD, "team-b", "nb-b")]}
        yield standin


@pytest.fixture
def namespaced_daemon(start_daemon, scratch, api, monkeypatch):  # type: ignore[no-untyped-def]
    def start(on_violation: str):  # type: ignore[no-untyped-def]
        config = scratch / "kiwi.yaml"
        config.write_text(CONFIG.format(on_violation=on_violation))
        proc_root = scratch / "proc"
        proc_root.mkdir()
        monkeypatch.setenv("NODE_NAME", "gpu-node")
        daemon = start_daemon("--tq", "5", "--config", str(config), "--proc-root",
                              str(proc_root), "--kube-api", api.url)
        os.chmod(os.path.dirname(daemon.socket), 0o755)  # let the other user reach the socket
        daemon.wait_log(r"Read the namespaces of 2 pod\(s\) on node gpu-node", timeout=30)
        return daemon, proc_root
    return start


needs_peer = pytest.mark.skipif(os.geteuid() == 0 and SYSTEM_PYTHON is None,
                                reason="as root, the peer runs as nobody with a system python3")


@needs_peer
def test_a_rule_for_namespace_team_a_lets_a_peer_in_team_a_claim_high(namespaced_daemon):  # type: ignore[no-untyped-def]
    daemon, proc_root = namespaced_daemon("refuse")
    answer = register_from_pod(daemon.socket, proc_root, TEAM_A_POD,
                               {"name": "a", "priority": "HIGH",
                                "labels": {"namespace": "kube-system"}})
    assert answer["op"] == "registered", answer
    (entry,) = answer["status"]["clients"]
    assert entry["priority"] == "HIGH"
    assert entry["namespace"] == "team-a"
    assert entry["labels"]["namespace"] == "team-a"  # the verified value, not the claimed one


@needs_peer
def test_a_peer_whose_pod_is_in_another_namespace_may_not_claim_high(namespaced_daemon):  # type: ignore[no-untyped-def]
    daemon, proc_root = namespaced_daemon("refuse")
    # Saying team-a in its labels changes nothing: only the API server's word counts.
    answer = register_from_pod(daemon.socket, proc_root, TEAM_B_POD,
                               {"name": "b", "priority": "HIGH",
                                "labels": {"namespace": "team-a"}})
    assert answer["op"] == "error" and answer["code"] == "permission", answer
    assert "in namespace team-b may not use pool 'default' at priority HIGH" in answer["message"]


@needs_peer
def test_a_peer_in_an_unknown_pod_or_no_pod_is_downgraded(namespaced_daemon, api):  # type: ignore[no-untyped-def]
    daemon, proc_root = namespaced_daemon("downgrade")
    for pod in (UNLISTED_POD, None):
        answer = register_from_pod(daemon.socket, proc_root, pod,
                                   {"name": f"x-{pod}", "priority": "HIGH"})
        assert answer["op"] == "registered", answer
        (entry,) = [c for c in answer["status"]["clients"] if c["name"] == f"x-{pod}"]
        assert (entry["priority"], entry["namespace"]) == ("NORMAL", None)
    daemon.wait_log("may not use pool 'default' at priority HIGH")
    assert "Traceback" not in daemon.log()


@needs_peer
def test_without_the_namespaces_component_rules_by_namespace_match_nobody_and_one_line_says_so(
        start_daemon, scratch, monkeypatch):  # type: ignore[no-untyped-def]
    # The base deployment: in a pod, so the API's address is in the environment (a port where
    # nothing answers: the daemon must not even try), but no NODE_NAME and no token.
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "1")
    monkeypatch.delenv("NODE_NAME", raising=False)
    config = scratch / "kiwi.yaml"
    config.write_text('socket_mode: "0666"\n')
    proc_root = scratch / "proc"
    proc_root.mkdir()
    daemon = start_daemon("--tq", "5", "--config", str(config), "--proc-root", str(proc_root))
    os.chmod(os.path.dirname(daemon.socket), 0o755)
    # A policy without namespaces: one line at INFO, nothing alarming.
    daemon.wait_log(r"\[INFO\] Namespaces in the access policy are off \(NODE_NAME")

    # Rules by namespace arrive with a reload: one warning, however often it is reloaded.
    config.write_text(CONFIG.format(on_violation="refuse"))
    for reloads in (1, 2, 3):
        assert daemon.process is not None
        daemon.process.send_signal(signal.SIGHUP)
        wait_for(lambda n=reloads: daemon.log().count("Config reloaded") >= n, 10,
                 what="the reload")
    answer = register_from_pod(daemon.socket, proc_root, TEAM_A_POD,
                               {"name": "a", "priority": "HIGH",
                                "labels": {"namespace": "team-a"}})
    # Fail closed: the pod is in team-a by its cgroup, but nothing can verify it.
    assert answer["op"] == "error" and answer["code"] == "permission", answer
    log = daemon.log()
    lines = [line for line in log.splitlines() if "namespace" in line.lower()
             and ("off" in line or "match nobody" in line)]
    assert len(lines) == 2, log
    assert "[WARN] The access policy names Kubernetes namespaces, but NODE_NAME" in lines[1]
    assert "nodeside/deploy/components/namespaces" in lines[1]
    assert "Cannot list" not in log and "Traceback" not in log
