"""Prometheus metrics of the node daemon (``--metrics-port``).

Two parts. ``SchedulerCollector`` reads the scheduler's own state at scrape time (holders,
queues, shares, GPU seconds, the core's counters), so nothing is counted twice and nothing can
drift from what ``status`` shows. ``Metrics`` adds what the state does not keep, two
histograms the daemon feeds: ``kiwi_handoff_seconds``, the daemon's own time from a release
arriving to the next grant being sent, and ``kiwi_drop_to_grant_seconds``, from asking a holder
for the GPU back to granting it to the next client (what a waiting notebook feels: it includes
the holder's time to finish and move its memory out).

The scrape is served from the daemon's own asyncio loop (``serve``), not from
prometheus_client's HTTP thread: the collector walks the scheduler's dicts, and only the loop
may touch them.

Names are prefixed ``kiwi_`` and use base units (seconds, bytes); counters end in ``_total``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from nodeside.errors import DaemonError
from nodeside.scheduler.core import Action, Drop, Grant, Revoke, Scheduler
from nodeside.scheduler.pools import entitlements
from nodeside.scheduler.residency import occupies

log = logging.getLogger("kiwi.metrics")

CLIENT_LABELS = ("gpu", "pool", "client", "pod", "namespace")
#: The per-GPU gauges carry the GPU's UUID under dcgm-exporter's own label name, so a query can
#: join Kiwi's view of a GPU with its utilization and memory (``on(UUID)``) without relabelling.
#: Left out where the daemon knows no UUIDs (no NVML, ``--gpus N``).
GPU_LABELS = ("gpu", "UUID")

# Handoffs take from a few milliseconds (nothing to move) to tens of seconds (tens of GiB to
# host memory over PCIe), so the buckets span that range.
HANDOFF_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# The daemon's part of a handoff is a few hundred microseconds of Python.
DAEMON_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1)


class SchedulerCollector(Collector):
    """Every gauge and counter, read from ``scheduler`` when Prometheus scrapes."""

    def __init__(self, scheduler: Scheduler | Callable[[], Scheduler],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._scheduler = scheduler
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        sched = self._scheduler if isinstance(self._scheduler, Scheduler) else self._scheduler()
        now = self._clock()
        yield from self._gpus(sched, now)
        yield from self._counters(sched)
        yield from self._pools(sched, now)
        yield from self._clients(sched, now)
        yield from self._memory(sched)

    def _gpus(self, sched: Scheduler, now: float) -> Iterator[Metric]:
        known_uuids = any(gpu.spec.uuid for gpu in sched.gpus.values())
        names = GPU_LABELS if known_uuids else GPU_LABELS[:1]
        holders = GaugeMetricFamily("kiwi_gpu_holders", "Clients holding the GPU now.",
                                    labels=names)
        queue = GaugeMetricFamily("kiwi_gpu_queue_length", "Clients waiting for the GPU.",
                                  labels=names)
        tq = GaugeMetricFamily("kiwi_gpu_tq_seconds", "The GPU's time quantum.",
                               labels=names)
        memory = GaugeMetricFamily("kiwi_gpu_memory_total_bytes",
                                   "GPU memory the scheduler fits working sets into.",
                                   labels=names)
        for index, gpu in sched.gpus.items():
            label = [str(index), gpu.spec.uuid or ""][:len(names)]
            holders.add_metric(label, len(gpu.holders))
            queue.add_metric(label, len(gpu.waiters))
            tq.add_metric(label, sched.tq_for(index))
            if gpu.spec.memory_total is not None:
                memory.add_metric(label, gpu.spec.memory_total)
        mode = GaugeMetricFamily("kiwi_scheduler_mode", "1 for the scheduler's current mode.",
                                 labels=["mode"])
        for name in ("on", "off", "auto"):
            mode.add_metric([name], 1.0 if sched.mode == name else 0.0)
        preemption = GaugeMetricFamily(
            "kiwi_preemption_enabled",
            "1 when preemption is on (every pool sets guarantee, weight and maximum).",
            value=1.0 if sched.preemption else 0.0)
        yield from (holders, queue, tq, memory, mode, preemption)

    def _counters(self, sched: Scheduler) -> Iterator[Metric]:
        helps = {
            "grants": "GPU grants to clients.",
            "drops": "Requests to a holder to give its GPU back (quantum, preemption, room...).",
            "preemptions": "Preemptible holders asked to leave for a pool below its guarantee.",
            "revocations": "Holders that ignored a drop past its grace and lost the GPU.",
            "steps_aside": "Mode auto, policy interactive: holders that left the GPU's time to a "
                           "light request beside them.",
            "turns": "Mode auto, interactive.turns: turns handed to a holder side by side "
                     "(a resume after a pause).",
        }
        for name, text in helps.items():
            yield CounterMetricFamily(f"kiwi_{name}", text, value=sched.counts.get(name, 0))

    def _pools(self, sched: Scheduler, now: float) -> Iterator[Metric]:
        share = GaugeMetricFamily(
            "kiwi_pool_share_ratio", "The pool's fraction of the GPU's time over the window.",
            labels=["gpu", "pool"])
        entitled = GaugeMetricFamily(
            "kiwi_pool_entitlement_ratio",
            "The fraction of the GPU's time the pool is entitled to while it contends.",
            labels=["gpu", "pool"])
        seconds = CounterMetricFamily("kiwi_pool_gpu_seconds",
                                      "Seconds the pool's clients held the GPU.",
                                      labels=["gpu", "pool"])
        for index, gpu in sched.gpus.items():
            contending = sorted({c.pool for c in (*gpu.holders.values(),
                                                  *gpu.waiters.values())})
            for pool, value in sched.shares(index, now).items():
                share.add_metric([str(index), pool], value)
            for pool, value in entitlements(sched.pool(p) for p in contending).items():
                entitled.add_metric([str(index), pool], value)
            for pool, value in sched.pool_gpu_seconds(index, now).items():
                seconds.add_metric([str(index), pool], value)
        yield from (share, entitled, seconds)

    def _clients(self, sched: Scheduler, now: float) -> Iterator[Metric]:
        seconds = CounterMetricFamily("kiwi_client_gpu_seconds",
                                      "Seconds the client held its GPU.", labels=CLIENT_LABELS)
        working_set = GaugeMetricFamily("kiwi_client_working_set_bytes",
                                        "GPU memory the client reported needing.",
                                        labels=CLIENT_LABELS)
        for client in sched.clients.values():
            labels = [str(client.gpu), client.pool, client.name,
                      client.labels.get("pod", ""), client.labels.get("namespace", "")]
            seconds.add_metric(labels, sched.gpu_seconds(client, now))
            if client.working_set is not None:
                working_set.add_metric(labels, client.working_set)
        yield from (seconds, working_set)

    def _memory(self, sched: Scheduler) -> Iterator[Metric]:
        """Feature ``memory``: where each client's memory is, and the evictions and restores
        the core counted."""
        resident = GaugeMetricFamily("kiwi_resident_bytes",
                                     "Bytes of GPU memory the client has on the GPU now.",
                                     labels=["gpu", "client"])
        evicted = GaugeMetricFamily("kiwi_evicted_bytes",
                                    "Bytes of the client's GPU memory in host memory now.",
                                    labels=["gpu", "client"])
        for client in sched.clients.values():
            if client.memory:
                labels = [str(client.gpu), client.name]
                resident.add_metric(labels, occupies(client))
                evicted.add_metric(labels, client.host_bytes)
        evictions = CounterMetricFamily(
            "kiwi_evictions", "Evictions asked: room (for a grant), release (a holder released "
                              "evicting), timeout and idle (checkpoints).",
            labels=["gpu", "reason"])
        for index, gpu in sched.gpus.items():
            for reason, count in sorted(gpu.evictions.items()):
                evictions.add_metric([str(index), reason], count)
        moved = CounterMetricFamily("kiwi_evicted_bytes", "Bytes evictions moved to host memory.",
                                    value=sched.counts.get("evicted_bytes", 0))
        restores = CounterMetricFamily("kiwi_restores", "Restores that ended (an evicted "
                                                        "client back on the GPU).",
                                       value=sched.counts.get("restores", 0))
        yield from (resident, evicted, evictions, moved, restores)


class Metrics:
    """The daemon's registry: the collector plus the handoff histogram it observes."""

    def __init__(self, scheduler: Scheduler | Callable[[], Scheduler],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(SchedulerCollector(scheduler, clock))
        self.handoff = Histogram(
            "kiwi_handoff_seconds",
            "The daemon's time from a release arriving to the next grant being sent.",
            buckets=DAEMON_BUCKETS, registry=self.registry)
        self.drop_to_grant = Histogram(
            "kiwi_drop_to_grant_seconds",
            "From asking a holder to give its GPU back to granting the GPU to the next client.",
            ["gpu"], buckets=HANDOFF_BUCKETS, registry=self.registry)
        self._asked: dict[int, float] = {}  # gpu -> when the first pending drop was sent
        self.eviction = Histogram(
            "kiwi_eviction_seconds", "How long a client took to move its memory to host memory "
                                     "(its evicted report).",
            ["gpu"], buckets=HANDOFF_BUCKETS, registry=self.registry)
        self.restore = Histogram(
            "kiwi_restore_seconds", "From granting an evicted client to its report that nothing "
                                    "is left in host memory.",
            ["gpu"], buckets=HANDOFF_BUCKETS, registry=self.registry)

    def observe_memory(self, kind: str, gpu: int, seconds: float) -> None:
        """An eviction or a restore ended (``Requests.memory_observers``)."""
        histogram = self.eviction if kind == "eviction" else self.restore
        histogram.labels(str(gpu)).observe(seconds)

    def observe(self, actions: Iterable[Action], now: float) -> None:
        """Call with every list of actions the scheduler returns, at the time it returned it."""
        for action in actions:
            if isinstance(action, (Drop, Revoke)):
                self._asked.setdefault(action.gpu, now)
            elif isinstance(action, Grant) and action.gpu in self._asked:
                self.drop_to_grant.labels(str(action.gpu)).observe(
                    now - self._asked.pop(action.gpu))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    async def serve(self, port: int, host: str = "0.0.0.0") -> asyncio.Server:
        """Serve ``GET /metrics`` on the running loop (see the module docstring for why)."""
        return await asyncio.start_server(self._handle, host, port)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
            method, _, rest = head.decode("latin-1").partition(" ")
            path = rest.split(" ", 1)[0].split("?", 1)[0]
            if method != "GET" or path not in ("/metrics", "/"):
                status, body, kind = "404 Not Found", b"try /metrics\n", "text/plain"
            else:
                status, body, kind = "200 OK", self.exposition(), CONTENT_TYPE_LATEST
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\n"
                         f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                         + body)
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError,
                ConnectionError):
            pass  # a scraper that hung up or sent garbage: nothing to answer
        finally:
            writer.close()


class Observed(Protocol):
    """What the metrics need of the running daemon (``nodeside.daemon.server.Daemon``), named
    here so that this module never imports the daemon that imports it."""

    scheduler: Scheduler
    handoff_observers: list[Callable[[float], None]]
    action_observers: list[Callable[[list[Action], float], None]]
    memory_observers: list[Callable[[str, int, float], None]]
    closers: list[Callable[[], None]]

    def now(self) -> float: ...


async def serve_metrics(daemon: Observed, port: int, address: str = "0.0.0.0") -> Metrics:
    """Wire metrics into a daemon and serve them on ``address:port`` (``--metrics-port``)."""
    metrics = Metrics(lambda: daemon.scheduler, clock=daemon.now)
    daemon.handoff_observers.append(metrics.handoff.observe)
    daemon.action_observers.append(metrics.observe)
    daemon.memory_observers.append(metrics.observe_memory)
    try:
        server = await metrics.serve(port, address)
    except OSError as exc:
        raise DaemonError(f"cannot serve metrics on {address}:{port}: {exc.strerror}") from None
    bound = server.sockets[0].getsockname()[1] if server.sockets else port
    log.info("Serving Prometheus metrics on http://%s:%d/metrics", address, bound)
    daemon.closers.append(server.close)
    return metrics
