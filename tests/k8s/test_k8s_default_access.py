"""The shipped ConfigMap is safe by default (issue 34.9): anyone but root gets NORMAL or LOW in
pool default, so nobody's claim preempts another user's work unless the operator allows it."""

from __future__ import annotations

from pathlib import Path

import yaml
from other_users import NOBODY, Peer, as_user, needs_root, open_to_everyone

CONFIGMAP = Path(__file__).resolve().parents[2] / "nodeside" / "deploy" / "configmap.yaml"


def shipped_config(scratch: Path) -> str:
    [configmap] = [d for d in yaml.safe_load_all(CONFIGMAP.read_text()) if d]
    path = scratch / "config.yaml"
    path.write_text(configmap["data"]["config.yaml"])
    return str(path)


@needs_root
def test_a_user_claiming_high_in_a_guaranteed_pool_gets_normal_in_default(
        start_daemon, scratch) -> None:
    daemon = start_daemon("--config", shipped_config(scratch))
    open_to_everyone(daemon.directory)
    claim = {"op": "register", "name": "greedy", "pool": "training", "priority": "HIGH"}
    reply = as_user(NOBODY, lambda: Peer(daemon.socket).request(claim))
    assert reply["op"] == "registered", reply
    assert (reply["pool"], reply["priority"]) == ("default", "NORMAL")
    assert reply["warning"]
    daemon.wait_log(rf"greedy \(c\d+, uid {NOBODY}\): ")
    # Root (an admin) may still claim what the pools offer.
    admin = Peer(daemon.socket).request({**claim, "name": "operator"})
    assert admin["op"] == "registered" and admin.get("pool") is None  # its claim stood


def test_the_shipped_policy_says_what_everyone_gets() -> None:
    [configmap] = [d for d in yaml.safe_load_all(CONFIGMAP.read_text()) if d]
    access = yaml.safe_load(configmap["data"]["config.yaml"])["access"]
    assert access["default"] == {"pools": ["default"], "priorities": ["NORMAL", "LOW"]}
