"""Many viewers of the status document (issue 40, N7e): a change costs one build however many
uids read it, each viewer's cut reads byte for byte as the document built for it alone, and the
credit newcomers bring cannot add up past the node's burst."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodeside import protocol as p
from nodeside.config import from_mapping
from nodeside.daemon import documents as kept_documents
from nodeside.daemon.documents import BURST, TOTAL_SHARE, StatusDocuments, StatusMeter
from nodeside.evict.lines import Checkpoint, EvictionLines
from nodeside.model import MemoryFigures, Registration
from nodeside.scheduler.core import GpuSpec, Scheduler

GiB = 1 << 30
UIDS = [1000 + i for i in range(16)]


def crowded_scheduler() -> Scheduler:
    """Two GPUs, clients of 16 uids (with pids, labels and verified namespaces), one holding,
    one waiting, and some that speak the memory feature."""
    scheduler = Scheduler(from_mapping({"tq": 30.0}),
                          [GpuSpec(0, memory_total=80 * GiB), GpuSpec(1, memory_total=80 * GiB)],
                          0.0)
    for i, uid in enumerate(UIDS * 3):
        client = scheduler.register(0.0, Registration(
            name=f"kernel-{i}", pid=100 + i, uid=uid, gpu=i % 2, labels={"pod": f"pod-{i}"},
            namespace=f"ns-{uid}", kind="kernel"))
        if i % 5 == 0:
            scheduler.track_memory(client.id, MemoryFigures(resident=GiB, host=0))
    first, second = list(scheduler.clients)[:2]
    scheduler.acquire(0.0, first)
    scheduler.acquire(0.0, list(scheduler.clients)[2])  # waits behind the first, on GPU 0
    del second
    return scheduler


def serve(documents: StatusDocuments, viewer: tuple[bool, int | None], seq: int, now: float,
          generation: int) -> bytes:
    """What requests.py does for a status request (the meter aside)."""
    kept = documents.kept(viewer, seq, now, generation)
    return kept if kept is not None else documents.build(viewer, seq, now, generation)[0]


def test_sixteen_uids_reading_at_once_cost_one_build_per_change(monkeypatch) -> None:
    built = []
    build_status = kept_documents.build_status

    def counted(*args, **kwargs):
        built.append(1)
        return build_status(*args, **kwargs)

    monkeypatch.setattr(kept_documents, "build_status", counted)
    documents = StatusDocuments(crowded_scheduler(), dict, None)
    viewers = [(False, uid) for uid in UIDS] + [(True, 0)]
    for generation in (1, 2, 3):
        for round_ in range(3):
            for viewer in viewers:
                serve(documents, viewer, round_, 0.01 * generation, generation)
        assert len(built) == generation  # one per change, not one per uid


@pytest.mark.parametrize("order", ["admin first", "others first"])
def test_each_viewers_cut_reads_byte_for_byte_as_its_document_built_alone(
        order, monkeypatch) -> None:
    # The host's MemAvailable moves between two readings: both documents read the same figure.
    monkeypatch.setattr(kept_documents, "evictions_budget", lambda held: 64 * GiB - held)
    scheduler = crowded_scheduler()
    lines = EvictionLines(scheduler)
    # GPU 1 blocked by a failed checkpoint: admins read the pid in why, others do not.
    blocker = next(c for c in scheduler.clients.values() if c.gpu == 1)
    lines.register(blocker.id, blocker.pid, 1, blocker.name)
    lines.checkpoint_failed(Checkpoint(blocker.id, 1, blocker.pid), "no memory", 0.0)
    documents = StatusDocuments(scheduler, lambda: {0: 3 * GiB}, lines)
    documents.pauses.counts[next(iter(scheduler.clients))] = 2
    viewers = [(False, 1000), (False, 1015), (False, 4242), (False, None), (True, 1000),
               (True, None)]
    if order == "admin first":
        viewers.reverse()
    for viewer in viewers * 2:  # cut, then served from the kept cut
        line = serve(documents, viewer, 7, 0.5, 1)
        assert line == p.encode(p.STATUS_REPLY, seq=7, status=documents.document(0.5, viewer))
    others = json.loads(serve(documents, (False, 1000), 8, 0.5, 1))["status"]
    assert all(c["pid"] is None and c["namespace"] is None and "labels" not in c
               for c in others["clients"] if int(c["name"].split("-")[1]) % len(UIDS))
    assert all(c["pid"] is not None and c["labels"]
               for c in others["clients"] if int(c["name"].split("-")[1]) % len(UIDS) == 0)
    assert str(blocker.pid) not in others["gpus"][1]["evict_blocked"]


def test_joining_groups_cannot_take_more_than_the_nodes_burst_together() -> None:
    """64 uids come one after another, each asking as soon as it may; the first has the whole
    burst. Whatever each newcomer's part, all of them together take no more than the node's
    burst at once and its share over time (give or take one document past a bucket)."""
    meter = StatusMeter()
    cost, charged = 0.01, 0.0
    groups: list[tuple[int, None]] = []
    for tick in range(1000):
        now = tick / 1000
        if tick % 10 == 0 and len(groups) < 64:
            groups.append((1000 + len(groups), None))
        for group in groups:
            if meter.owed(group, now) == 0:
                meter.charge(group, cost, now)
                charged += cost
    assert charged <= BURST + TOTAL_SHARE * 1.0 + cost


def test_a_cut_is_charged_but_not_taken_for_what_a_document_costs() -> None:
    meter = StatusMeter()
    meter.charge((1000, None), 0.008, 0.0)
    meter.charge((1001, None), 0.0001, 0.0, built=False)
    assert meter.last_cost == 0.008


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 63), st.integers(0, 50),
                          st.floats(1e-4, 0.05), st.booleans()), min_size=1, max_size=300))
def test_what_all_groups_take_together_stays_within_the_nodes_burst_and_share(asks) -> None:
    """Whatever groups ask, when and at what cost (built or only cut), the meter lets them take
    no more than the node's burst plus its share of the time passed, past one request's cost."""
    meter = StatusMeter()
    now, charged, largest = 0.0, 0.0, 0.0
    for group, step_ms, cost, built in asks:
        now += step_ms / 1000
        if meter.owed((group, None), now) == 0:
            meter.charge((group, None), cost, now, built)
            charged += cost
            largest = max(largest, cost)
        assert charged <= BURST + TOTAL_SHARE * now + largest + 1e-9
