"""The policy as a running daemon shows it: Prometheus metrics scraped over HTTP, the pools in
the status document, and ``kiwictl pools`` saying why preemption is off."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import urllib.request

from prometheus_client.parser import text_string_to_metric_families
from support import DaemonProcess, client_state, wait_event, wait_for, wait_for_status

from nodeside.client import Client

PARTIAL = """\
pools:
  training:   {guarantee: 0.3, weight: 1, maximum: 0.7}
  simulation: {guarantee: 0.5, weight: 3}
"""


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(url, timeout=10) as reply:
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("text/plain")
        text = reply.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def metrics_url(daemon: DaemonProcess) -> str:
    match = daemon.wait_log(r"Serving Prometheus metrics on (http://[\d.]+:\d+/metrics)")
    return match.group(1)


def kiwictl(daemon: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nodeside.ctl", "--socket", daemon.socket,
                           *args], capture_output=True, text=True, timeout=30)


def test_metrics_are_scraped_over_http_from_a_running_daemon(start_daemon):
    # A long grace: b stays queued until a releases (a revoke at 2.2 s ended the window in
    # which a scrape, paced by what building the exposition costs, could see it on a loaded
    # machine).
    daemon = start_daemon("--tq", "0.2", "--grace", "30", "--metrics-port", "0",
                          "--metrics-address", "127.0.0.1", "--metrics-pod-labels")
    url = metrics_url(daemon)
    labels = {"pod": "nb-pod", "namespace": "team-a"}
    with Client(daemon.socket, name="nb-1", labels=labels) as a, \
            Client(daemon.socket, name="nb-2") as b:
        a.acquire(timeout=5)
        got = scrape(url)
        assert got[("kiwi_gpu_holders", (("gpu", "0"),))] == 1
        assert got[("kiwi_grants_total", ())] == 1
        waiter = _start_acquire(b)
        wait_for(lambda: scrape(url)[("kiwi_gpu_queue_length", (("gpu", "0"),))] == 1,
                 what="b to queue")
        wait_event(a.drop_requested, what="a's quantum to end")
        a.release()
        waiter.join(10)
        assert b.holding
        got = scrape(url)
    assert got[("kiwi_drops_total", ())] >= 1
    assert got[("kiwi_handoff_seconds_count", ())] >= 1
    assert got[("kiwi_drop_to_grant_seconds_count", (("gpu", "0"),))] >= 1
    series = (("client", "nb-1"), ("gpu", "0"), ("namespace", "team-a"), ("pod", "nb-pod"),
              ("pool", "default"))
    assert got[("kiwi_client_gpu_seconds_total", series)] > 0
    assert got[("kiwi_pool_gpu_seconds_total", (("gpu", "0"), ("pool", "default")))] > 0


def _start_acquire(client: Client) -> threading.Thread:
    """Ask for the GPU from a thread; a test that closes the client while it waits ends it."""
    def acquire() -> None:
        with contextlib.suppress(ConnectionError):
            client.acquire(timeout=10)

    thread = threading.Thread(target=acquire, daemon=True)
    thread.start()
    return thread


def test_a_metrics_port_in_use_is_a_clear_start_error(start_daemon, scratch):
    first = start_daemon("--metrics-port", "0", "--metrics-address", "127.0.0.1")
    port = metrics_url(first).rsplit(":", 1)[1].split("/")[0]
    second = DaemonProcess(scratch, "--metrics-port", port, "--metrics-address", "127.0.0.1")
    try:
        second.start()
    except RuntimeError as exc:
        assert f"cannot serve metrics on 127.0.0.1:{port}" in str(exc)
    else:
        raise AssertionError("a second daemon on the same metrics port started")
    finally:
        second.kill()


def test_partial_pools_turn_preemption_off_and_status_and_kiwictl_say_why(start_daemon,
                                                                          scratch):
    config = scratch / "kiwi.yaml"
    config.write_text(PARTIAL)
    daemon = start_daemon("--tq", "5", "--config", str(config))
    daemon.wait_log(r"Preemption is off")
    with Client(daemon.socket, name="low", pool="training", priority="LOW") as low, \
            Client(daemon.socket, name="claimant", pool="simulation") as claimant:
        low.acquire(timeout=5)
        _start_acquire(claimant)
        wait_for_status(daemon.socket, lambda doc: client_state(doc, "claimant") == "waiting",
                        what="the claimant to queue")
        doc = claimant.status()
        result = kiwictl(daemon, "pools")
    assert doc["preemption"] is False
    assert "simulation lacks maximum" in doc["preemption_off_reason"]
    simulation = next(p for p in doc["pools"] if p["name"] == "simulation")
    for key in ("name", "guarantee", "weight", "maximum", "share", "clients"):
        assert key in simulation
    assert simulation["waiting_clients"] == ["claimant"]
    assert "preemption is off" in simulation["stuck"]
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Preemption: off (preemption is off: every pool must set")
    assert "waiting: claimant" in result.stdout
    assert "stuck: below its guarantee (0.00 of 0.5), but preemption is off" in result.stdout


def test_kiwictl_pools_json_prints_the_pools_entries(daemon):
    result = kiwictl(daemon, "pools", "--json")
    assert result.returncode == 0
    (default,) = json.loads(result.stdout)
    assert default["name"] == "default" and default["stuck"] is None
