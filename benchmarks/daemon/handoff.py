"""Lock handoff with every client waiting, against a C floor and nvshare in the same run.

    python -m benchmarks.daemon.handoff [--repeats 3] [--handoffs 3000] [--clients 2,8,64,512]
                                        [--requeue] [--idle-only | --no-idle]
                                        [--nvshare PATH] [--throughput PROCESSES]
                                        [--throughput-seconds 20] [--hog LOOPS]
                                        [--hog-lead 10] [--python-ring] [--instructions]

One C harness (benchmarks/daemon/c/contenders.c) holds N connections; every one of them waits all
the time: the holder keeps the GPU for 20 us, releases and asks again at once. A handoff is the time
from just before the holder's release is written to the next holder having read its grant. The same
harness runs against the Kiwi daemon, against the relay ring (benchmarks/daemon/c/relay_ring.c, a
token-passing epoll server in C: the floor) and, given ``--nvshare`` (an ``nvshare-scheduler``
built from github.com/grgalex/nvshare, never part of this repository), against nvshare's own C
scheduler in its own protocol, and given ``--python-ring`` against the same ring as the floor in
Python on uvloop, compiled (benchmarks/daemon/py_ring.py: what a Python daemon costs at all):
one after the other for each N, the order reversed between repeats,
each on a fresh server. Reported per N: handoff p50 and p99, handoffs per second, the server's CPU
per handoff (its threads' run time over the measured handoffs / handoffs), and the ratios, per
repeat too, with the machine's load before each repeat. ``--throughput P`` adds P harness
processes running flat out (benchmarks/daemon/throughput.py) against each server. ``--hog L``
runs everything a second time beside L busy loops. ``--instructions`` ends with each server's
instructions per handoff under callgrind (benchmarks/daemon/instructions.py), which do not move
with the load. The idle-clients case (2 contenders beside
N - 2 registered connections that never ask) is kept for comparison with earlier figures.

Goals. Issue 12: p50 within 1.5x of the floor, daemon CPU per handoff at most 35 us, p50 growth
from 2 to 512 waiting clients at most 1.2x. Issue 44 (with ``--nvshare``): the daemon's CPU per
handoff and its p50 at most nvshare's at every N, and its throughput at least nvshare's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

from benchmarks.common import utc_now
from benchmarks.daemon.instructions import per_handoff
from benchmarks.daemon.instructions import table as instructions_table
from benchmarks.daemon.servers import (
    NAMES,
    NVSHARE,
    SERVERS,
    Run,
    add_server_options,
    chosen,
    dialect,
    harness,
    machine_load,
    serving,
)
from benchmarks.daemon.throughput import Throughput, flat_out

P50_RATIO_GOAL = 1.5
CPU_GOAL_US = 35.0
GROWTH_GOAL = 1.2
#: Connected clients in the idle-clients case (2 of them contend).
IDLE_SIZES = (2, 64, 512)
#: Seconds the busy loops run before the first measurement beside them (``--hog-lead``).
HOG_LEAD = 10.0


def measure(kind: str, contenders: int, idle: int, handoffs: int, requeue: bool,
            nvshare: str | None = None) -> Run:
    args = [*dialect(kind), "--contenders", str(contenders), "--idle", str(idle),
            "--handoffs", str(handoffs), "--warmup", str(max(50, handoffs // 10)),
            "--seconds", "120"]
    with (tempfile.TemporaryDirectory(prefix="kiwi-bench-", dir="/tmp") as tmp,
          serving(kind, tmp, nvshare=nvshare) as (server, sock)):
        return harness(sock, *args, *(["--requeue"] if requeue else []), server_pid=server.pid)


def spread(values: Sequence[float], fmt: str = "{:.1f}") -> str:
    """The median, and the range over the repeats when there were several."""
    middle = fmt.format(statistics.median(values))
    if len(values) < 2:
        return middle
    return f"{middle} ({fmt.format(min(values))}–{fmt.format(max(values))})"


@dataclass
class Phase:
    """One pass over every server and size: its runs, and the load before each repeat."""

    kinds: tuple[str, ...]
    runs: dict[tuple[str, int], list[Run]] = field(default_factory=lambda: defaultdict(list))
    flat: dict[str, list[Throughput]] = field(default_factory=lambda: defaultdict(list))
    loads: list[float] = field(default_factory=list)

    def ratios(self, n: int, what: str, over: str = "floor") -> list[float]:
        """Kiwi over ``over`` for each repeat (pairs measured next to each other)."""
        return [getattr(k, what) / getattr(f, what)
                for k, f in zip(self.runs[("kiwi", n)], self.runs[(over, n)], strict=True)]

    def flat_ratios(self, what: str, over: str) -> list[float]:
        return [getattr(k, what) / getattr(f, what)
                for k, f in zip(self.flat["kiwi"], self.flat[over], strict=True)]


def run_all(sizes: Sequence[int], idle: bool, repeats: int, handoffs: int, requeue: bool,
            kinds: tuple[str, ...] = SERVERS, nvshare: str | None = None,
            processes: int = 0, seconds: float = 20.0) -> Phase:
    phase = Phase(kinds)
    for repeat in range(repeats):
        phase.loads.append(os.getloadavg()[0])
        order = kinds if repeat % 2 == 0 else kinds[::-1]
        for n in sizes:
            for kind in order:
                contenders, idlers = (2, n - 2) if idle else (n, 0)
                phase.runs[(kind, n)].append(
                    measure(kind, contenders, idlers, handoffs, requeue, nvshare))
        if processes:
            for kind in order:
                phase.flat[kind].append(flat_out(kind, processes, seconds, nvshare))
    return phase


def waiting_table(phase: Phase, sizes: Sequence[int]) -> list[str]:
    kinds = [k for k in NAMES if k in phase.kinds]
    others = [k for k in kinds if k != "kiwi"]
    head = ["clients waiting", *(f"{NAMES[k]} p50 (µs)" for k in kinds),
            *(f"Kiwi / {NAMES[k]} p50" for k in others),
            *(f"{NAMES[k]} p99 (µs)" for k in kinds),
            *(f"{NAMES[k]} handoffs/s" for k in kinds),
            *(f"{NAMES[k]} CPU per handoff (µs)" for k in kinds),
            *(f"Kiwi / {NAMES[k]} CPU" for k in others)]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for n in sizes:
        runs = {k: phase.runs[(k, n)] for k in kinds}
        rows.append("| " + " | ".join([
            str(n), *(spread([r.p50_us for r in runs[k]]) for k in kinds),
            *(spread(phase.ratios(n, "p50_us", k), "{:.2f}x") for k in others),
            *(spread([r.p99_us for r in runs[k]]) for k in kinds),
            *(spread([r.per_second for r in runs[k]], "{:,.0f}") for k in kinds),
            *(spread([r.cpu_us for r in runs[k]]) for k in kinds),
            *(spread(phase.ratios(n, "cpu_us", k), "{:.2f}x") for k in others),
        ]) + " |")
    return rows


def throughput_table(phase: Phase, processes: int) -> list[str]:
    kinds = [k for k in NAMES if k in phase.kinds]
    others = [k for k in kinds if k != "kiwi"]
    head = ["server", "handoffs/s", "CPU per handoff (µs)",
            *(f"Kiwi / {NAMES[k]} handoffs/s" for k in others)]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for kind in kinds:
        runs = phase.flat[kind]
        cells = [f"{NAMES[kind]}, {processes} processes flat out",
                 spread([t.per_second for t in runs], "{:,.0f}"),
                 spread([t.cpu_us for t in runs])]
        cells += [spread(phase.flat_ratios("per_second", k), "{:.2f}x") if kind == "kiwi"
                  else "" for k in others]
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def goals_table(phase: Phase, sizes: Sequence[int], processes: int) -> list[str]:
    rows = ["| goal | target | measured (median of repeats) | met |", "| --- | --- | --- | --- |"]

    def row(goal: str, target: str, shown: str, ok: bool) -> None:
        rows.append(f"| {goal} | {target} | {shown} | {'yes' if ok else 'no'} |")

    for n in sizes:
        ratio = statistics.median(phase.ratios(n, "p50_us"))
        row(f"handoff p50 / floor, {n} waiting", f"≤ {P50_RATIO_GOAL}x", f"{ratio:.2f}x",
            ratio <= P50_RATIO_GOAL)
    for n in sizes:
        cpu = statistics.median(r.cpu_us for r in phase.runs[("kiwi", n)])
        row(f"daemon CPU per handoff, {n} waiting", f"≤ {CPU_GOAL_US:.0f} µs", f"{cpu:.1f} µs",
            cpu <= CPU_GOAL_US)
    low, high = min(sizes), max(sizes)
    if low != high:
        for kind in ("kiwi", "floor"):
            growth = (statistics.median(r.p50_us for r in phase.runs[(kind, high)])
                      / statistics.median(r.p50_us for r in phase.runs[(kind, low)]))
            who = "Kiwi" if kind == "kiwi" else "floor (for reference)"
            row(f"{who} p50 growth {low} → {high} waiting", f"≤ {GROWTH_GOAL}x",
                f"{growth:.2f}x", growth <= GROWTH_GOAL)
    if NVSHARE not in phase.kinds:
        return rows
    for what, label in (("cpu_us", "daemon CPU per handoff"), ("p50_us", "handoff p50")):
        for n in sizes:
            ratio = statistics.median(phase.ratios(n, what, NVSHARE))
            row(f"{label} / nvshare's, {n} waiting (issue 44)", "≤ 1.00x", f"{ratio:.2f}x",
                ratio <= 1.0)
    if processes:
        ratio = statistics.median(phase.flat_ratios("per_second", NVSHARE))
        row(f"handoffs/s / nvshare's, {processes} processes flat out (issue 44)", "≥ 1.00x",
            f"{ratio:.2f}x", ratio >= 1.0)
    return rows


def repeats_table(phase: Phase, sizes: Sequence[int], processes: int) -> list[str]:
    """Every ratio of every repeat, beside the load the repeat began under."""
    others = [k for k in NAMES if k in phase.kinds and k != "kiwi"]
    head = ["repeat", "load (1 min)", "clients", *(f"Kiwi / {NAMES[k]} p50" for k in others),
            *(f"Kiwi / {NAMES[k]} CPU" for k in others),
            *(f"Kiwi / {NAMES[k]} handoffs/s" for k in others)]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for i, load in enumerate(phase.loads):
        for n in sizes:
            rows.append("| " + " | ".join([
                str(i + 1), f"{load:.2f}", f"{n} waiting",
                *(f"{phase.ratios(n, 'p50_us', k)[i]:.2f}x" for k in others),
                *(f"{phase.ratios(n, 'cpu_us', k)[i]:.2f}x" for k in others),
                *(f"{phase.ratios(n, 'per_second', k)[i]:.2f}x" for k in others)]) + " |")
        if processes:
            rows.append("| " + " | ".join([
                str(i + 1), f"{load:.2f}", f"{processes} processes flat out",
                *("" for _ in others),
                *(f"{phase.flat_ratios('cpu_us', k)[i]:.2f}x" for k in others),
                *(f"{phase.flat_ratios('per_second', k)[i]:.2f}x" for k in others)]) + " |")
    return rows


def idle_table(phase: Phase, sizes: Sequence[int]) -> list[str]:
    rows = ["| connected clients (2 contend) | Kiwi p50 (µs) | floor p50 (µs) | "
            "Kiwi / floor p50 | Kiwi p99 (µs) | Kiwi CPU per handoff (µs) |",
            "| --- | --- | --- | --- | --- | --- |"]
    for n in sizes:
        kiwi, floor = phase.runs[("kiwi", n)], phase.runs[("floor", n)]
        rows.append("| " + " | ".join([
            str(n), spread([r.p50_us for r in kiwi]), spread([r.p50_us for r in floor]),
            spread(phase.ratios(n, "p50_us"), "{:.2f}x"), spread([r.p99_us for r in kiwi]),
            spread([r.cpu_us for r in kiwi])]) + " |")
    return rows


@contextmanager
def busy_loops(count: int, lead: float) -> Iterator[None]:
    """``count`` processes that only burn CPU, for the block (a CPU hog without stress-ng),
    started ``lead`` seconds before it."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
             for _ in range(count)]
    try:
        time.sleep(lead)  # the hog is on the CPUs before the first run beside it
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--handoffs", type=int, default=3000, help="measured per run")
    parser.add_argument("--clients", default="2,8,64,512")
    parser.add_argument("--requeue", action="store_true",
                        help='ask again with release {"requeue": true} instead of a second line')
    parser.add_argument("--no-idle", action="store_true", help="skip the idle-clients case")
    add_server_options(parser)
    parser.add_argument("--throughput", type=int, default=0, metavar="PROCESSES",
                        help="also run this many harness processes flat out against each server")
    parser.add_argument("--throughput-seconds", type=float, default=20.0)
    parser.add_argument("--hog", type=int, default=0, metavar="LOOPS",
                        help="run everything again beside this many busy loops")
    parser.add_argument("--hog-lead", type=float, default=HOG_LEAD, metavar="SECONDS",
                        help="start the busy loops this long before the runs beside them")
    parser.add_argument("--instructions", action="store_true",
                        help="end with each server's instructions per handoff (callgrind)")
    args = parser.parse_args(argv)
    if args.nvshare and args.requeue:
        parser.error("--requeue is Kiwi's protocol only: nvshare has no such request")
    sizes = [int(n) for n in args.clients.split(",")]
    kinds = chosen(args)
    style = ('one `release` with `"requeue": true`' if args.requeue
             else "`release` and `acquire` in one write")
    started = time.monotonic()
    lines = [f"## Handoff with every client waiting ({utc_now()})", "",
             f"C harness, {args.handoffs:,} measured handoffs per run, {args.repeats} "
             f"repeat{'s' if args.repeats != 1 else ''}, the servers' order reversed between "
             f"repeats: Kiwi, the C relay-ring floor"
             f"{' and nvshare (' + args.nvshare + ')' if args.nvshare else ''}; a holder keeps "
             f"the GPU 20 µs, then {style}. Figures are the median of the repeats (range in "
             f"brackets)."]
    hog = (f"Beside a CPU hog ({args.hog} busy loop{'s' if args.hog != 1 else ''}, started "
           f"{args.hog_lead:g} s before)")
    phases = [("As the machine was", 0)] + ([(hog, args.hog)] if args.hog else [])
    for title, loops in phases:
        with busy_loops(loops, args.hog_lead) if loops else nullcontext():
            load_before = machine_load()
            began = time.monotonic()
            phase = run_all(sizes, False, args.repeats, args.handoffs, args.requeue, kinds,
                            args.nvshare, args.throughput, args.throughput_seconds)
            idle = None if args.no_idle else run_all(IDLE_SIZES, True, args.repeats,
                                                    args.handoffs, args.requeue)
            load_after = machine_load()
        unserved = sum(r.requeue_unserved or 0 for r in phase.runs[("kiwi", sizes[0])])
        lines += ["", f"### {title}", "",
                  f"Machine: {load_before} before, {load_after} after "
                  f"({time.monotonic() - began:.0f} s)."]
        if args.requeue and unserved:
            lines += ["", "The daemon answered `requeue` as a plain release (it predates it); "
                      "the harness asked again in a second request."]
        lines += ["", *waiting_table(phase, sizes)]
        if args.throughput:
            lines += ["", f"{args.throughput} harness processes, one contender each, hold for "
                      f"no time and ask again at once for {args.throughput_seconds:g} s:", "",
                      *throughput_table(phase, args.throughput)]
        lines += ["", *goals_table(phase, sizes, args.throughput)]
        if len(phase.kinds) > 2 or args.repeats > 1:
            lines += ["", "Each repeat's ratios, and the 1-minute load average before it:", "",
                      *repeats_table(phase, sizes, args.throughput)]
        if idle is not None:
            lines += ["", "#### The idle-clients case: 2 contend, the others are registered "
                      "and idle", "", *idle_table(idle, IDLE_SIZES)]
    if args.instructions:
        order = tuple(k for k in NAMES if k in kinds)
        counts = {(kind, n): per_handoff(kind, n, 1000, args.nvshare)
                  for n in sizes for kind in order}
        lines += ["", "### Instructions per handoff, whole process (callgrind)", "",
                  "Each server under callgrind, counted from 1,000 and 3,000 handoffs; user "
                  "space only (the kernel's work in the system calls is not counted); they do "
                  "not move with the load.", "", *instructions_table(counts, order, sizes)]
    lines += ["", f"The whole run took {time.monotonic() - started:.0f} s."]
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    main()
