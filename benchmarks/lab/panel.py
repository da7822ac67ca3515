"""The Jupyter side's speed: the status endpoint under load, and how soon the panel shows a grant.

1. ``GET kiwi/api/status`` latency with 50 clients connected to the daemon (one holding, the
   rest queued), through a real `jupyter server`. Floor, same run: a raw ``Client.status()``
   round trip to the same daemon, what any status reader pays before HTTP and JSON.
2. Grant in the daemon to the panel showing it, in real headless Chromium: the holder releases,
   the daemon grants the waiter, and a MutationObserver in the page stamps the moment the panel
   shows the new holder. The panel waits on the long-poll, which the daemon's ``changed`` event
   answers; its refresh rate is set to a minute, so no poll can be what shows the grant. Floor,
   same run: the browser's own round trip for a plain status request, what showing any change
   costs after it happened.

Run: ``python -m benchmarks.lab.panel`` (``make bench`` runs it after the daemon's).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from benchmarks.common import REPO, percentile, report_row, start_daemon
from nodeside.client import Client

sys.path.insert(0, str(REPO / "tests" / "browser"))

CONNECTED = 50
#: Seconds a release waits at most after the queue shows: past the daemon's change interval.
SETTLE = 0.25
REQUESTS = 400
TOKEN = "kiwi-bench"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _start_daemon(directory: str) -> tuple[subprocess.Popen[bytes], str]:
    return start_daemon(directory, "--tq", "600")


def _start_server(socket_path: str, directory: str, max_age: float) -> tuple[Any, int]:
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", "--no-browser", "--allow-root",
         f"--port={port}", "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={TOKEN}",
         f"--ServerApp.root_dir={directory}", f"--KiwiExtension.socket={socket_path}",
         "--KiwiExtension.embedded_scheduler=False",
         f"--KiwiExtension.status_max_age={max_age}", "--ServerApp.log_level=WARN"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "JUPYTER_RUNTIME_DIR": os.path.join(directory, "runtime")})

    def up() -> bool:
        try:
            return _get(port) is not None
        except OSError:
            return False

    _wait(up, 60, "jupyter server")
    return server, port


def _get(port: int, connection: http.client.HTTPConnection | None = None) -> dict[str, Any]:
    conn = connection or http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/kiwi/api/status", headers={"Authorization": f"token {TOKEN}"})
    response = conn.getresponse()
    body = response.read()
    if response.status != 200:
        raise OSError(f"status {response.status}")
    return dict(json.loads(body))


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()


def status_endpoint() -> None:
    directory = tempfile.mkdtemp(prefix="kiwi-bench-", dir="/tmp")
    daemon, path = _start_daemon(directory)
    clients = [Client(path, name=f"bench-{i}") for i in range(CONNECTED)]
    try:
        clients[0].acquire(timeout=10)
        for client in clients[1:]:
            threading.Thread(target=lambda c=client: _quiet_acquire(c), daemon=True).start()
        with Client(path, register=False) as observer:
            _wait(lambda: len(observer.status()["gpus"][0]["queue"]) == CONNECTED - 1, 30,
                  "the queue to fill")
            floor = []
            for _ in range(REQUESTS):
                t = time.perf_counter()
                observer.status()
                floor.append(time.perf_counter() - t)
        floor_p50, floor_p99 = percentile(floor, 50), percentile(floor, 99)
        print(f"Floor: raw Client.status() round trip with {CONNECTED} clients connected, "
              f"p50 {floor_p50 * 1e3:.2f} ms, p99 {floor_p99 * 1e3:.2f} ms\n")
        print("| status endpoint | p50 (ms) | p99 (ms) | p50 / floor | p99 / floor |")
        print("| --- | --- | --- | --- | --- |")
        for label, max_age in (("coalesced (default, status_max_age 0.1 s)", 0.1),
                               ("every request to the daemon (status_max_age 0)", 0.0)):
            server, port = _start_server(path, directory, max_age)
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                samples = []
                for _ in range(REQUESTS):
                    t = time.perf_counter()
                    document = _get(port, conn)
                    samples.append(time.perf_counter() - t)
                assert len(document["clients"]) == CONNECTED
                p50, p99 = percentile(samples, 50), percentile(samples, 99)
                report_row(label, f"{p50 * 1e3:.2f}", f"{p99 * 1e3:.2f}",
                           f"{p50 / floor_p50:.1f}x", f"{p99 / floor_p99:.1f}x")
            finally:
                _stop(server)
    finally:
        for client in clients:
            client.close()
        _stop(daemon)


def _quiet_acquire(client: Client) -> None:
    with contextlib.suppress(ConnectionError, TimeoutError):  # closed at the end
        client.acquire(timeout=600)


OBSERVER = """
() => {
  window.__kiwiSeen = [];
  let last = null;
  const panel = document.querySelector('#jp-kiwi-panel');
  new MutationObserver(() => {
    const holder = panel.querySelector('.jp-Kiwi-holderName');
    const name = holder ? holder.firstChild.textContent : '';
    if (name !== last) { last = name; window.__kiwiSeen.push([name, Date.now()]); }
  }).observe(panel, { subtree: true, childList: true, characterData: true });
}
"""

FETCH_RTT = """
async (url) => {
  const samples = [];
  for (let i = 0; i < 50; i++) {
    const t = performance.now();
    await (await fetch(url)).json();
    samples.push(performance.now() - t);
  }
  return samples;
}
"""


def grant_to_panel(rounds: int = 20) -> None:
    from labserver import CHROMIUM, CHROMIUM_ARGS, LabServer

    if not os.access(CHROMIUM, os.X_OK):
        print(f"\n(grant-to-panel delay skipped: {CHROMIUM} not found)")
        return
    from playwright.sync_api import sync_playwright

    print("\n| panel updates | grant to panel p50 (ms) | p99 (ms) | floor (ms) | "
          "p50 / floor |")
    print("| --- | --- | --- | --- | --- |")
    # A minute between polls: a grant that shows sooner came by the long-poll.
    for label, refresh_ms in (("long-poll (refreshRate 60 s)", 60_000),):
        lab = LabServer("--KiwiExtension.tq=600").start()
        try:
            lab.api("PUT", "lab/api/settings/kiwi-jupyter:plugin",
                    {"raw": json.dumps({"refreshRate": refresh_ms})})
            socket_path = lab.kiwi_status()["socket"]
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                                     args=CHROMIUM_ARGS)
                page = browser.new_page()
                page.goto(lab.url("lab"))
                page.click('li.lm-TabBar-tab[data-id="jp-kiwi-panel"]', timeout=90_000)
                page.wait_for_selector("#jp-kiwi-panel .jp-Kiwi-scheduler")
                rtt = page.evaluate(FETCH_RTT, lab.url("kiwi/api/status"))
                page.evaluate(OBSERVER)
                delays = _alternate_holders(page, socket_path, rounds, SETTLE)
                browser.close()
            floor = percentile(rtt, 50)
            p50, p99 = percentile(delays, 50), percentile(delays, 99)
            report_row(label, f"{p50:.0f}", f"{p99:.0f}", f"{floor:.0f}",
                       f"{p50 / floor:.2f}x")
        finally:
            lab.stop()


def _alternate_holders(page: Any, socket_path: str, rounds: int, interval: float) -> list[float]:
    """Hand the GPU back and forth between two clients; the delay of each handoff as seen in
    the page, in milliseconds. The panel labels a client with its user, "bench-a (root)",
    hence the prefix match.

    Each release waits a random part of ``interval`` first: seeing the queue in the page means
    a change was just told, and releasing at once would always land inside the daemon's
    coalescing interval for change events (measuring its worst case rather than a grant at a
    random moment, as grants happen in use)."""
    a, b = Client(socket_path, name="bench-a"), Client(socket_path, name="bench-b")
    delays = []
    try:
        a.acquire(timeout=10)
        holder, waiter = a, b
        for _ in range(rounds):
            threading.Thread(target=lambda w=waiter: _quiet_acquire(w), daemon=True).start()
            page.wait_for_function(
                "n => document.querySelector('#jp-kiwi-panel .jp-Kiwi-queueItem')"
                " && window.__kiwiSeen.length && window.__kiwiSeen.at(-1)[0].startsWith(n)",
                arg=holder.name, timeout=30_000)
            seen_before = page.evaluate("window.__kiwiSeen.length")
            time.sleep(random.uniform(0, interval))
            released_at = time.time() * 1000
            holder.release()
            page.wait_for_function(
                "([n, k]) => window.__kiwiSeen.length > k"
                " && window.__kiwiSeen.at(-1)[0].startsWith(n)",
                arg=[waiter.name, seen_before], timeout=30_000)
            shown_at = page.evaluate("window.__kiwiSeen.at(-1)[1]")
            delays.append(shown_at - released_at)
            holder, waiter = waiter, holder
    finally:
        a.close()
        b.close()
    return delays


def main() -> None:
    print(f"# Jupyter side benchmarks ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs)\n")
    status_endpoint()
    grant_to_panel()


if __name__ == "__main__":
    main()
