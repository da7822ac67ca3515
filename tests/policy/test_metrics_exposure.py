"""What the metrics port shows and to whom, and what its scrapers may cost (issue 34.8): over
real HTTP from a running daemon."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

from support import socket_answers, wait_for
from test_policy_daemon import metrics_url, scrape

from nodeside.client import Client
from nodeside.metrics import SCRAPE_TIMEOUT


def test_metrics_listen_on_localhost_unless_told_otherwise(start_daemon) -> None:
    daemon = start_daemon("--metrics-port", "0")
    url = metrics_url(daemon)
    assert url.startswith("http://127.0.0.1:")
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    listening = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True,
                               text=True).stdout.split()
    assert f"127.0.0.1:{port}" in listening, listening


def test_pods_and_namespaces_are_no_labels_unless_the_operator_asks(start_daemon) -> None:
    labels = {"pod": "nb-pod", "namespace": "team-a"}
    plain = start_daemon("--metrics-port", "0")
    asked = start_daemon("--metrics-port", "0", "--metrics-pod-labels")
    for daemon, shown in ((plain, False), (asked, True)):
        with Client(daemon.socket, name="nb-1", labels=labels) as kernel:
            kernel.acquire(timeout=10)
            series = [dict(labels) for (name, labels) in scrape(metrics_url(daemon))
                      if name == "kiwi_client_gpu_seconds_total"]
        assert [s["client"] for s in series] == ["nb-1"]
        assert ("namespace" in series[0] and "pod" in series[0]) is shown
        assert ("team-a" in str(series)) is shown


LIMITED = textwrap.dedent("""
    import resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[1])))
    from nodeside.daemon.main import main
    sys.exit(main(sys.argv[2:]))
""")


def test_idle_scrapers_cannot_take_the_descriptors_kernels_need(scratch: Path) -> None:
    sock_path = str(scratch / "kiwi.sock")
    log_path = scratch / "daemon.log"
    with open(log_path, "wb") as log:
        daemon = subprocess.Popen([sys.executable, "-c", LIMITED, "256", "--socket", sock_path,
                                   "--metrics-port", "0"], stdout=log, stderr=log)
    idle: list[socket.socket] = []
    try:
        wait_for(lambda: socket_answers(sock_path), 15, what="the daemon to listen")
        url = wait_for(lambda: next((line.split()[-1] for line in log_path.read_text().splitlines()
                                     if "Serving Prometheus metrics on" in line), None),
                       what="the metrics line")
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        for _ in range(400):  # far past the daemon's 256 descriptors; each says nothing
            conn = socket.socket()
            conn.settimeout(SCRAPE_TIMEOUT * 4)
            try:
                conn.connect(("127.0.0.1", port))
            except OSError:
                conn.close()
                continue
            idle.append(conn)
        with Client(sock_path, name="new kernel", reconnect_timeout=30) as kernel:
            kernel.acquire(timeout=30)
            assert kernel.holding
        # Past the cap each was closed at once; the ones served had SCRAPE_TIMEOUT to ask.
        closed = 0
        for conn in idle:
            try:
                closed += conn.recv(1) == b""
            except ConnectionResetError:
                closed += 1
        assert closed == len(idle)
        with urllib.request.urlopen(url, timeout=30) as reply:  # and scrapers are served
            assert reply.status == 200
        text = log_path.read_text()
        assert "Metrics: refused more than 8 connections at once" in text
        assert "Traceback" not in text
    finally:
        for conn in idle:
            conn.close()
        daemon.kill()
        daemon.wait()
