"""A probe client's service while a peer floods the daemon with pipelined requests (issue 11.1).

    python -m benchmarks.daemon.attack [--idle 1000] [--seconds 4] [--rss-cap-mib 1024]

The daemon has --idle registered idle clients, so each status document is large. A probe (the
C harness's --probe: acquire, grant, release, released, 1 ms pause, again) measures its round
trip quiet, then while an attacker writes 64 KiB of ``{"op":"status"}`` lines per write and never
reads a reply. Reported: the probe's p50/p99 quiet and under attack, the ratio of the p99s
(target: at most 5x), rounds left unanswered, and the daemon's RSS before, at its peak and after.

Everything is bounded: the attacker and the probe stop after --seconds, and a daemon whose RSS
passes --rss-cap-mib is killed (reported as such), so the run ends by itself on any daemon.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable

from benchmarks.common import rss_bytes, utc_now
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

# The attacker: hello, then 64 KiB writes of status requests, never reading, until its time is up.
ATTACKER = """
import socket, sys, time
path, seconds = sys.argv[1], float(sys.argv[2])
s = socket.socket(socket.AF_UNIX)
s.connect(path)
s.sendall(b'{"op":"hello","version":1}\\n')
s.recv(4096)
line = b'{"op":"status"}\\n'
burst = line * (65536 // len(line))
sent = s.send(burst)
print("flooding", flush=True)  # the probe starts its rounds on this
s.setblocking(False)
end = time.monotonic() + seconds
while time.monotonic() < end:
    try:
        sent += s.send(burst)
    except BlockingIOError:
        time.sleep(0.001)  # the daemon stopped reading us: what backpressure should do
    except OSError:
        break  # the daemon closed us
print(sent, flush=True)
"""

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


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--idle", type=int, default=1000, help="registered idle clients")
    parser.add_argument("--seconds", type=float, default=4.0, help="probe time per phase")
    parser.add_argument("--rss-cap-mib", type=int, default=1024)
    args = parser.parse_args(argv)
    load_before = machine_load()
    with (tempfile.TemporaryDirectory(prefix="kiwi-bench-", dir="/tmp") as tmp,
          serving("kiwi", tmp) as (server, sock)):
        env = environment(sock)
        rss_start = rss_bytes(server.pid)
        idlers = subprocess.Popen([sys.executable, "-c", IDLERS, sock, str(args.idle), "labels"],
                                  env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True)
        try:
            assert idlers.stdout is not None and idlers.stdout.readline().strip() == "ready"
            rss_idle = rss_bytes(server.pid)
            quiet = probe(sock, args.seconds)
            watch = Watch(server, args.rss_cap_mib * 2**20)
            watch.start()
            # The probe connects before the flood and starts its rounds once the flood runs.
            start_probe, collected = connected_probe(sock, args.seconds)
            attacker = subprocess.Popen(
                [sys.executable, "-c", ATTACKER, sock, str(args.seconds + 1)],
                stdout=subprocess.PIPE, text=True)
            assert attacker.stdout is not None
            assert attacker.stdout.readline().strip() == "flooding"
            start_probe()
            attacked = collected()
            sent = int((attacker.communicate(timeout=args.seconds + 30)[0] or "0").strip() or 0)
            watch.stopped.set()
            watch.join()
            alive = server.poll() is None
            rss_after = rss_bytes(server.pid) if alive else 0
            after: Run | str | None = None
            if alive:
                try:
                    after = harness(*probe_command(sock, 1.0), "--setup-seconds", "10",
                                    timeout=60)
                except NoAnswer:
                    after = "no answer to hello and register within 10 s"
        finally:
            idlers.kill()
            idlers.wait()
    grew = watch.peak - rss_idle
    bounded = not watch.killed_at and grew <= RSS_GROWTH_MIB * 2**20
    ratio = attacked.p99_us / quiet.p99_us if attacked.handoffs else float("inf")
    shown = f"{ratio:.2f}x" if attacked.handoffs else "no round answered"
    verdict = "yes" if ratio <= RATIO_GOAL and not attacked.stalled and alive else "no"
    lines = [
        f"## Probe under attack ({utc_now()})", "",
        f"{args.idle:,} registered idle clients; an attacker writes 64 KiB of "
        f"`{{\"op\":\"status\"}}` lines per write and never reads ({sent / 2**20:,.1f} MiB sent "
        f"in {args.seconds + 1:g} s). The probe acquires, releases and pauses 1 ms, "
        f"{args.seconds:g} s per phase. Machine: {load_before} before, {machine_load()} after.",
        "",
        "| phase | probe rounds | p50 (µs) | p99 (µs) | max (µs) | rounds unanswered |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    phases = [("quiet", quiet), ("under attack", attacked)]
    if isinstance(after, Run):
        phases.append(("after the attack", after))
    for name, run in phases:
        figures = ([f"{run.p50_us:,.1f}", f"{run.p99_us:,.1f}", f"{run.max_us:,.1f}"]
                   if run.handoffs else ["–", "–", "–"])
        lines.append(f"| {name} | {run.handoffs:,} | {' | '.join(figures)} | {run.stalled} |")
    lines += [
        "",
        "| measure | value | target | met |",
        "| --- | --- | --- | --- |",
        f"| probe p99 under attack / quiet | {shown} | ≤ {RATIO_GOAL:g}x | {verdict} |",
        f"| daemon RSS: started / {args.idle:,} clients / peak in attack / after | "
        f"{mib(rss_start)} / {mib(rss_idle)} / {mib(watch.peak)} / "
        f"{mib(rss_after) if alive else 'killed'} | peak at most {RSS_GROWTH_MIB} MiB over "
        f"the {args.idle:,} clients' | {'yes' if bounded else 'no'} |",
    ]
    if isinstance(after, str):
        lines.append(f"\nAfter the attack, a new client got {after}.")
    if watch.killed_at:
        lines.append(f"\nThe daemon passed the {args.rss_cap_mib} MiB cap "
                     f"({mib(watch.killed_at)}) and was killed by the benchmark.")
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main()
