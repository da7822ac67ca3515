"""Prometheus metrics of the node daemon (``--metrics-port``).

Two parts. ``SchedulerCollector`` reads the scheduler's own state at scrape time (holders,
queues, shares, GPU seconds, the core's counters), so nothing is counted twice and nothing can
drift from what ``status`` shows. ``Metrics`` adds what the state does not keep, two
histograms the daemon feeds: ``kiwi_handoff_seconds``, the daemon's own time from a release
arriving to the next grant being sent, and ``kiwi_drop_to_grant_seconds``, from asking a holder
for the GPU back to granting it to the next client (what a waiting notebook feels: it includes
the holder's time to finish and move its memory out).

Scrapers are served off the scheduling loop (``MetricsServer``): a small HTTP server on a thread
of its own, at most ``MAX_SCRAPERS`` connections at a time (more are closed at once, so idle
scrapers can never take the file descriptors kernels need), each given ``SCRAPE_TIMEOUT``
seconds to ask. The exposition itself is built on the loop, since the collector walks the
scheduler's dicts and only the loop may touch them: always after the scrape asked, one build for
all the scrapers waiting at the time, and never more than a hundredth of the loop's time
(``DUTY``): a scrape waits for its turn rather than the loop for the scrapers.

Where clients carry ``pod`` and ``namespace`` labels, the per-client series carry them only
when the operator asks (``--metrics-pod-labels``): the socket's status document hides them from
non-admins, and whoever reaches the port is nobody the daemon knows.

Names are prefixed ``kiwi_`` and use base units (seconds, bytes); counters end in ``_total``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

from nodeside.errors import DaemonError
from nodeside.scheduler.core import (
    Action,
    Drop,
    Evicted,
    Fetch,
    Grant,
    Restored,
    Revoke,
    Scheduler,
    Spill,
    TierMoved,
)
from nodeside.scheduler.ledger import occupies
from nodeside.scheduler.pools import entitlements

log = logging.getLogger("kiwi.metrics")

CLIENT_LABELS = ("gpu", "pool", "client")
#: Added to CLIENT_LABELS with ``--metrics-pod-labels``.
POD_LABELS = ("pod", "namespace")

#: Scrapers served at once; a connection past this is closed as it comes.
MAX_SCRAPERS = 8
#: Seconds a scraper has to send its request, and to read the answer.
SCRAPE_TIMEOUT = 5.0
#: The loop spends at most one part in DUTY of its time building the exposition: after a
#: build of T seconds the next waits DUTY * T (up to MAX_PAUSE), however many scrapers ask.
DUTY = 100
MAX_PAUSE = 5.0
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
                 clock: Callable[[], float] = time.monotonic, pod_labels: bool = False) -> None:
        self._scheduler = scheduler
        self._clock = clock
        self._labels = CLIENT_LABELS + POD_LABELS if pod_labels else CLIENT_LABELS

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
        names = self._labels
        seconds = CounterMetricFamily("kiwi_client_gpu_seconds",
                                      "Seconds the client held its GPU.", labels=names)
        working_set = GaugeMetricFamily("kiwi_client_working_set_bytes",
                                        "GPU memory the client reported needing.",
                                        labels=names)
        pods = len(names) > len(CLIENT_LABELS)
        for client in sched.clients.values():
            labels = [str(client.gpu), client.pool, client.name]
            if pods:
                labels += [client.labels.get("pod", ""), client.labels.get("namespace", "")]
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
        asked = CounterMetricFamily("kiwi_client_evictions_asked",
                                    "Evictions of other clients asked for this client's grants.",
                                    labels=["gpu", "client"])
        for client in sched.clients.values():
            if client.memory:
                labels = [str(client.gpu), client.name]
                resident.add_metric(labels, occupies(client))
                evicted.add_metric(labels, client.host_bytes)
            if client.evictions_asked:
                asked.add_metric([str(client.gpu), client.name], client.evictions_asked)
        evictions = CounterMetricFamily(
            "kiwi_evictions", "Evictions asked: room (for a grant), release (a holder released "
                              "evicting); checkpoints after timeout (no progress), failed (an "
                              "eviction that failed), idle.",
            labels=["gpu", "reason"])
        by_priority = CounterMetricFamily(
            "kiwi_evictions_asked_by", "Evictions asked for room, by the priority of the waiter "
                                       "that needed it.", labels=["gpu", "priority"])
        for index, gpu in sched.gpus.items():
            for reason, count in sorted(gpu.evictions.items()):
                evictions.add_metric([str(index), reason], count)
            for priority, count in sorted(gpu.evictions_by.items()):
                by_priority.add_metric([str(index), priority], count)
        moved = CounterMetricFamily("kiwi_evicted_bytes", "Bytes evictions moved to host memory.",
                                    value=sched.counts.get("evicted_bytes", 0))
        restores = CounterMetricFamily("kiwi_restores", "Restores that ended (an evicted "
                                                        "client back on the GPU).",
                                       value=sched.counts.get("restores", 0))
        yield from (resident, evicted, evictions, by_priority, asked, moved, restores)
        yield from self._tiers(sched)

    def _tiers(self, sched: Scheduler) -> Iterator[Metric]:
        """Feature ``tiers``: the node's host budget, each client's pinned and spilled bytes."""
        if sched.host_budget is not None:
            yield GaugeMetricFamily("kiwi_host_budget_bytes", "Host memory the node's clients "
                                    "may take for evicted memory, pinned shadows and staging.",
                                    value=sched.host_budget)
        pinned = GaugeMetricFamily("kiwi_pinned_bytes", "Bytes of the client's host memory "
                                   "pinned now (shadows and staging).", labels=["gpu", "client"])
        spilled = GaugeMetricFamily("kiwi_spilled_bytes", "Bytes of the client's memory in "
                                    "spill files on the node's disk now.",
                                    labels=["gpu", "client"])
        for client in sched.clients.values():
            tiering = client.tiering
            if tiering is not None:
                labels = [str(client.gpu), client.name]
                pinned.add_metric(labels, tiering.pinned)
                spilled.add_metric(labels, tiering.disk)
        yield from (pinned, spilled)


class Metrics:
    """The daemon's registry: the collector plus the handoff histogram it observes."""

    def __init__(self, scheduler: Scheduler | Callable[[], Scheduler],
                 clock: Callable[[], float] = time.monotonic, pod_labels: bool = False) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(SchedulerCollector(scheduler, clock, pod_labels))
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
        self.spills = Counter("kiwi_spills", "Spills to disk asked: idle (past spill_after), "
                              "budget (the host budget ran short).", ["gpu", "reason"],
                              registry=self.registry)
        self.fetches = Counter("kiwi_fetches", "Fetches asked on intent, by the tier the "
                               "memory is brought to.", ["gpu", "tier"], registry=self.registry)
        self.tier_moves = Counter("kiwi_tier_moves", "Moves between host memory and disk that "
                                  "ended, by where to and outcome (ok, failed).",
                                  ["gpu", "tier", "outcome"], registry=self.registry)
        self.tier_moved_bytes = Counter("kiwi_tier_moved_bytes", "Bytes moves between host "
                                        "memory and disk moved, by where to.", ["gpu", "tier"],
                                        registry=self.registry)

    def observe(self, actions: Iterable[Action], now: float) -> None:
        """Call with every list of actions the scheduler returns, at the time it returned it."""
        for action in actions:
            if isinstance(action, (Drop, Revoke)):
                self._asked.setdefault(action.gpu, now)
            elif isinstance(action, Grant) and action.gpu in self._asked:
                self.drop_to_grant.labels(str(action.gpu)).observe(
                    now - self._asked.pop(action.gpu))
            elif isinstance(action, Restored):
                self.restore.labels(str(action.gpu)).observe(action.seconds)
            elif isinstance(action, Evicted) and action.seconds is not None:
                self.eviction.labels(str(action.gpu)).observe(action.seconds)
            elif isinstance(action, Spill):
                self.spills.labels(str(action.gpu), action.reason).inc()
            elif isinstance(action, Fetch):
                self.fetches.labels(str(action.gpu), action.tier).inc()
            elif isinstance(action, TierMoved):
                gpu = str(action.gpu)
                self.tier_moves.labels(gpu, action.tier, "ok" if action.failed is None
                                       else "failed").inc()
                self.tier_moved_bytes.labels(gpu, action.tier).inc(action.nbytes)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)



class _Exposition:
    """The exposition as scrapers get it: built on the loop after the scrape asked (never
    older than the request), one build shared by every scraper waiting at the time, and the
    loop's time bounded: after a build that took T seconds, the next starts no sooner than
    ``DUTY * T`` seconds later (the scrape waits for it)."""

    def __init__(self, metrics: Metrics, loop: asyncio.AbstractEventLoop) -> None:
        self.metrics = metrics
        self.loop = loop
        self._body = b""
        self._built_at = float("-inf")  # when the last build started
        self._next_at = float("-inf")   # the next may start then
        self._lock = threading.Lock()

    def body(self) -> bytes:
        """On a server thread: an exposition built after this call began."""
        asked = time.monotonic()
        with self._lock:  # scrapers queue here: one build at a time
            if self._built_at >= asked:
                return self._body  # built while this one waited its turn
            pause = self._next_at - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            self._built_at = time.monotonic()
            future = asyncio.run_coroutine_threadsafe(self._build(), self.loop)
            try:
                self._body, seconds = future.result(timeout=SCRAPE_TIMEOUT)
            except concurrent.futures.TimeoutError:
                future.cancel()  # the loop is stuck: the last exposition is all there is
                seconds = SCRAPE_TIMEOUT
            self._next_at = time.monotonic() + min(MAX_PAUSE, DUTY * seconds)
            return self._body

    async def _build(self) -> tuple[bytes, float]:
        started = time.perf_counter()
        body = self.metrics.exposition()
        return body, time.perf_counter() - started


class _Scrape(BaseHTTPRequestHandler):
    """One scraper's request: ``GET /metrics`` (or ``/``); anything else is a 404."""

    server: MetricsServer
    timeout = SCRAPE_TIMEOUT
    protocol_version = "HTTP/1.0"

    def parse_request(self) -> bool:
        self.server.asked(self.connection)  # it said something: no longer idle
        return super().parse_request()

    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        path = self.path.split("?", 1)[0]
        if path not in ("/metrics", "/"):
            self._answer(404, b"try /metrics\n", "text/plain")
            return
        self._answer(200, self.server.exposition.body(), CONTENT_TYPE_LATEST)

    def _answer(self, code: int, body: bytes, kind: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - its signature
        pass  # a scrape is no event; a bad request is said once by the server (refused)

    def log_error(self, format: str, *args: Any) -> None:  # noqa: A002
        self.server.refused("a bad request", self.client_address)


class MetricsServer(ThreadingHTTPServer):
    """HTTP on threads of its own, at most MAX_SCRAPERS connections at once. At the cap, the
    oldest connection that has not sent its request yet makes room for the newcomer (idle
    connections, however many, never keep a scraper out); when every one has asked, the
    newcomer is closed."""

    daemon_threads = True
    #: The listen backlog: a burst of connections waits in the kernel, not in a SYN retry,
    #: and each past the cap is accepted and closed at once (the backlog holds no descriptor).
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], exposition: _Exposition,
                 max_scrapers: int = MAX_SCRAPERS) -> None:
        self.exposition = exposition
        self.max_scrapers = max_scrapers
        self._active = 0
        #: Connections served that have not sent their request yet, oldest first.
        self._silent: dict[Any, None] = {}
        self._count = threading.Lock()
        self._said_at = 0.0
        self._unsaid = 0
        super().__init__(address, _Scrape)

    def verify_request(self, request: Any, client_address: Any) -> bool:
        victim = None
        with self._count:
            if self._active >= self.max_scrapers:
                victim = next(iter(self._silent), None)
                if victim is None:  # every one of them asked: the newcomer waits its turn
                    over = True
                else:
                    del self._silent[victim]
                    over = False
            else:
                over = False
            if not over:
                self._active += 1
                self._silent[request] = None
        if victim is not None:
            # Its thread's read fails at once, and the thread ends (``_active`` falls then).
            with contextlib.suppress(OSError):
                victim.shutdown(socket.SHUT_RDWR)
        if over or victim is not None:
            self.refused(f"more than {self.max_scrapers} connections at once", client_address)
        return not over

    def asked(self, request: Any) -> None:
        with self._count:
            self._silent.pop(request, None)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._count:
                self._active -= 1
                self._silent.pop(request, None)

    def refused(self, why: str, client_address: Any) -> None:
        """One line a minute at most, however many scrapers misbehave."""
        now = time.monotonic()
        with self._count:
            self._unsaid += 1
            if now - self._said_at < 60.0:
                return
            count, self._unsaid, self._said_at = self._unsaid, 0, now
        log.warning("Metrics: refused %s from %s (%d refused in the last minute)", why,
                    client_address[0] if client_address else "?", count)

    def start(self) -> None:
        threading.Thread(target=self.serve_forever, name="kiwi-metrics", daemon=True).start()


def start_server(metrics: Metrics, address: str, port: int,
                 loop: asyncio.AbstractEventLoop) -> MetricsServer:
    """Serve ``metrics`` on ``address:port`` from threads of their own; the exposition is
    built on ``loop`` (the one the scheduler runs on). Stop it with ``shutdown``."""
    server = MetricsServer((address, port), _Exposition(metrics, loop))
    server.start()
    return server


class Observed(Protocol):
    """What the metrics need of the running daemon (``nodeside.daemon.server.Daemon``), named
    here so that this module never imports the daemon that imports it."""

    scheduler: Scheduler
    handoff_observers: list[Callable[[float], None]]
    action_observers: list[Callable[[list[Action], float], None]]
    closers: list[Callable[[], None]]

    def now(self) -> float: ...


async def serve_metrics(daemon: Observed, port: int, address: str = "127.0.0.1",
                        pod_labels: bool = False) -> Metrics:
    """Wire metrics into a daemon and serve them on ``address:port`` (``--metrics-port``), on
    threads of their own."""
    metrics = Metrics(lambda: daemon.scheduler, clock=daemon.now, pod_labels=pod_labels)
    daemon.handoff_observers.append(metrics.handoff.observe)
    daemon.action_observers.append(metrics.observe)
    try:
        server = start_server(metrics, address, port, asyncio.get_running_loop())
    except (OSError, OverflowError) as exc:  # OverflowError: a port past 65535
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise DaemonError(f"cannot serve metrics on {address}:{port}: {why}") from None
    bound = server.server_address[1]
    log.info("Serving Prometheus metrics on http://%s:%d/metrics%s", address, bound,
             " with pod and namespace labels" if pod_labels else "")
    daemon.closers.append(server.shutdown)
    daemon.closers.append(server.server_close)
    return metrics
