"""Long uptime: a million handoffs with the daemon's memory sampled (issue 11.6).

    python -m benchmarks.daemon.soak [--handoffs 1000000] [--seconds 600] [--contenders 4]

The C harness's contenders hand the GPU round (as in benchmarks/daemon/handoff.py) while the
daemon's RSS is read every 0.25 s. The run stops at --handoffs or after --seconds, whichever comes
first. Reported: RSS at each tenth of the run, and the median RSS of the last tenth of the samples
against the first (flat: about 1.0x; a leak per handoff grows with the count). """

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time

from benchmarks.common import rss_bytes, utc_now
from benchmarks.daemon.servers import harness, machine_load, serving

#: Last tenth's RSS over the first tenth's, at most: what "flat" means here.
FLAT = 1.10


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--handoffs", type=int, default=1_000_000)
    parser.add_argument("--seconds", type=float, default=600.0, help="stop by then anyway")
    parser.add_argument("--contenders", type=int, default=4)
    args = parser.parse_args(argv)
    load_before = machine_load()
    samples: list[tuple[int, int]] = []  # (CLOCK_MONOTONIC ns, RSS bytes)
    stop = threading.Event()
    with (tempfile.TemporaryDirectory(prefix="kiwi-bench-", dir="/tmp") as tmp,
          serving("kiwi", tmp) as (server, sock)):

        def sample() -> None:
            while not stop.wait(0.25):
                samples.append((time.monotonic_ns(), rss_bytes(server.pid)))

        # one sample before and one after, however short the run
        samples.append((time.monotonic_ns(), rss_bytes(server.pid)))
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            run = harness(sock, "--contenders", str(args.contenders), "--handoffs",
                          str(args.handoffs), "--warmup", "0", "--hold-us", "0",
                          "--seconds", str(args.seconds), "--progress",
                          str(max(1, args.handoffs // 100)), server_pid=server.pid,
                          timeout=args.seconds + 120)
        finally:
            stop.set()
            sampler.join()
            samples.append((time.monotonic_ns(), rss_bytes(server.pid)))
    if run.progress:
        started, ended = run.progress[0][1], run.progress[-1][1]
        during = [s for s in samples if started <= s[0] <= ended]
        samples = during if len(during) >= 2 else samples
    tenth = max(1, len(samples) // 10)
    first = statistics.median(rss for _, rss in samples[:tenth])
    last = statistics.median(rss for _, rss in samples[-tenth:])
    growth = last / first

    def done_by(t: int) -> int:
        return max((n for n, at in run.progress if at <= t), default=0)

    lines = [
        f"## Soak: {run.handoffs:,} handoffs ({utc_now()})", "",
        f"{args.contenders} contenders (C harness) hand the GPU round for "
        f"{run.seconds:,.0f} s ({run.per_second:,.0f} handoffs/s, daemon CPU "
        f"{run.cpu_us:.1f} µs per handoff); daemon RSS sampled every 0.25 s "
        f"({len(samples)} samples). Machine: {load_before} before, {machine_load()} after.", "",
        "| handoffs done | daemon RSS (MiB) |", "| --- | --- |",
    ]
    # ten rows at even steps through the run, so repeated runs print the same lines
    rows = min(10, len(samples))
    for k in range(rows):
        at, rss = samples[round(k * (len(samples) - 1) / max(1, rows - 1))]
        lines.append(f"| {done_by(at):,} | {rss / 2**20:.1f} |")
    lines += ["", "| measure | value | target | met |", "| --- | --- | --- | --- |",
              f"| RSS, median of the last tenth / the first | {last / 2**20:.1f} / "
              f"{first / 2**20:.1f} MiB = {growth:.3f}x | ≤ {FLAT:.2f}x | "
              f"{'yes' if growth <= FLAT else 'no'} |"]
    if run.handoffs < args.handoffs:
        lines.append(f"\nStopped after {args.seconds:g} s, short of {args.handoffs:,} handoffs.")
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main()
