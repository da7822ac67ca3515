"""Client slots shared by uid and, within a uid, by pod (issue 40, N7): four users who register
all they can leave the fifth room, and one pod of a uid every Jupyter pod shares (``jovyan``)
leaves the others room. The rule on ``Registrations`` itself, then attacks on the real daemon.
"""

from __future__ import annotations

import os

from other_users import needs_root
from test_uid_budgets import daemon_for_everyone, hogs_then_victim

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

@needs_root
def test_a_fifth_user_registers_beside_four_who_took_all_they_could(start_daemon,
                                                                     scratch) -> None:
    daemon = daemon_for_everyone(start_daemon, scratch)
    hogs, victim = hogs_then_victim(daemon, [5001, 5002, 5003, 5004], limits.MAX_CLIENTS, {})
    assert [count for count, _ in hogs] == [512, 512, 512, 256]
    assert victim["op"] == "registered", victim


@needs_root
def test_a_pod_of_jovyan_registers_beside_another_that_took_all_it_could(start_daemon,
                                                                          scratch) -> None:
    daemon = daemon_for_everyone(start_daemon, scratch)
    hogs, victim = hogs_then_victim(daemon, [1000], limits.MAX_CLIENTS,
                                    {"namespace": "a", "pod": "hog"}, 1000,
                                    {"namespace": "b", "pod": "jupyter-bob"})
    assert [count for count, _ in hogs] == [256]
    assert victim["op"] == "registered", victim

