"""The scheduler daemon's speed: handoff latency, cycle rate, CPU per cycle, memory per client.

Every figure is reported beside a floor measured in the same run: a raw Unix-socket ping-pong
between two Python processes, the least any handoff through a daemon can cost (a handoff is one
message in and one out). Run: ``python -m benchmarks.daemon.python_clients`` (or ``make bench``).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from benchmarks.common import REPO, percentile, report_row, rss_bytes
from benchmarks.common import start_daemon as common_start_daemon

PINGPONG = textwrap.dedent("""
    import os, socket, sys, time, json
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    n = int(sys.argv[1])
    if os.fork() == 0:
        a.close()
        while True:
            data = b.recv(64)
            if not data:
                os._exit(0)
            b.sendall(data)
    b.close()
    samples = []
    for _ in range(n):
        t = time.perf_counter_ns()
        a.sendall(b"x\\n")
        a.recv(64)
        samples.append(time.perf_counter_ns() - t)
    a.close()
    os.wait()
    print(json.dumps(samples))
""")

# The same path without any scheduling: A tells a relay process, the relay tells B, with A
# pausing between rounds as a holder does. Three processes, two hops, cold wake-ups: what a
# handoff through any daemon costs before the daemon does any work.
RELAY = textwrap.dedent("""
    import json, os, socket, sys, time
    n, pause = int(sys.argv[1]), float(sys.argv[2])
    a, r1 = socket.socketpair()
    r2, b = socket.socketpair()
    if os.fork() == 0:  # the relay
        a.close(); b.close()
        while True:
            data = r1.recv(64)
            if not data:
                os._exit(0)
            r2.sendall(data)
    if os.fork() == 0:  # B: stamps each arrival
        a.close(); r1.close(); r2.close()
        stamps = []
        for _ in range(n):
            b.recv(1)  # one byte a round, so two rounds never arrive as one
            stamps.append(time.monotonic_ns())
        os.write(1, (json.dumps(stamps) + "\\n").encode())
        os._exit(0)
    r1.close(); r2.close(); b.close()
    sent = []
    for _ in range(n):
        time.sleep(pause)
        sent.append(time.monotonic_ns())
        a.sendall(b"x")
    a.close()
    os.wait(); os.wait()
    print(json.dumps(sent))
""")

# Two contenders alternate: each holds briefly, releases and asks again at once. Every event is
# stamped with CLOCK_MONOTONIC, which all processes on the machine share.
CONTENDER = textwrap.dedent("""
    import json, sys, time
    from nodeside.client import Client
    name, cycles, hold = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    events = []
    with Client(name=name) as c:
        print("ready", flush=True)
        sys.stdin.readline()
        for _ in range(cycles):
            c.acquire(timeout=60)
            events.append(("grant", time.monotonic_ns()))
            time.sleep(hold)  # a sleep, not a spin: two cores must also run the daemon
            events.append(("release", time.monotonic_ns()))
            c.release()
    print(json.dumps(events), flush=True)
""")

# Idle clients: registered connections that only sit there, as idle notebook kernels do.
# Arguments: the socket, how many, and "labels" to give each the two labels a pod's kernel sends.
IDLERS = textwrap.dedent("""
    import json, resource, socket, sys
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    path, n, labelled = sys.argv[1], int(sys.argv[2]), sys.argv[3:] == ["labels"]
    socks = []
    for i in range(n):
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        f = s.makefile("rb")
        s.sendall(b'{"op":"hello","version":1}\\n')
        f.readline()
        register = {"op": "register", "name": f"idle-{i}"}
        if labelled:
            register["labels"] = {"pod": f"notebook-{i}", "namespace": "bench"}
        s.sendall(json.dumps(register).encode() + b"\\n")
        f.readline()
        socks.append((s, f))
    print("ready", flush=True)
    sys.stdin.readline()
""")


def _env(sock: str) -> dict[str, str]:
    return {**os.environ, "KIWI_SOCKET": sock, "PYTHONPATH": str(REPO)}


def start_daemon(directory: Path, *args: str) -> tuple[subprocess.Popen[bytes], str]:
    return common_start_daemon(directory, *args, env=_env(str(directory / "kiwi.sock")))


def idle_clients(sock: str, n: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", IDLERS, sock, str(n)], env=_env(sock),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def pingpong_floor(n: int = 5000) -> list[float]:
    out = subprocess.run([sys.executable, "-c", PINGPONG, str(n)], capture_output=True,
                         text=True, check=True).stdout
    return [x / 1e3 for x in json.loads(out)]  # microseconds


def relay_floor(n: int = 2000, pause: float = 0.0005) -> list[float]:
    """Microseconds for a byte to cross a relay process, after the sender paused."""
    proc = subprocess.run([sys.executable, "-c", RELAY, str(n), str(pause)],
                          capture_output=True, text=True, check=True)
    received, sent = (json.loads(line) for line in proc.stdout.strip().splitlines())
    return [(r - s) / 1e3 for s, r in zip(sent, received, strict=True)]


def contend(sock: str, contenders: int, cycles: int, hold: float) -> list[list[tuple]]:
    procs = [subprocess.Popen([sys.executable, "-c", CONTENDER, f"bench-{i}", str(cycles),
                               str(hold)], env=_env(sock), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for i in range(contenders)]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    return [json.loads(proc.communicate(timeout=600)[0]) for proc in procs]


def handoffs(traces: list[list[tuple]]) -> list[float]:
    """Microseconds from each release to the next grant of another contender."""
    events = sorted((t, kind, who) for who, trace in enumerate(traces) for kind, t in trace)
    samples = []
    for i, (t, kind, who) in enumerate(events):
        if kind != "release":
            continue
        nxt = next(((t2, w2) for t2, k2, w2 in events[i + 1:] if k2 == "grant"), None)
        if nxt is not None and nxt[1] != who:
            samples.append((nxt[0] - t) / 1e3)
    return samples


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    floor = pingpong_floor()
    floor_p50 = statistics.median(floor)
    print(f"# Daemon benchmarks ({time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs)\n")
    relay = relay_floor()
    relay_p50 = statistics.median(relay)
    print(f"Floor: raw Unix-socket ping-pong between two Python processes, p50 "
          f"{floor_p50:.1f} us, p99 {percentile(floor, 99):.1f} us")
    print(f"Relay floor: one byte through a relay process after a 0.5 ms pause, p50 "
          f"{relay_p50:.1f} us, p99 {percentile(relay, 99):.1f} us\n")
    print("| connected clients (2 contend, the rest idle) | handoff p50 (us) | p50 / ping-pong | "
          "p50 / relay | handoff p99 (us) |")
    print("| --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory(prefix="kiwi-bench-", dir="/tmp") as tmp:
        for connected in (2, 64, 512):
            daemon, sock = start_daemon(Path(tmp), "--tq", "30")
            idlers = idle_clients(sock, connected - 2) if connected > 2 else None
            try:
                samples = handoffs(contend(sock, 2, 1500, 0.0005))
            finally:
                if idlers:
                    idlers.kill()
                daemon.terminate()
                daemon.wait()
            p50 = statistics.median(samples)
            report_row(connected, f"{p50:.1f}", f"{p50 / floor_p50:.1f}x",
                       f"{p50 / relay_p50:.1f}x", f"{percentile(samples, 99):.1f}")

        daemon, sock = start_daemon(Path(tmp), "--tq", "30")
        try:
            cpu_before, started = cpu_seconds(daemon.pid), time.monotonic()
            traces = contend(sock, 64, 60, 0.0)
            elapsed = time.monotonic() - started
            cpu = cpu_seconds(daemon.pid) - cpu_before
        finally:
            daemon.terminate()
            daemon.wait()
        cycles = sum(len(t) for t in traces) // 2
        print(f"\n64 contending clients: {cycles / elapsed:,.0f} acquire/release cycles per "
              f"second; daemon CPU {cpu / cycles * 1e6:.0f} us per cycle "
              f"({cpu / cycles * 1e6 / floor_p50:.1f}x the ping-pong floor)")

        daemon, sock = start_daemon(Path(tmp), "--tq", "30")
        try:
            base = rss_bytes(daemon.pid)
            idlers = idle_clients(sock, 1000)
            loaded = rss_bytes(daemon.pid)
            idlers.kill()
        finally:
            daemon.terminate()
            daemon.wait()
        print(f"Daemon memory: {base / 2**20:.1f} MiB idle, {loaded / 2**20:.1f} MiB with 1,000 "
              f"connected clients ({(loaded - base) / 1000 / 1024:.1f} KiB per client)")


if __name__ == "__main__":
    main()
