"""The status document's client and pool entries: display names, users, eviction kind, what a
non-admin may see, and the daemon's one rule for "below its guarantee"."""

from __future__ import annotations

import pytest
from status_fixtures import GiB, memory_status, sample_status

from nodeside.config import from_mapping
from nodeside.model import MemoryFigures, Registration
from nodeside.protocol import document
from nodeside.protocol.render import typescript
from nodeside.scheduler.core import GpuSpec, Scheduler, SchedulerError
from nodeside.scheduler.status import build_status

POOLS = {"training": {"guarantee": 0.3, "weight": 1, "maximum": 0.7},
         "simulation": {"guarantee": 0.5, "weight": 3, "maximum": -1}}


def scheduler(config: dict | None = None, gpus: list[GpuSpec] | None = None) -> Scheduler:
    return Scheduler(from_mapping(config or {"tq": 1.0}), gpus or [GpuSpec(0)], 0.0)


def entry(doc: dict, name: str) -> dict:
    return next(c for c in doc["clients"] if c["name"] == name)


def test_client_entries_carry_display_name_user_and_evict():
    s = scheduler()
    s.register(0.0, Registration(name="k1", display_name="work/train.ipynb", user="alice",
                                 evict="checkpoint"))
    s.register(0.0, Registration(name="k2"))
    doc = build_status(s, 0.0)
    assert {k: entry(doc, "k1")[k] for k in ("display_name", "user", "evict")} == {
        "display_name": "work/train.ipynb", "user": "alice", "evict": "checkpoint"}
    assert {k: entry(doc, "k2")[k] for k in ("display_name", "user", "evict")} == {
        "display_name": "k2", "user": None, "evict": "managed"}


def test_an_unknown_evict_kind_is_refused():
    with pytest.raises(SchedulerError, match="evict must be one of"):
        scheduler().register(0.0, Registration(name="k", evict="swap"))


def test_a_non_admin_sees_names_and_states_but_not_others_pids_or_labels():
    s = scheduler()
    mine = s.register(0.0, Registration(name="mine", pid=10, uid=1000, labels={"pod": "a"}))
    s.register(0.0, Registration(name="theirs", pid=20, uid=2000, labels={"pod": "b"}))
    s.acquire(0.0, mine.id)
    doc = build_status(s, 0.0, viewer_admin=False, viewer_uid=1000)
    theirs = entry(doc, "theirs")
    assert theirs["pid"] is None and "labels" not in theirs
    assert theirs["state"] == "idle"
    assert entry(doc, "mine")["pid"] == 10 and entry(doc, "mine")["labels"] == {"pod": "a"}
    admin = build_status(s, 0.0)
    assert entry(admin, "theirs")["pid"] == 20 and entry(admin, "theirs")["labels"]


def test_a_client_may_name_its_gpu_by_uuid():
    s = scheduler(gpus=[GpuSpec(0, uuid="GPU-aaa"), GpuSpec(1, uuid="GPU-bbb")])
    assert s.register(0.0, Registration(name="k", gpu=0, gpu_uuid="GPU-bbb")).gpu == 1
    with pytest.raises(SchedulerError, match="no GPU GPU-ccc"):
        s.register(0.0, Registration(name="k", gpu_uuid="GPU-ccc"))


def test_a_pool_waiting_below_its_guarantee_is_marked_by_the_daemon():
    s = scheduler({"tq": 5.0, "pools": POOLS})
    a = s.register(0.0, Registration(name="a", pool="training"))
    b = s.register(0.0, Registration(name="b", pool="simulation"))
    s.acquire(0.0, a.id)
    s.acquire(1.0, b.id)
    pools = {p["name"]: p for p in build_status(s, 2.0)["pools"]}
    assert pools["simulation"]["below_guarantee"] is True
    assert pools["training"]["below_guarantee"] is False  # holding, not waiting
    assert pools["simulation"]["gpus"][0]["below_guarantee"] is True


def test_a_lone_pool_whose_clients_take_turns_is_not_marked_below_its_guarantee():
    """The default pool (a guarantee of 100%) with one client holding and another waiting:
    nobody else uses the GPU, and the holder is not preemptible, so the guarantee gets the
    waiter nothing; the panel must not say "below its guarantee: it goes first"."""
    s = scheduler({"tq": 5.0})
    a, b = s.register(0.0, Registration(name="a")), s.register(0.0, Registration(name="b"))
    s.acquire(0.0, a.id)
    s.release(1.0, a.id)  # then the GPU idles: the pool's share of its time is low
    s.acquire(30.0, a.id)
    s.acquire(30.5, b.id)
    (pool,) = build_status(s, 31.0)["pools"]
    assert pool["share"] < pool["guarantee"]
    assert pool["below_guarantee"] is False


def test_the_pools_entries_are_the_pools_report():
    s = scheduler({"tq": 5.0, "pools": POOLS})
    a = s.register(0.0, Registration(name="a", pool="training"))
    s.acquire(0.0, a.id)
    (training,) = [p for p in build_status(s, 1.0)["pools"] if p["name"] == "training"]
    for key in ("name", "guarantee", "weight", "maximum", "share", "clients", "entitlement",
                "waiting", "holding", "configured", "complete", "missing", "waiting_clients",
                "stuck", "below_guarantee", "gpus"):
        assert key in training
    assert training["entitlement"] == pytest.approx(1.0 * 0.7)  # alone, capped at its maximum


def test_configured_pools_names_the_configs_pools_and_not_the_ones_clients_made_up():
    s = scheduler({"tq": 1.0, "pools": POOLS})
    s.register(0.0, Registration(name="a", pool="made-up"))
    doc = build_status(s, 0.0)
    assert doc["configured_pools"] == ["simulation", "training"]
    assert "made-up" in {p["name"] for p in doc["pools"]}  # it exists, but is not configured


def test_configured_pools_is_empty_when_the_config_has_no_pools():
    s = scheduler()
    s.register(0.0, Registration(name="a", pool="anything"))
    assert build_status(s, 0.0)["configured_pools"] == []


def follows_the_table(part: document.Part, entry: dict) -> None:
    keys = {k.name: k for k in part.keys}
    assert set(entry) <= set(keys), set(entry) - set(keys)
    for name, value in entry.items():
        if keys[name].values and value is not None:
            assert value in keys[name].values, (name, value)


@pytest.mark.parametrize("doc", [sample_status(), memory_status()], ids=["sample", "memory"])
def test_every_key_of_the_views_samples_is_in_the_documents_table(doc: dict):
    follows_the_table(document.DOCUMENT, doc)
    for gpu in doc["gpus"]:
        follows_the_table(document.GPU, gpu)
    for client in doc["clients"]:
        follows_the_table(document.CLIENT, client)
        if client.get("waiting_for"):
            follows_the_table(document.WAITING_FOR, client["waiting_for"])


def test_the_memory_keys_are_there_exactly_for_clients_that_speak_memory_and_their_gpus():
    """An old client's entry, and a GPU with only old clients on it, read as before; a client
    that speaks the ``memory`` feature, and its GPU, carry every memory key."""
    scheduler = Scheduler(from_mapping({"tq": 30.0}),
                          [GpuSpec(0, memory_total=80 * GiB), GpuSpec(1, memory_total=80 * GiB)],
                          0.0)
    old = scheduler.register(0.0, Registration(name="old", pid=101, gpu=0))
    new = scheduler.register(0.0, Registration(name="new", pid=102, gpu=1))
    scheduler.track_memory(new.id, MemoryFigures(resident=2 * GiB, host=0))
    doc = build_status(scheduler, 1.0, host_budget=64 * GiB)
    client_keys = {k.name for k in document.CLIENT.keys if k.added_by == "memory"}
    gpu_keys = {k.name for k in document.GPU.keys if k.added_by == "memory"}
    entries = {c["id"]: c for c in doc["clients"]}
    assert not client_keys & set(entries[old.id])
    assert client_keys <= set(entries[new.id])
    assert entries[new.id]["resident_bytes"] == 2 * GiB
    assert not gpu_keys & set(doc["gpus"][0])
    assert gpu_keys <= set(doc["gpus"][1])
    assert doc["gpus"][1]["host_budget"] == 64 * GiB


def test_the_panel_reads_what_a_kernel_waits_for_as_one_object_of_its_own_part():
    types = typescript.render()
    assert "  waiting_for?: IWaitingFor | null;" in types
    assert "export interface IWaitingFor {" in types
    assert "  action: 'evict' | 'checkpoint' | 'restore' | 'spill';" in types
