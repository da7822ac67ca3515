"""What NVML vouches for (issue 40, N1): a memory client's process that NVML lists counts its
figure, both ways; one NVML does not list holds nothing where NVML's pids are the daemon's; and
clients of one process share its figure."""

from __future__ import annotations

from nodeside.config import SchedulerConfig
from nodeside.daemon.process_memory import by_client
from nodeside.model import MemoryFigures, Registration
from nodeside.scheduler.core import GpuSpec, Scheduler

GiB = 1 << 30


def node(*clients: tuple[str, int | None, int]) -> tuple[Scheduler, dict[str, str]]:
    """Memory clients (name, pid, resident bytes they claim) on one GPU."""
    s = Scheduler(SchedulerConfig(), [GpuSpec(0, memory_total=16 * GiB)], 0.0)
    ids = {}
    for name, pid, resident in clients:
        c = s.register(0.0, Registration(name=name, pid=pid, evict="vmm"))
        s.track_memory(c.id, MemoryFigures(resident=resident, host=0))
        ids[name] = c.id
    return s, ids


def test_a_listed_process_counts_its_figure_whatever_its_client_claims() -> None:
    s, ids = node(("over", 10, 12 * GiB), ("under", 11, GiB))
    figures = by_client(s, [(0, 10, 0), (0, 11, 5 * GiB)])
    assert figures == {ids["over"]: 0, ids["under"]: 5 * GiB}


def test_an_unlisted_process_holds_nothing_where_nvml_pids_are_ours() -> None:
    s, ids = node(("liar", 10, 12 * GiB), ("honest", 11, GiB))
    assert by_client(s, [(0, 11, GiB)]) == {ids["liar"]: 0, ids["honest"]: GiB}
    # In the host's PID namespace NVML's pids are ours even when it lists none of them.
    assert by_client(s, [], host_pids=True)[ids["liar"]] == 0


def test_where_nvml_pids_may_not_be_ours_an_unlisted_process_is_not_vouched_for() -> None:
    s, ids = node(("liar", 10, 12 * GiB), ("unseen", None, GiB))
    figures = by_client(s, [(0, 999, 3 * GiB)])
    assert figures == {ids["liar"]: None, ids["unseen"]: None}


def test_clients_of_one_process_share_its_figure() -> None:
    s, ids = node(("first", 10, GiB), ("second", 10, 2 * GiB), ("third", 10, 0))
    figures = by_client(s, [(0, 10, 5 * GiB)])
    assert figures == {ids["first"]: 3 * GiB, ids["second"]: 2 * GiB, ids["third"]: 0}
    assert sum(v or 0 for v in by_client(s, [(0, 10, GiB)]).values()) == GiB
