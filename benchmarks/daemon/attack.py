"""A probe client's service while peers attack the daemon (issues 11.1, 34 and 40).

    python -m benchmarks.daemon.attack [--idle 1000] [--seconds 4] [--rss-cap-mib 1024]
        [--only flood,deaf,readers,watchers,scrapers,uids,reports,liar]

The daemon has --idle registered idle clients (each with two labels), so each status document
is large, and serves metrics on localhost. A probe (the C harness's --probe: acquire, grant,
release, released, 1 ms pause, again) measures its round trip quiet, then under each attack in
turn, each alone:

* ``flood`` (11.1): one peer writes 64 KiB of ``{"op":"status"}`` lines per write, never reading;
* ``deaf`` (34.1): 500 peers that asked for ``changed`` events each ask for 8 status documents
  and never read, while the probe's handoffs make events for all of them;
* ``readers`` (34.6): 16 peers ask for the status document over and over, 16 in flight each,
  and read every reply;
* ``watchers`` (34.7): 4 peers do what a panel's server does without pacing: re-read the whole
  document after every ``changed`` event;
* ``scrapers`` (34.8): 4 Prometheus scrapers in a loop, and 200 TCP connections to the metrics
  port that never say a word;
* ``uids``, ``reports``, ``liar`` (40: N7e, N2, N4b): attack_peers.py.

Reported per phase: the probe's p50/p99/max, rounds left unanswered, the p99 against quiet
(target: at most 5x), what the attacker got, and the daemon's RSS at its peak (target: at most
64 MiB over its RSS with the clients). Everything is bounded: each attacker stops after
--seconds, and a daemon whose RSS passes --rss-cap-mib is killed (reported as such).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable

from benchmarks.common import rss_bytes, utc_now
from benchmarks.daemon.attack_peers import ATTACKERS as PEER_ATTACKERS
from benchmarks.daemon.attack_peers import PHASES as PEER_PHASES
from benchmarks.daemon.python_clients import IDLERS
from benchmarks.daemon.servers import (
    NoAnswer,
    Run,
    environment,
    harness,
    harness_command,
    machine_load,
    parse,
    serving,
)

RATIO_GOAL = 5.0
#: What one flooding connection may cost the daemon's memory, at most: its unsent replies are
#: bounded (about a MiB) and it is read no further, so tens of MiB is already generous.
RSS_GROWTH_MIB = 64

# Each attacker: a Python script (path, seconds, [metrics port]) that prints "attacking" once it
# is under way, attacks until its time is up, and prints what it got.
ATTACKERS = {
    # hello, then 64 KiB writes of status requests, never reading.
    "flood": """
import socket, sys, time
path, seconds = sys.argv[1], float(sys.argv[2])
s = socket.socket(socket.AF_UNIX)
s.connect(path)
s.sendall(b'{"op":"hello","version":1}\\n')
s.recv(4096)
line = b'{"op":"status"}\\n'
burst = line * (65536 // len(line))
sent = s.send(burst)
print("attacking", flush=True)  # the probe starts its rounds on this
s.setblocking(False)
end = time.monotonic() + seconds
while time.monotonic() < end:
    try:
        sent += s.send(burst)
    except BlockingIOError:
        time.sleep(0.001)  # the daemon stopped reading us: what backpressure should do
    except OSError:
        break  # the daemon closed us
print(f"{sent / 2**20:,.1f} MiB written", flush=True)
""",
    # 500 peers with changed events, 8 status documents asked each, nothing ever read.
    "deaf": """
import resource, socket, sys, time
resource.setrlimit(resource.RLIMIT_NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE)[1:] * 2)
path, seconds = sys.argv[1], float(sys.argv[2])
peers = []
for _ in range(500):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.sendall(b'{"op":"hello","version":1,"features":["changes"]}\\n')
    s.recv(4096)
    s.sendall(b'{"op":"status"}\\n' * 8)
    peers.append(s)
print("attacking", flush=True)
time.sleep(seconds)
closed = 0
for s in peers:
    s.setblocking(False)
    try:
        while s.recv(1 << 20):
            pass
    except BlockingIOError:
        continue
    except OSError:
        pass
    closed += 1
print(f"{closed} of {len(peers)} cut off", flush=True)
""",
    # 16 peers, 16 status requests in flight each, every reply read.
    "readers": """
import socket, sys, threading, time
path, seconds = sys.argv[1], float(sys.argv[2])
end = time.monotonic() + seconds
answered = []
def read():
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    f = s.makefile("rb")
    s.sendall(b'{"op":"hello","version":1}\\n')
    f.readline()
    s.sendall(b'{"op":"status"}\\n' * 16)
    while time.monotonic() < end:
        f.readline()
        answered.append(1)
        s.sendall(b'{"op":"status"}\\n')
threads = [threading.Thread(target=read, daemon=True) for _ in range(16)]
for t in threads:
    t.start()
print("attacking", flush=True)
for t in threads:  # one deadline for all; a thread stuck on a read that never comes is a daemon
    t.join(max(0.0, end + 10 - time.monotonic()))
print(f"{len(answered):,} documents read", flush=True)
""",
    # 4 peers that re-read the document after every changed event.
    "watchers": """
import json, socket, sys, threading, time
path, seconds = sys.argv[1], float(sys.argv[2])
end = time.monotonic() + seconds
documents = []
def watch():
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    f = s.makefile("rb")
    s.sendall(b'{"op":"hello","version":1,"features":["changes"]}\\n')
    f.readline()
    while time.monotonic() < end:
        op = json.loads(f.readline())["op"]
        if op == "changed":
            s.sendall(b'{"op":"status","seq":1}\\n')
        elif op == "status":
            documents.append(1)
threads = [threading.Thread(target=watch, daemon=True) for _ in range(4)]
for t in threads:
    t.start()
print("attacking", flush=True)
for t in threads:  # one deadline for all; a thread stuck on a read that never comes is a daemon
    t.join(max(0.0, end + 10 - time.monotonic()))
print(f"{len(documents):,} documents read", flush=True)
""",
    # 4 scrapers in a loop, and 200 silent TCP connections to the metrics port.
    "scrapers": """
import socket, sys, threading, time, urllib.request
path, seconds, port = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
end = time.monotonic() + seconds
scrapes, refused = [], []
silent = []
for _ in range(200):
    c = socket.socket()
    try:
        c.connect(("127.0.0.1", port))
        silent.append(c)
    except OSError:
        c.close()
def scrape():
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                r.read()
            scrapes.append(1)
        except OSError:
            refused.append(1)
            time.sleep(0.05)
threads = [threading.Thread(target=scrape, daemon=True) for _ in range(4)]
for t in threads:
    t.start()
print("attacking", flush=True)
for t in threads:  # one deadline for all; a thread stuck on a read that never comes is a daemon
    t.join(max(0.0, end + 10 - time.monotonic()))
print(f"{len(scrapes):,} scrapes, {len(refused):,} refused", flush=True)
""",
}
ATTACKERS.update(PEER_ATTACKERS)
#: The phase each attack is reported as (the flood keeps its name from issue 11.1).
PHASES = {"flood": "under attack", "deaf": "events never read", "readers": "status readers",
          "watchers": "watchers re-reading", "scrapers": "metrics scrapers", **PEER_PHASES}
#: The daemon's config: a socket every user reaches (the ``uids`` attack), an idle client given
#: the default 10 s to answer ``evict`` (``liar``).
CONFIG = "socket_mode: '0666'\nevict_timeout: 10\n"


class Watch(threading.Thread):
    """Samples the daemon's RSS every 50 ms; kills the daemon past the cap."""

    def __init__(self, server: subprocess.Popen[bytes], cap: int) -> None:
        super().__init__(daemon=True)
        self.server, self.cap = server, cap
        self.peak, self.killed_at = 0, 0
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.05):
            rss = rss_bytes(self.server.pid)
            self.peak = max(self.peak, rss)
            if rss > self.cap and self.server.poll() is None:
                self.killed_at = rss
                self.server.kill()


def probe_command(sock: str, seconds: float) -> list[str]:
    return [sock, "--probe", "--seconds", str(seconds), "--handoffs", "1000000",
            "--interval-us", "1000"]


def probe(sock: str, seconds: float) -> Run:
    return harness(*probe_command(sock, seconds), timeout=seconds + 60)


def connected_probe(sock: str, seconds: float) -> tuple[Callable[[], None], Callable[[], Run]]:
    """A probe, connected and registered when this returns; call the first function returned
    to start its rounds, the second to collect its figures."""
    probe = subprocess.Popen(harness_command(*probe_command(sock, seconds), "--wait-stdin"),
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    assert probe.stdin is not None and probe.stdout is not None
    first = probe.stdout.readline()  # "registered 1", or nothing when the setup failed
    if first != "registered 1\n":
        out, err = probe.communicate(timeout=60)
        parse(sock, probe.returncode, first + out, err)  # raises, saying why
        raise RuntimeError(f"the probe did not register: {first!r}")

    def start() -> None:
        assert probe.stdin is not None
        probe.stdin.write("go\n")
        probe.stdin.flush()

    def collect() -> Run:
        out, err = probe.communicate(timeout=seconds + 60)
        return parse(sock, probe.returncode, first + out, err)
    return start, collect


def mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def free_port() -> int:
    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        return int(probe_socket.getsockname()[1])


class Phase:
    """What the probe saw under one attack, and what the attack cost the daemon."""

    def __init__(self, name: str, run: Run, got: str, peak: int, killed: int) -> None:
        self.name, self.run, self.got, self.peak, self.killed = name, run, got, peak, killed


def attacked(attack: str, server: subprocess.Popen[bytes], sock: str, seconds: float,
             metrics_port: int, cap: int) -> Phase:
    """The probe's rounds while ``attack`` runs, and the daemon's RSS at its peak meanwhile."""
    watch = Watch(server, cap)
    watch.start()
    # The probe connects before the attack and starts its rounds once the attack runs.
    start_probe, collected = connected_probe(sock, seconds)
    attacker = subprocess.Popen(
        [sys.executable, "-c", ATTACKERS[attack], sock, str(seconds + 1), str(metrics_port)],
        stdout=subprocess.PIPE, text=True)
    assert attacker.stdout is not None
    if attacker.stdout.readline().strip() != "attacking":
        attacker.kill()
        raise RuntimeError(f"the {attack} attacker did not start")
    start_probe()
    run = collected()
    got = (attacker.communicate(timeout=seconds + 60)[0] or "").strip()
    watch.stopped.set()
    watch.join()
    return Phase(PHASES[attack], run, got, watch.peak, watch.killed_at)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--idle", type=int, default=1000, help="registered idle clients")
    parser.add_argument("--seconds", type=float, default=4.0, help="probe time per phase")
    parser.add_argument("--rss-cap-mib", type=int, default=1024)
    parser.add_argument("--only", default=",".join(ATTACKERS),
                        help=f"attacks to run, of {', '.join(ATTACKERS)}")
    args = parser.parse_args(argv)
    attacks = [a for a in args.only.split(",") if a]
    unknown = set(attacks) - ATTACKERS.keys()
    if unknown:
        parser.error(f"no attack named {', '.join(sorted(unknown))}")
    load_before = machine_load()
    metrics_port = free_port()
    with tempfile.TemporaryDirectory(prefix="kiwi-bench-", dir="/tmp") as tmp:
        os.chmod(tmp, 0o755)  # other users reach the socket (``uids``)
        config = os.path.join(tmp, "kiwi.yaml")
        with open(config, "w") as file:
            file.write(CONFIG)
        return attack_all(args, attacks, load_before, metrics_port, tmp, config)


def attack_all(args: argparse.Namespace, attacks: list[str], load_before: str,
               metrics_port: int, tmp: str, config: str) -> str:
    phases: list[Phase] = []
    after: Run | str | None = None
    with serving("kiwi", tmp, "--metrics-port", str(metrics_port), "--gpu-memory", "16GiB",
                 "--config", config) as (server, sock):
        env = environment(sock)
        rss_start = rss_bytes(server.pid)
        idlers = subprocess.Popen([sys.executable, "-c", IDLERS, sock, str(args.idle), "labels"],
                                  env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True)
        try:
            assert idlers.stdout is not None and idlers.stdout.readline().strip() == "ready"
            rss_idle = rss_bytes(server.pid)
            quiet = probe(sock, args.seconds)
            for attack in attacks:
                if server.poll() is not None:
                    break
                phases.append(attacked(attack, server, sock, args.seconds, metrics_port,
                                       args.rss_cap_mib * 2**20))
            alive = server.poll() is None
            rss_after = rss_bytes(server.pid) if alive else 0
            if alive:
                try:
                    after = harness(*probe_command(sock, 1.0), "--setup-seconds", "10",
                                    timeout=60)
                except NoAnswer:
                    after = "no answer to hello and register within 10 s"
        finally:
            idlers.kill()
            idlers.wait()
    return report(args, load_before, quiet, phases, after, alive,
                  (rss_start, rss_idle, rss_after))


def report(args: argparse.Namespace, load_before: str, quiet: Run, phases: list[Phase],
           after: Run | str | None, alive: bool, rss: tuple[int, int, int]) -> str:
    rss_start, rss_idle, rss_after = rss
    lines = [
        f"## Probe under attack ({utc_now()})", "",
        f"{args.idle:,} registered idle clients; each attack runs alone for "
        f"{args.seconds + 1:g} s while the probe acquires, releases and pauses 1 ms for "
        f"{args.seconds:g} s. Machine: {load_before} before, {machine_load()} after.",
        "",
        "| phase | probe rounds | p50 (µs) | p99 (µs) | max (µs) | rounds unanswered | "
        "the attacker got |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    rows: list[tuple[str, Run, str]] = [("quiet", quiet, "")]
    rows += [(phase.name, phase.run, phase.got) for phase in phases]
    if isinstance(after, Run):
        rows.append(("after the attacks", after, ""))
    for name, run, got in rows:
        figures = ([f"{run.p50_us:,.1f}", f"{run.p99_us:,.1f}", f"{run.max_us:,.1f}"]
                   if run.handoffs else ["–", "–", "–"])
        lines.append(f"| {name} | {run.handoffs:,} | {' | '.join(figures)} | {run.stalled} | "
                     f"{got} |")
    lines += ["", "| measure | value | target | met |", "| --- | --- | --- | --- |"]
    for phase in phases:
        run = phase.run
        ratio = run.p99_us / quiet.p99_us if run.handoffs else float("inf")
        shown = f"{ratio:.2f}x" if run.handoffs else "no round answered"
        met = "yes" if ratio <= RATIO_GOAL and not run.stalled and not phase.killed else "no"
        grew = phase.peak - rss_idle
        bounded = not phase.killed and grew <= RSS_GROWTH_MIB * 2**20
        lines += [
            f"| probe p99 {phase.name} / quiet | {shown} | ≤ {RATIO_GOAL:g}x | {met} |",
            f"| daemon RSS peak {phase.name} | {mib(phase.peak)} "
            f"({'killed' if phase.killed else mib(grew) + ' over the clients'}) | at most "
            f"{RSS_GROWTH_MIB} MiB over the clients' | {'yes' if bounded else 'no'} |",
        ]
    lines.append(f"| daemon RSS: started / {args.idle:,} clients / after | {mib(rss_start)} / "
                 f"{mib(rss_idle)} / {mib(rss_after) if alive else 'killed'} | | |")
    if isinstance(after, str):
        lines.append(f"\nAfter the attacks, a new client got {after}.")
    for phase in phases:
        if phase.killed:
            lines.append(f"\nUnder {phase.name} the daemon passed the {args.rss_cap_mib} MiB "
                         f"cap ({mib(phase.killed)}) and was killed by the benchmark.")
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main()
