"""Which pod a peer process runs in, from its cgroup file: every form the kubelet writes."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from nodeside.daemon.pods import pod_uid_in, pod_uid_of

UID = "1234abcd-5678-90ef-1234-567890abcdef"
SYSTEMD_UID = UID.replace("-", "_")
CONTAINER = "cri-containerd-" + "ab" * 32 + ".scope"

V2_SYSTEMD_BURSTABLE = (
    f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}.slice/"
    f"{CONTAINER}\n")
V2_SYSTEMD_GUARANTEED = f"0::/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice/{CONTAINER}\n"
V2_SYSTEMD_BESTEFFORT = (
    f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SYSTEMD_UID}.slice/"
    f"{CONTAINER}\n")
V2_CGROUPFS_BURSTABLE = f"0::/kubepods/burstable/pod{UID}/{'ab' * 32}\n"
V2_CGROUPFS_GUARANTEED = f"0::/kubepods/pod{UID}/{'ab' * 32}\n"
# The daemon in its own cgroup namespace sees the peer's path relative to its own cgroup.
V2_FROM_ANOTHER_CGROUP_NAMESPACE = (
    f"0::/../../kubepods-burstable-pod{SYSTEMD_UID}.slice/{CONTAINER}\n")
V1_CGROUPFS = "".join(
    f"{n}:{controller}:/kubepods/burstable/pod{UID}/{'cd' * 32}\n"
    for n, controller in enumerate(["cpu,cpuacct", "memory", "pids", "name=systemd"], 1))
V1_CGROUPFS_GUARANTEED = "".join(
    f"{n}:{controller}:/kubepods/pod{UID}/{'cd' * 32}\n"
    for n, controller in enumerate(["memory", "devices"], 1))
V1_SYSTEMD = "".join(
    f"{n}:{controller}:/kubepods.slice/kubepods-burstable.slice/"
    f"kubepods-burstable-pod{SYSTEMD_UID}.slice/docker-{'ef' * 32}.scope\n"
    for n, controller in enumerate(["memory", "cpu,cpuacct", "blkio"], 1)) + "0::/\n"
STATIC_POD_HASH = "0123456789abcdef0123456789abcdef"


def test_a_cgroup_v2_systemd_path_names_the_burstable_pod() -> None:
    assert pod_uid_in(V2_SYSTEMD_BURSTABLE) == UID


def test_a_cgroup_v2_systemd_path_names_the_guaranteed_pod_without_a_qos_level() -> None:
    assert pod_uid_in(V2_SYSTEMD_GUARANTEED) == UID


def test_a_cgroup_v2_systemd_path_names_the_besteffort_pod() -> None:
    assert pod_uid_in(V2_SYSTEMD_BESTEFFORT) == UID


def test_a_cgroup_v2_cgroupfs_path_names_the_burstable_pod() -> None:
    assert pod_uid_in(V2_CGROUPFS_BURSTABLE) == UID


def test_a_cgroup_v2_cgroupfs_path_names_the_guaranteed_pod_without_a_qos_level() -> None:
    assert pod_uid_in(V2_CGROUPFS_GUARANTEED) == UID


def test_a_path_relative_to_the_daemons_own_cgroup_namespace_still_names_the_pod() -> None:
    assert pod_uid_in(V2_FROM_ANOTHER_CGROUP_NAMESPACE) == UID


def test_cgroup_v1_hierarchies_that_agree_name_the_pod() -> None:
    assert pod_uid_in(V1_CGROUPFS) == UID
    assert pod_uid_in(V1_CGROUPFS_GUARANTEED) == UID
    assert pod_uid_in(V1_SYSTEMD) == UID


def test_a_static_pods_config_hash_is_its_uid() -> None:
    assert pod_uid_in(f"0::/kubepods/burstable/pod{STATIC_POD_HASH}/{'ab' * 32}\n") == \
        STATIC_POD_HASH


def test_a_process_outside_kubepods_has_no_pod() -> None:
    assert pod_uid_in("0::/user.slice/user-1000.slice/session-3.scope\n") is None
    assert pod_uid_in(f"0::/system.slice/pod{UID}.service\n") is None
    assert pod_uid_in("0::/\n") is None
    assert pod_uid_in("") is None


def test_hierarchies_naming_two_pods_name_none() -> None:
    other = "ffffffff-5678-90ef-1234-567890abcdef"
    text = f"1:memory:/kubepods/pod{UID}/x\n2:pids:/kubepods/pod{other}/x\n"
    assert pod_uid_in(text) is None


def test_a_pid_is_looked_up_under_the_given_proc_root(tmp_path: Path) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(V2_SYSTEMD_BURSTABLE)
    assert pod_uid_of(4242, tmp_path) == UID


def test_a_pid_the_daemon_cannot_see_has_no_pod(tmp_path: Path) -> None:
    assert pod_uid_of(4242, tmp_path) is None  # another PID namespace, or gone
    assert pod_uid_of(0, tmp_path) is None  # SO_PEERCRED's pid for a peer it cannot name
    assert pod_uid_of(None, tmp_path) is None


@given(st.text())
def test_the_cgroup_parser_never_raises_on_arbitrary_text(text: str) -> None:
    found = pod_uid_in(text)
    assert found is None or (isinstance(found, str) and "_" not in found)


@given(st.lists(st.sampled_from(["0::", "1:memory:", "/kubepods", "/kubepods.slice", "/pod",
                                 "kubepods-pod", "-burstable", UID, SYSTEMD_UID, ".slice",
                                 "/", "\n", ":", "_", "-"])).map("".join))
def test_the_cgroup_parser_never_raises_on_cgroup_like_text(text: str) -> None:
    found = pod_uid_in(text)
    assert found in (None, UID)
