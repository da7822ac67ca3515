"""Prometheus metrics read from the scheduler's state at scrape time, and served over HTTP."""

import asyncio
import urllib.error
import urllib.request

import pytest
from policy_helpers import SEED_POOLS, GiB, greedy, make_scheduler
from prometheus_client.parser import text_string_to_metric_families

from nodeside.metrics import Metrics, start_server
from nodeside.model import Registration
from nodeside.testing import Replay


def samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def scrape(metrics: Metrics) -> dict[tuple[str, tuple], float]:
    return samples(metrics.exposition().decode())


@pytest.fixture
def contended():
    replay = Replay(make_scheduler({"tq": 1.0, "pools": SEED_POOLS}))
    clock = {"now": 0.0}
    metrics = Metrics(replay.scheduler, clock=lambda: clock["now"], pod_labels=True)
    replay.observers.append(lambda r, actions: metrics.observe(actions, r.now))
    greedy(replay, "a", "training")
    worker = replay.add("b", pool="simulation")
    replay.scheduler.clients[worker.id].labels = {"pod": "nb-1", "namespace": "team"}
    replay.burst(worker, 1e9)
    replay.run_until(100.0)
    clock["now"] = replay.now
    return replay, metrics


def test_gpu_holders_and_queue_length(contended):
    _, metrics = contended
    got = scrape(metrics)
    assert got[("kiwi_gpu_holders", (("gpu", "0"),))] == 1
    assert got[("kiwi_gpu_queue_length", (("gpu", "0"),))] == 1
    assert got[("kiwi_gpu_tq_seconds", (("gpu", "0"),))] == 1.0
    assert got[("kiwi_scheduler_mode", (("mode", "on"),))] == 1
    assert got[("kiwi_preemption_enabled", ())] == 1


def test_counters_are_the_cores_counts(contended):
    replay, metrics = contended
    got = scrape(metrics)
    for name in ("grants", "drops", "preemptions", "revocations"):
        assert got[(f"kiwi_{name}_total", ())] == replay.scheduler.counts[name]
    assert got[("kiwi_grants_total", ())] > 10


def test_pool_share_and_gpu_seconds(contended):
    replay, metrics = contended
    got = scrape(metrics)
    share = got[("kiwi_pool_share_ratio", (("gpu", "0"), ("pool", "training")))]
    assert share == pytest.approx(0.35, abs=0.03)
    seconds = {pool: got[("kiwi_pool_gpu_seconds_total", (("gpu", "0"), ("pool", pool)))]
               for pool in ("training", "simulation")}
    assert sum(seconds.values()) == pytest.approx(100.0)
    assert seconds == pytest.approx(replay.gpu_seconds_by_pool(0.0, 100.0))
    assert got[("kiwi_pool_entitlement_ratio",
                (("gpu", "0"), ("pool", "simulation")))] == pytest.approx(0.65)


def test_client_series_carry_gpu_pool_name_pod_and_namespace(contended):
    replay, metrics = contended
    got = scrape(metrics)
    labels = (("client", "b"), ("gpu", "0"), ("namespace", "team"), ("pod", "nb-1"),
              ("pool", "simulation"))
    assert got[("kiwi_client_gpu_seconds_total", labels)] == pytest.approx(
        replay.gpu_seconds_by_pool(0.0, 100.0)["simulation"])


def test_pool_seconds_do_not_fall_when_a_client_leaves(contended):
    replay, metrics = contended
    before = scrape(metrics)[("kiwi_pool_gpu_seconds_total", (("gpu", "0"), ("pool", "training")))]
    (a,) = [w for w in replay.workers.values() if w.name == "a"]
    replay.leave(a)
    replay.run_until(replay.now + 1)
    after = scrape(metrics)[("kiwi_pool_gpu_seconds_total", (("gpu", "0"), ("pool", "training")))]
    assert after >= before


def test_working_set_gauge():
    sched = make_scheduler(memory=16 * GiB)
    sched.register(0.0, Registration(name="k", working_set=3 * GiB))
    got = scrape(Metrics(sched, clock=lambda: 0.0, pod_labels=True))
    assert got[("kiwi_client_working_set_bytes", (("client", "k"), ("gpu", "0"),
                ("namespace", ""), ("pod", ""), ("pool", "default")))] == 3 * GiB
    assert got[("kiwi_gpu_memory_total_bytes", (("gpu", "0"),))] == 16 * GiB


def test_drop_to_grant_histogram_measures_from_the_drop_to_the_next_grant():
    sched = make_scheduler({"tq": 1.0})
    metrics = Metrics(sched, clock=lambda: 2.0)
    a, b = (sched.register(0.0, Registration(name=n)) for n in "ab")
    metrics.observe(sched.acquire(0.0, a.id), 0.0)
    metrics.observe(sched.acquire(0.5, b.id), 0.5)
    metrics.observe(sched.tick(1.0), 1.0)  # drop to a
    metrics.observe(sched.release(1.25, a.id), 1.25)  # grant to b
    got = scrape(metrics)
    assert got[("kiwi_drop_to_grant_seconds_count", (("gpu", "0"),))] == 1
    assert got[("kiwi_drop_to_grant_seconds_sum", (("gpu", "0"),))] == pytest.approx(0.25)


def test_metrics_are_served_over_http_off_the_loop_and_built_on_it():
    sched = make_scheduler()
    sched.register(0.0, Registration(name="k"))
    metrics = Metrics(sched, clock=lambda: 0.0)

    def get(url: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(url, timeout=10) as reply:
                return reply.status, reply.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    async def fetch(*paths: str) -> list[tuple[int, bytes]]:
        loop = asyncio.get_running_loop()
        server = start_server(metrics, "127.0.0.1", 0, loop)
        port = server.server_address[1]
        try:  # the requests block a thread; the loop stays free to build the exposition
            return [await loop.run_in_executor(None, get, f"http://127.0.0.1:{port}{path}")
                    for path in paths]
        finally:
            await loop.run_in_executor(None, server.shutdown)
            server.server_close()

    (code, body), (missing, _) = asyncio.run(fetch("/metrics", "/nope"))
    assert code == 200
    assert ("kiwi_gpu_holders", (("gpu", "0"),)) in samples(body.decode())
    assert missing == 404


def test_gpu_metrics_carry_the_uuid_that_joins_dcgm_exporters_metrics():
    from nodeside.config import from_mapping
    from nodeside.scheduler.core import Scheduler
    from nodeside.scheduler.gpu_state import GpuSpec

    # NVML's UUID, exactly as dcgm-exporter puts it in its own `UUID` label.
    uuids = ["GPU-8f6b2a9e-1c3d-4e5f-9a0b-1c2d3e4f5a6b", "GPU-0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d"]
    scheduler = Scheduler(from_mapping({}), [GpuSpec(i, uuid=u) for i, u in enumerate(uuids)],
                          0.0)
    got = scrape(Metrics(scheduler, clock=lambda: 0.0))
    for index, uuid in enumerate(uuids):
        for name in ("kiwi_gpu_holders", "kiwi_gpu_queue_length", "kiwi_gpu_tq_seconds"):
            assert (name, (("UUID", uuid), ("gpu", str(index)))) in got


def test_gpu_metrics_leave_the_uuid_out_where_the_daemon_knows_none(contended):
    _, metrics = contended
    assert all("UUID" not in dict(labels) for _, labels in scrape(metrics))
