"""Run the benchmarks that need no GPU, repeated, into one Markdown report: ``make bench``.

    python -m benchmarks [--repeat 3] [--quick] [--only handoff,attack,...] [--out FILE]

Each benchmark runs --repeat times, one after another, each run in a process of its own. What
a run prints on stdout is its Markdown; what it prints on stderr (kernels' warnings, servers'
logs) goes to a log file named in the report, shown only when the run fails. The runs of one
benchmark are merged into one section in which every figure that moved between runs carries its
range (benchmarks/ranges.py), under a line giving the machine's load before each run.

The GPU benchmarks run with ``python -m benchmarks.shim.gpu_check`` (``make gpu-check``).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

from benchmarks.common import REPO, demote_headings, utc_now
from benchmarks.ranges import merge


class Benchmark(NamedTuple):
    title: str
    #: The module it runs, under ``benchmarks.``.
    module: str
    args: tuple[str, ...]
    quick: tuple[str, ...]


# In the order they run; the arguments keep a whole `make bench` to minutes on a 2-core machine.
BENCHMARKS = {
    "handoff": Benchmark("Handoff with every client waiting (C harness, relay-ring floor)",
                         "daemon.handoff", ("--repeats", "1"),
                         ("--repeats", "1", "--handoffs", "1000", "--clients", "2,64,512")),
    "handoff_core": Benchmark("The daemon's work per handoff, in-process (bare relay floor)",
                              "daemon.handoff_core", ("--callgrind", "--clients", "2,512"),
                              ("--handoffs", "500", "--repeats", "1", "--clients", "2,512")),
    "attack": Benchmark("Probe under attack", "daemon.attack", ("--seconds", "4"),
                        ("--seconds", "2")),
    "soak": Benchmark("Soak", "daemon.soak", ("--handoffs", "1000000", "--seconds", "300"),
                      ("--handoffs", "50000", "--seconds", "60")),
    "daemon": Benchmark("Daemon as Python clients see it", "daemon.python_clients", (), ()),
    "fleet": Benchmark("Scheduling policy: the notebook fleet", "fleet", (), ()),
    "lab": Benchmark("Jupyter server and panel", "lab.panel", (), ()),
    "kernel_cells": Benchmark("Notebook kernel", "lab.kernel_cells", (),
                              ("--cells", "100", "--handoffs", "20")),
    "shim_gate": Benchmark("CUDA shim gate (fake driver)", "shim.gate", (), ()),
    "shim_turns": Benchmark("CUDA shim: a turn between two processes (fake driver)",
                            "shim.turns", (), ("--seconds", "2")),
    "shim_alloc": Benchmark("CUDA shim: stream-ordered allocations under vmm (fake driver)",
                            "shim.stream_alloc", ("--callgrind",), ("--steps", "5")),
    "shim_link": Benchmark("CUDA shim: the vmm evictor on the fake driver's modelled link",
                           "shim.modelled_link", (), ("--gib", "0.25")),
    "shim_spill": Benchmark("CUDA shim: the disk tier against dd's direct I/O (fake driver)",
                            "shim.spill", (), ("--mib", "256")),
    "shim_intent": Benchmark("CUDA shim: restore on intent on the modelled link (fake driver)",
                             "shim.restore_on_intent", (), ("--gib", "0.25")),
    "shim_budget": Benchmark("CUDA shim: kernels taking turns within a host budget (fake driver)",
                             "shim.host_budget", (), ("--kernels", "4", "--mib", "16")),
}


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in
                  Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor() or "unknown CPU")
    return (f"{os.cpu_count()} CPUs ({model}), Linux {platform.release()}, "
            f"Python {platform.python_version()}")


def load() -> str:
    return f"{os.getloadavg()[0]:.2f}"


def run_once(module: str, args: tuple[str, ...], log: Path) -> tuple[str, str | None]:
    """One run's Markdown, and why it failed (None when it did not)."""
    with log.open("a") as errors:
        errors.write(f"\n==== {module} {' '.join(args)}\n")
        errors.flush()
        done = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", *args], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=errors, text=True)
    if done.returncode != 0:
        tail = log.read_text().splitlines()[-5:]
        return done.stdout, f"exit status {done.returncode}: " + " / ".join(tail)
    return done.stdout, None


def section(bench: Benchmark, outputs: list[str], loads: list[str], failures: list[str]) -> str:
    body = merge(outputs).splitlines() if outputs else []
    body = demote_headings(body)  # each benchmark's headings go under its section
    while body and not body[0].strip():
        body.pop(0)
    lines = [f"## {bench.title} (`python -m benchmarks.{bench.module}`)", "",
             f"{len(loads)} run{'s' if len(loads) != 1 else ''}; 1-minute load average "
             f"before each: {', '.join(loads)}.", ""]
    lines += body
    lines += [f"\n**Run failed:** {why}" for why in failures]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split(
        "\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each benchmark (3)")
    parser.add_argument("--quick", action="store_true", help="shorter runs, to see it works")
    parser.add_argument("--only", help=f"comma-separated, of: {', '.join(BENCHMARKS)}")
    parser.add_argument("--out", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    names = args.only.split(",") if args.only else list(BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"no benchmark {', '.join(unknown)}; there are {', '.join(BENCHMARKS)}")
    log = Path(tempfile.gettempdir()) / f"kiwi-bench-{time.strftime('%Y%m%d-%H%M%S')}.log"
    started = time.monotonic()
    report = [f"# Kiwi benchmarks ({utc_now()})", "",
              f"Machine: {machine()}. Each benchmark ran {args.repeat} time"
              f"{'s' if args.repeat != 1 else ''}{' (quick settings)' if args.quick else ''}; "
              "a figure that moved between runs reads `median (lowest–highest)`. "
              f"Benchmarks' own logs and warnings: `{log}`.", ""]
    print("\n".join(report), flush=True)
    for name in names:
        bench = BENCHMARKS[name]
        outputs, loads, failures = [], [], []
        for _ in range(args.repeat):
            loads.append(load())
            out, failed = run_once(bench.module, bench.quick if args.quick else bench.args, log)
            if failed:
                failures.append(failed)
            elif out.strip():
                outputs.append(out)
        text = section(bench, outputs, loads, failures)
        print(text + "\n", flush=True)
        report.append(text + "\n")
    tail = f"All benchmarks took {time.monotonic() - started:.0f} s."
    print(tail)
    report.append(tail)
    text = "\n".join(report)
    if args.out:
        args.out.write_text(text + "\n")
    return text


if __name__ == "__main__":
    main()
