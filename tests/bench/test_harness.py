"""The C harness and the relay-ring floor that the handoff benchmarks stand on.

Small runs, to show each part works and measures what it says; the figures themselves are the
benchmarks' business (benchmarks/daemon/handoff.py), never asserted here.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import short_tmpdir

from benchmarks.daemon import py_ring
from benchmarks.daemon.cprograms import build
from benchmarks.daemon.instructions import per_handoff
from benchmarks.daemon.servers import (
    NVSHARE,
    PY_RING,
    SERVERS,
    NoNvshare,
    dialect,
    harness,
    serving,
)
from benchmarks.daemon.throughput import flat_out

#: Exact CPU time per thread; without it the harness falls back to 10 ms ticks.
SCHEDSTAT = Path("/proc/self/schedstat").exists()


@pytest.fixture
def folder() -> Iterator[Path]:
    """A folder for a socket, short enough for its path, removed afterwards."""
    path = short_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("kind", SERVERS)
def test_the_harness_measures_every_handoff_among_waiting_contenders(
        kind: str, folder: Path) -> None:
    with serving(kind, folder) as (server, sock):
        run = harness(sock, "--contenders", "8", "--idle", "4", "--handoffs", "200",
                      "--warmup", "20", "--samples", server_pid=server.pid, timeout=120)
    assert run.handoffs == 200
    assert 0 < run.p50_us <= run.p99_us <= run.max_us
    if SCHEDSTAT:
        assert run.server_cpu_s > 0  # the server's own CPU over the measured handoffs


@pytest.mark.parametrize("kind", SERVERS)
def test_asking_again_with_requeue_never_stalls_whether_or_not_the_server_serves_it(
        kind: str, folder: Path) -> None:
    """A daemon that predates "requeue" answers it as a plain release; the harness then asks
    again in a second request instead of waiting for a grant that never comes."""
    with serving(kind, folder) as (server, sock):
        run = harness(sock, "--contenders", "3", "--handoffs", "100", "--requeue",
                      server_pid=server.pid, timeout=120)
    assert run.handoffs == 100
    if kind == "floor":
        assert run.requeue_unserved == 0


def test_the_probe_counts_a_round_the_server_never_answers(folder: Path) -> None:
    with serving("floor", folder) as (server, sock):
        probe = subprocess.Popen([str(build("contenders")), sock, "--probe", "--seconds", "0.3",
                                  "--start-after-ms", "1000"], stdout=subprocess.PIPE, text=True)
        assert probe.stdout is not None
        assert probe.stdout.readline() == "registered 1\n"
        # connected, and before its first round (a second away) the server stops answering
        server.send_signal(signal.SIGSTOP)
        try:
            out, _ = probe.communicate(timeout=60)
        finally:
            server.send_signal(signal.SIGCONT)
    facts = dict(line.split() for line in out.splitlines())
    assert probe.returncode == 0
    assert facts["stalled"] == "1"


#: An nvshare-scheduler built from github.com/grgalex/nvshare, to run its scheduler beside the
#: others: never part of this repository, so the tests that need it run only when one is named.
NVSHARE_BUILD = os.environ.get("KIWI_BENCH_NVSHARE")
needs_nvshare = pytest.mark.skipif(
    not NVSHARE_BUILD, reason="KIWI_BENCH_NVSHARE names no nvshare-scheduler build")


@needs_nvshare
def test_the_harness_measures_nvshares_scheduler_in_its_own_protocol(folder: Path) -> None:
    with serving(NVSHARE, folder, nvshare=NVSHARE_BUILD) as (server, sock):
        run = harness(sock, *dialect(NVSHARE), "--contenders", "8", "--handoffs", "200",
                      "--warmup", "20", server_pid=server.pid, timeout=120)
    assert run.handoffs == 200
    assert 0 < run.p50_us <= run.p99_us <= run.max_us
    if SCHEDSTAT:
        assert run.server_cpu_s > 0


def test_a_missing_nvshare_build_is_named_in_the_error(folder: Path) -> None:
    with pytest.raises(NoNvshare, match="no-such-build"), \
            serving(NVSHARE, folder, nvshare=folder / "no-such-build"):
        pass


@pytest.mark.parametrize("kind", SERVERS)
def test_processes_flat_out_count_every_grant_they_read(kind: str) -> None:
    flat = flat_out(kind, 4, 1.0)
    assert flat.grants > 0
    assert flat.seconds == pytest.approx(1.0, abs=0.5)
    if SCHEDSTAT:
        assert flat.server_cpu_s > 0


def test_the_python_ring_serves_the_harness_compiled(folder: Path) -> None:
    with serving(PY_RING, folder) as (server, sock):
        run = harness(sock, "--contenders", "4", "--handoffs", "200", "--warmup", "20",
                      server_pid=server.pid, timeout=120)
        requeued = harness(sock, "--contenders", "3", "--handoffs", "100", "--requeue",
                           timeout=120)
    assert run.handoffs == 200 and requeued.handoffs == 100
    assert requeued.requeue_unserved == 0
    assert any(path.suffix == ".so" for path in py_ring.build().iterdir())  # compiled


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="no valgrind")
def test_instructions_per_handoff_are_counted_from_two_runs() -> None:
    # The C ring: quick to start under callgrind; a few thousand instructions a handoff.
    assert 1_000 < per_handoff("floor", 2, 50) < 100_000
