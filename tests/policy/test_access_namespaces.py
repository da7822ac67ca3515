"""Access rules by Kubernetes namespace: the namespace from the API server, never the client.

The pod list comes from a real HTTP server standing in for the API server (pod_api_standin.py);
the peer's pod from a cgroup file under a fake /proc root.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import ssl
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pod_api_standin import pod_api

from nodeside.config import ConfigError, parse_access
from nodeside.daemon.kube import (
    PodListError,
    PodNamespaces,
    PodSource,
    in_cluster_or_why_not,
    list_namespaces,
)
from nodeside.model import Registration
from nodeside.scheduler.access import judge

TEAM_A_POD = "1234abcd-5678-90ef-1234-567890abcdef"
TEAM_B_POD = "ffffffff-5678-90ef-1234-567890abcdef"
LATE_POD = "eeeeeeee-5678-90ef-1234-567890abcdef"
OTHER_NODES_POD = "dddddddd-5678-90ef-1234-567890abcdef"

POLICY = {
    "on_violation": "refuse",
    "default": {"pools": ["default"], "priorities": ["NORMAL", "LOW"]},
    "rules": [{"namespaces": ["team-a"], "pools": ["default"], "priorities": ["HIGH"]}],
}


def fake_proc(root: Path, pid: int, pod_uid: str) -> None:
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    (root / str(pid) / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
        f"{pod_uid.replace('-', '_')}.slice/cri-containerd-{'ab' * 32}.scope\n")


def test_the_pod_list_of_this_node_maps_pod_uids_to_namespaces(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    with pod_api() as api:
        api.pods = {"node-1": [(TEAM_A_POD, "team-a", "nb-0"), (TEAM_B_POD, "team-b", "nb-1")],
                    "node-2": [(OTHER_NODES_POD, "team-a", "nb-2")]}
        found = list_namespaces(PodSource(api.url, "node-1", token_file=token))
    assert found == {TEAM_A_POD: "team-a", TEAM_B_POD: "team-b"}
    path, headers = api.requests[0]
    assert path == "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1"
    assert headers["Authorization"] == "Bearer s3cret"


def test_an_api_server_that_refuses_the_list_is_a_pod_list_error() -> None:
    with pod_api() as api:
        api.status = 403
        with pytest.raises(PodListError, match="403"):
            list_namespaces(PodSource(api.url, "node-1"))


def test_an_unreachable_api_server_is_a_pod_list_error() -> None:
    with pytest.raises(PodListError):
        list_namespaces(PodSource("http://127.0.0.1:1", "node-1"), timeout=5)


def test_in_cluster_the_api_server_and_node_come_from_the_pods_environment(
        tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443",
           "NODE_NAME": "gpu-7"}
    (tmp_path / "token").write_text("t")
    source = PodSource.in_cluster(env, tmp_path)
    assert source == PodSource("https://10.0.0.1:443", "gpu-7", tmp_path / "token",
                               tmp_path / "ca.crt")
    assert PodSource.in_cluster({}) is None
    assert PodSource.in_cluster({**env, "NODE_NAME": ""}, tmp_path) is None


def test_without_the_namespaces_component_the_daemon_says_why_and_lists_nothing(
        tmp_path: Path) -> None:
    # The base deployment: a pod (the API's address is in every pod's environment), but no
    # NODE_NAME and no token. The API is then never asked (it would only refuse, again and
    # again); the reason is for the daemon's one line about it.
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert in_cluster_or_why_not(env, tmp_path) == (
        None, "NODE_NAME (the downward API's spec.nodeName) is not set")
    assert in_cluster_or_why_not({**env, "NODE_NAME": "gpu-7"}, tmp_path) == (
        None, f"no service account token is mounted at {tmp_path / 'token'}")
    # Outside Kubernetes there is nothing to say.
    assert in_cluster_or_why_not({"NODE_NAME": "gpu-7"}, tmp_path) == (None, None)


def test_the_cache_gives_a_peer_the_namespace_of_its_pod(tmp_path: Path) -> None:
    fake_proc(tmp_path, 101, TEAM_A_POD)
    fake_proc(tmp_path, 102, TEAM_B_POD)

    async def scenario() -> tuple[str | None, ...]:
        cache = PodNamespaces(PodSource(api.url, "node-1"), tmp_path)
        cache.start()
        try:
            await asyncio.wait_for(cache.listed.wait(), 30)
            return cache.of(101), cache.of(102), cache.of(103), cache.of(None)
        finally:
            await cache.close()

    with pod_api() as api:
        api.pods = {"node-1": [(TEAM_A_POD, "team-a", "nb-0"), (TEAM_B_POD, "team-b", "nb-1")]}
        assert asyncio.run(scenario()) == ("team-a", "team-b", None, None)


def test_a_pod_missing_from_the_cache_is_listed_again_soon_not_at_once(tmp_path: Path) -> None:
    fake_proc(tmp_path, 201, LATE_POD)

    async def scenario() -> tuple[str | None, str | None]:
        cache = PodNamespaces(PodSource(api.url, "node-1"), tmp_path, refresh=3600,
                              miss_interval=0.2)
        cache.start()
        try:
            await asyncio.wait_for(cache.listed.wait(), 30)
            api.pods = {"node-1": [(LATE_POD, "team-a", "late")]}
            first = cache.of(201)  # not listed yet: judged without a namespace
            for _ in range(10):
                cache.of(201)  # more misses at once ask for one more list, not ten
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, api.wait_requests, 2, 30)
            while LATE_POD not in cache.by_uid:  # looking, not asking: no further miss
                await asyncio.sleep(0.01)
            return first, cache.of(201)
        finally:
            await cache.close()

    with pod_api() as api:
        assert asyncio.run(scenario()) == (None, "team-a")
        assert len(api.requests) == 2


def test_when_the_api_cannot_be_read_peers_have_no_namespace_and_one_line_says_why(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    fake_proc(tmp_path, 301, TEAM_A_POD)

    async def scenario() -> str | None:
        cache = PodNamespaces(PodSource(api.url, "node-1"), tmp_path, miss_interval=0.05)
        cache.start()
        try:
            await asyncio.wait_for(cache.listed.wait(), 30)
            cache.of(301)  # a miss: listed again, refused again, no second line
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, api.wait_requests, 2, 30)
            return cache.of(301)
        finally:
            await cache.close()

    with pod_api() as api:
        api.pods = {"node-1": [(TEAM_A_POD, "team-a", "nb-0")]}
        api.status = 403
        with caplog.at_level(logging.WARNING, logger="kiwi.daemon"):
            assert asyncio.run(scenario()) is None
    lines = [r for r in caplog.records if "Cannot list this node's pods" in r.getMessage()]
    assert len(lines) == 1 and "403" in lines[0].getMessage()
    assert not any(r.exc_info for r in caplog.records)


def test_a_rule_for_a_namespace_lets_a_peer_whose_pod_is_there_claim_high() -> None:
    policy = parse_access(POLICY)
    verdict = judge(policy, uid=1000, gids=(), pool="default", priority="HIGH",
                    namespace="team-a")
    assert (verdict.pool, verdict.priority, verdict.warning) == ("default", "HIGH", None)


def test_a_peer_elsewhere_or_in_no_known_namespace_may_not_claim_high() -> None:
    policy = parse_access(POLICY)
    with pytest.raises(PermissionError, match="uid 1000 in namespace team-b may not use"):
        judge(policy, uid=1000, gids=(), pool="default", priority="HIGH", namespace="team-b")
    with pytest.raises(PermissionError, match="uid 1000 may not use"):
        judge(policy, uid=1000, gids=(), pool="default", priority="HIGH", namespace=None)


def test_a_rule_may_name_namespaces_alone() -> None:
    rule = parse_access(POLICY).rules[0]
    assert rule.namespaces == {"team-a"} and not rule.uids and not rule.gids


@pytest.mark.parametrize("name", ["Team-A", "-team", "team-", "team_a", "a" * 64, "", "a.b"])
def test_a_namespace_that_kubernetes_would_not_accept_is_a_config_error(name: str) -> None:
    bad = {**POLICY, "rules": [{"namespaces": [name], "priorities": ["HIGH"]}]}
    with pytest.raises(ConfigError, match=r"access\.rules\[0\]\.namespaces"):
        parse_access(bad)


def test_the_longest_namespace_name_is_accepted() -> None:
    good = {**POLICY, "rules": [{"namespaces": ["a" * 63, "x"], "priorities": ["HIGH"]}]}
    assert parse_access(good).rules[0].namespaces == {"a" * 63, "x"}


def test_the_verified_namespace_is_in_the_status_and_hidden_like_labels_from_others() -> None:
    from policy_helpers import make_scheduler

    from nodeside.scheduler.status import build_status

    s = make_scheduler()
    s.register(0.0, Registration(name="mine", uid=1000, namespace="team-a"))
    s.register(0.0, Registration(name="theirs", uid=2000, namespace="team-b"))
    s.register(0.0, Registration(name="unverified", uid=1000))
    admin = {c["name"]: c["namespace"] for c in build_status(s, 0.0)["clients"]}
    assert admin == {"mine": "team-a", "theirs": "team-b", "unverified": None}
    viewer = build_status(s, 0.0, viewer_admin=False, viewer_uid=1000)
    assert {c["name"]: c["namespace"] for c in viewer["clients"]} == {
        "mine": "team-a", "theirs": None, "unverified": None}


_NAMES = st.sampled_from(["team-a", "team-b", "ml"])
_RULES = st.lists(st.fixed_dictionaries({
    "namespaces": st.lists(_NAMES, min_size=1, max_size=2),
    "pools": st.lists(st.sampled_from(["default", "training", "*"]), min_size=1, max_size=2),
    "priorities": st.lists(st.sampled_from(["HIGH", "NORMAL", "LOW"]), min_size=1, max_size=3),
}, optional={"uids": st.lists(st.sampled_from([1000, 2000]), max_size=1)}), max_size=4)


@given(_RULES, st.sampled_from(["refuse", "downgrade"]), st.sampled_from([1000, 2000, 3000]),
       _NAMES, st.sampled_from(["default", "training"]), st.sampled_from(["HIGH", "NORMAL", "LOW"]))
def test_no_namespace_never_allows_more_than_a_verified_one(rules, on_violation, uid, namespace,
                                                            pool, priority) -> None:  # type: ignore[no-untyped-def]
    policy = parse_access({"on_violation": on_violation, "rules": rules})
    assert policy is not None
    without = policy.allowed(uid, (), pool, priority, None)
    assert not without or policy.allowed(uid, (), pool, priority, namespace)
    if without:
        assert judge(policy, uid=uid, gids=(), pool=pool, priority=priority) == \
            judge(policy, uid=uid, gids=(), pool=pool, priority=priority, namespace=namespace)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl to make a cert")
def test_in_cluster_the_list_is_read_over_tls_checked_against_the_service_accounts_ca(
        tmp_path: Path) -> None:
    account = tmp_path / "serviceaccount"
    account.mkdir()
    cert, key = account / "ca.crt", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=kubernetes", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    (account / "token").write_text("projected-token")
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    with pod_api(tls) as api:
        api.pods = {"gpu-7": [(TEAM_A_POD, "team-a", "nb-0")]}
        port = api.url.rsplit(":", 1)[1]
        source = PodSource.in_cluster({"KUBERNETES_SERVICE_HOST": "127.0.0.1",
                                       "KUBERNETES_SERVICE_PORT": port, "NODE_NAME": "gpu-7"},
                                      account)
        assert source is not None
        assert list_namespaces(source) == {TEAM_A_POD: "team-a"}
        assert api.requests[0][1]["Authorization"] == "Bearer projected-token"
        # A server whose certificate the account's CA did not sign is not believed.
        other = PodSource(source.base_url, "gpu-7", source.token_file, ca_file=None)
        with pytest.raises(PodListError, match="CERTIFICATE_VERIFY_FAILED|certificate"):
            list_namespaces(other)
