"""Client slots shared by uid and, within a uid, by pod (issue 40, N7): four users who register
all they can leave the fifth room, and one pod of a uid every Jupyter pod shares (``jovyan``)
leaves the others room. The rule on ``Registrations`` itself, then attacks on the real daemon.
"""

from __future__ import annotations

import os
import pickle
import resource

from other_users import SOMEONE, Peer, as_user, needs_root
from test_uid_budgets import daemon_for_everyone

from nodeside import limits
from nodeside.config import SchedulerConfig
from nodeside.daemon.peer import Peer as Credentials
from nodeside.daemon.registration import Registrations
from nodeside.scheduler.core import GpuSpec, Scheduler


def registrations() -> Registrations:
    scheduler = Scheduler(SchedulerConfig(), [GpuSpec(0)], 0.0)
    return Registrations(scheduler, pod_of=lambda pid: None)


def fill(regs: Registrations, uid: int, labels: dict[str, str] | None = None) -> tuple[int, str]:
    """Register as ``uid`` until refused: how many, and why refused."""
    n = 0
    while True:
        try:
            regs.register(Credentials(None, uid, uid, 3), {"name": f"{uid}-{n}",
                                                            "labels": labels or {}}, 0.0)
        except limits.LimitError as refused:
            return n, str(refused)
        n += 1


def test_four_users_who_take_all_they_can_leave_the_fifth_room() -> None:
    regs = registrations()
    taken = [fill(regs, 2000 + i)[0] for i in range(4)]
    assert taken == [512, 512, 512, 256]
    fifth, refusal = fill(regs, 3000)
    assert fifth == 128 and "half of what the other uids leave" in refusal


def test_one_pod_of_a_shared_uid_leaves_the_uids_other_pods_room() -> None:
    regs = registrations()
    hog, refusal = fill(regs, 1000, {"namespace": "alice", "pod": "jupyter-alice"})
    assert hog == 256 and "pod alice/jupyter-alice of uid 1000" in refusal
    other, _ = fill(regs, 1000, {"namespace": "bob", "pod": "jupyter-bob"})
    assert other == 128


def test_a_pod_is_known_by_its_cgroup_before_its_labels() -> None:
    scheduler = Scheduler(SchedulerConfig(), [GpuSpec(0)], 0.0)
    regs = Registrations(scheduler, pod_of=lambda pid: "6f1c-pod-uid")
    for i, pod in enumerate(("a", "b", "c")):  # whatever the labels say, one pod
        regs.register(Credentials(os.getpid(), 1000, 1000, 3),
                      {"name": f"k{i}", "labels": {"pod": pod}}, 0.0)
    assert regs.clients.of_pod == {(1000, "6f1c-pod-uid"): 3}


def test_slots_come_back_when_clients_leave() -> None:
    regs = registrations()
    fill(regs, 2000)
    for client_id in list(regs.label_bytes):
        regs.forget(client_id)
        regs.scheduler.unregister(0.0, client_id)
    assert regs.clients.used == 0 and regs.clients.of_uid == {} and regs.clients.of_pod == {}
    assert fill(regs, 2000)[0] == 512


# -- the real daemon ----------------------------------------------------------------------

def hogs_then_victim(daemon, uids: list[int], labels: dict[str, str],
                     victim_uid: int, victim_labels: dict[str, str]) -> tuple[list[int], dict]:
    """Each hog (a uid of ``uids``, in a child of its own) registers all it can and keeps it;
    then a victim registers. The hogs' counts and the victim's reply."""
    children = []
    for uid in uids:
        read_end, write_end = os.pipe()
        go_end, wait_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
                resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
                peers = []  # held until the victim has tried
                while True:
                    peer = Peer(daemon.socket)
                    reply = peer.request({"op": "register", "name": f"hog-{len(peers)}",
                                          "labels": labels})
                    if reply["op"] != "registered":
                        break
                    peers.append(peer)
                os.write(write_end, pickle.dumps(len(peers)))
                os.close(write_end)
                os.read(go_end, 1)
            finally:
                os._exit(0)
        os.close(write_end)
        os.close(go_end)
        with os.fdopen(read_end, "rb") as answer:
            count = pickle.loads(answer.read())
        children.append((pid, wait_end, count))
    try:
        victim = as_user(victim_uid, lambda: Peer(daemon.socket).request(
            {"op": "register", "name": "victim", "labels": victim_labels}))
    finally:
        for pid, wait_end, _ in children:
            os.write(wait_end, b"x")
            os.waitpid(pid, 0)
    return [count for _, _, count in children], victim


@needs_root
def test_a_fifth_user_registers_beside_four_who_took_all_they_could(start_daemon,
                                                                     scratch) -> None:
    daemon = daemon_for_everyone(start_daemon, scratch)
    counts, victim = hogs_then_victim(daemon, [5001, 5002, 5003, 5004], {}, SOMEONE,
                                      {"pod": "victim-pod"})
    assert counts == [512, 512, 512, 256]
    assert victim["op"] == "registered", victim


@needs_root
def test_a_pod_of_jovyan_registers_beside_another_that_took_all_it_could(start_daemon,
                                                                          scratch) -> None:
    daemon = daemon_for_everyone(start_daemon, scratch)
    counts, victim = hogs_then_victim(daemon, [1000], {"namespace": "a", "pod": "hog"}, 1000,
                                      {"namespace": "b", "pod": "jupyter-bob"})
    assert counts == [256]
    assert victim["op"] == "registered", victim

