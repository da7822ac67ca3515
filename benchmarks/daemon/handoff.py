"""Lock handoff with every client waiting, against a C floor in the same run (issue 12).

    python -m benchmarks.daemon.handoff [--repeats 3] [--handoffs 3000] [--clients 2,8,64,512]
                                        [--requeue] [--idle-only | --no-idle]

One C harness (benchmarks/daemon/c/contenders.c) holds N connections; every one of them waits all
the time: the holder keeps the GPU for 20 us, releases and asks again at once. A handoff is the time
from just before the holder's release is written to the next holder having read its grant. The same
harness runs against the Kiwi daemon and against the relay ring (benchmarks/daemon/c/relay_ring.c, a
token-passing epoll server in C: the floor), one after the other for each N, the order alternating
between repeats, each on a fresh server. Reported per N: handoff p50 and p99, handoffs per second,
the server's CPU per handoff (its threads' run time over the measured handoffs / handoffs), and the
ratios to the floor. The idle-clients case (2 contenders beside N - 2 registered connections that
never ask) is kept for comparison with earlier figures.

Goals (issue 12): p50 within 1.5x of the floor, daemon CPU per handoff at most 35 us, p50 growth
from 2 to 512 waiting clients at most 1.2x.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence

from benchmarks.common import utc_now
from benchmarks.daemon.servers import SERVERS, Run, harness, machine_load, serving

P50_RATIO_GOAL = 1.5
CPU_GOAL_US = 35.0
GROWTH_GOAL = 1.2
#: Connected clients in the idle-clients case (2 of them contend).
IDLE_SIZES = (2, 64, 512)


def measure(kind: str, contenders: int, idle: int, handoffs: int, requeue: bool) -> Run:
    args = ["--contenders", str(contenders), "--idle", str(idle), "--handoffs", str(handoffs),
            "--warmup", str(max(50, handoffs // 10)), "--seconds", "120"]
    with (tempfile.TemporaryDirectory(prefix="kiwi-bench-", dir="/tmp") as tmp,
          serving(kind, tmp) as (server, sock)):
        return harness(sock, *args, *(["--requeue"] if requeue else []), server_pid=server.pid)


def spread(values: Sequence[float], fmt: str = "{:.1f}") -> str:
    """The median, and the range over the repeats when there were several."""
    middle = fmt.format(statistics.median(values))
    if len(values) < 2:
        return middle
    return f"{middle} ({fmt.format(min(values))}–{fmt.format(max(values))})"


Results = dict[tuple[str, int], list[Run]]


def run_all(sizes: Sequence[int], idle: bool, repeats: int, handoffs: int,
            requeue: bool) -> Results:
    results: Results = defaultdict(list)
    for repeat in range(repeats):
        order = SERVERS if repeat % 2 == 0 else SERVERS[::-1]
        for n in sizes:
            for kind in order:
                contenders, idlers = (2, n - 2) if idle else (n, 0)
                results[(kind, n)].append(measure(kind, contenders, idlers, handoffs, requeue))
    return results


def ratios(results: Results, n: int, what: str) -> list[float]:
    """Kiwi over floor for each repeat (pairs measured next to each other)."""
    return [getattr(k, what) / getattr(f, what)
            for k, f in zip(results[("kiwi", n)], results[("floor", n)], strict=True)]


def waiting_table(results: Results, sizes: Sequence[int]) -> list[str]:
    rows = ["| clients waiting | Kiwi p50 (µs) | floor p50 (µs) | Kiwi / floor p50 | "
            "Kiwi p99 (µs) | floor p99 (µs) | Kiwi handoffs/s | floor handoffs/s | "
            "Kiwi CPU per handoff (µs) | floor CPU per handoff (µs) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for n in sizes:
        kiwi, floor = results[("kiwi", n)], results[("floor", n)]
        rows.append("| " + " | ".join([
            str(n), spread([r.p50_us for r in kiwi]), spread([r.p50_us for r in floor]),
            spread(ratios(results, n, "p50_us"), "{:.2f}x"),
            spread([r.p99_us for r in kiwi]), spread([r.p99_us for r in floor]),
            spread([r.per_second for r in kiwi], "{:,.0f}"),
            spread([r.per_second for r in floor], "{:,.0f}"),
            spread([r.cpu_us for r in kiwi]), spread([r.cpu_us for r in floor]),
        ]) + " |")
    return rows


def goals_table(results: Results, sizes: Sequence[int]) -> list[str]:
    rows = ["| goal (issue 12) | target | measured (median of repeats) | met |",
            "| --- | --- | --- | --- |"]

    def row(goal: str, target: str, value: float, shown: str, ok: bool) -> None:
        rows.append(f"| {goal} | {target} | {shown} | {'yes' if ok else 'no'} |")

    for n in sizes:
        ratio = statistics.median(ratios(results, n, "p50_us"))
        row(f"handoff p50 / floor, {n} waiting", f"≤ {P50_RATIO_GOAL}x", ratio,
            f"{ratio:.2f}x", ratio <= P50_RATIO_GOAL)
    for n in sizes:
        cpu = statistics.median(r.cpu_us for r in results[("kiwi", n)])
        row(f"daemon CPU per handoff, {n} waiting", f"≤ {CPU_GOAL_US:.0f} µs", cpu,
            f"{cpu:.1f} µs", cpu <= CPU_GOAL_US)
    low, high = min(sizes), max(sizes)
    if low != high:
        for kind in ("kiwi", "floor"):
            growth = (statistics.median(r.p50_us for r in results[(kind, high)])
                      / statistics.median(r.p50_us for r in results[(kind, low)]))
            who = "Kiwi" if kind == "kiwi" else "floor (for reference)"
            row(f"{who} p50 growth {low} → {high} waiting", f"≤ {GROWTH_GOAL}x", growth,
                f"{growth:.2f}x", growth <= GROWTH_GOAL)
    return rows


def idle_table(results: Results, sizes: Sequence[int]) -> list[str]:
    rows = ["| connected clients (2 contend) | Kiwi p50 (µs) | floor p50 (µs) | "
            "Kiwi / floor p50 | Kiwi p99 (µs) | Kiwi CPU per handoff (µs) |",
            "| --- | --- | --- | --- | --- | --- |"]
    for n in sizes:
        kiwi, floor = results[("kiwi", n)], results[("floor", n)]
        rows.append("| " + " | ".join([
            str(n), spread([r.p50_us for r in kiwi]), spread([r.p50_us for r in floor]),
            spread(ratios(results, n, "p50_us"), "{:.2f}x"), spread([r.p99_us for r in kiwi]),
            spread([r.cpu_us for r in kiwi])]) + " |")
    return rows


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--handoffs", type=int, default=3000, help="measured per run")
    parser.add_argument("--clients", default="2,8,64,512")
    parser.add_argument("--requeue", action="store_true",
                        help='ask again with release {"requeue": true} instead of a second line')
    parser.add_argument("--no-idle", action="store_true", help="skip the idle-clients case")
    args = parser.parse_args(argv)
    sizes = [int(n) for n in args.clients.split(",")]
    load_before = machine_load()
    started = time.monotonic()
    waiting = run_all(sizes, False, args.repeats, args.handoffs, args.requeue)
    idle = None if args.no_idle else run_all(IDLE_SIZES, True, args.repeats, args.handoffs,
                                            args.requeue)
    style = ('one `release` with `"requeue": true`' if args.requeue
             else "`release` and `acquire` in one write")
    unserved = sum(r.requeue_unserved or 0 for r in waiting[("kiwi", sizes[0])])
    lines = [
        f"## Handoff with every client waiting ({utc_now()})", "",
        f"C harness, {args.handoffs:,} measured handoffs per run, {args.repeats} "
        f"repeat{'s' if args.repeats != 1 else ''} interleaved with the C relay-ring floor; "
        f"a holder keeps the GPU 20 µs, then "
        f"{style}. Figures are the median of the repeats (range in brackets). Machine: "
        f"{load_before} before, {machine_load()} after ({time.monotonic() - started:.0f} s).",
    ]
    if args.requeue and unserved:
        lines += ["", "The daemon answered `requeue` as a plain release (it predates it); the "
                  "harness asked again in a second request."]
    lines += ["", *waiting_table(waiting, sizes), "", *goals_table(waiting, sizes)]
    if idle is not None:
        lines += ["", "### The idle-clients case: 2 contend, the others are registered and idle",
                  "", *idle_table(idle, IDLE_SIZES)]
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main()
