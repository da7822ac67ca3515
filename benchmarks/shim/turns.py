"""A turn's cost through the shim, without a GPU: ``python -m benchmarks.shim.turns``.

Two processes launch kernels on the test suite's fake libcuda as fast as they can, each under
the shim, through a daemon in mode on with a short TQ: they take turns, their memory left in
place. At every turn one process's gate closes (the drop), it synchronizes and releases, the
daemon grants the other, whose gate opens. A turn's cost is the time from the last launch of
the one leaving to the first launch of the one coming: the stretch in which neither could
launch. On a GPU the leaving one's queued work still runs during the first part of it, so this
is the most a turn can leave the GPU idle on the CPU's side; what the GPU itself adds (the
queue draining, caches warming) is measured by ``gpu_corun``'s turns.

Whether the scheduler should hand out short turns between holders side by side instead of
leaving the GPU to time-slice between them (docs/decisions/0008-holders-take-turns.md) depends on
this figure against the turn's length: a turn of 1 s that costs 100 microseconds costs 0.01%.

The floor is the same two hops without any scheduling: a byte from one process through a relay
process to a third (``benchmarks.daemon.python_clients.relay_floor``), measured in the same run.
"""

from __future__ import annotations

import argparse
import bisect
import json
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks.common import percentile, report_row, running_daemon, without_kiwi
from benchmarks.daemon.python_clients import relay_floor
from benchmarks.shim.gate import compile_program, fake_driver

#: Launches in a loop for argv[2] seconds; prints each gap between two launches longer than
#: argv[3] microseconds as "last-launch-before first-launch-after" (CLOCK_MONOTONIC ns, the
#: same clock in every process), once the loop is over so that printing never delays a launch.
TURNER = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, void *, void **, void **);
static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}
int main(int argc, char **argv) {
    void *cuda = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    launch_fn launch = (launch_fn)dlsym(cuda, "cuLaunchKernel");
    long long run = (long long)(atof(argv[2]) * 1e9), gap = atoll(argv[3]) * 1000LL;
    static long long gaps[2][100000];
    int n = 0;
    if (launch((void *)1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0) != 0) abort(); /* the first acquires */
    long long start = now_ns(), prev = start, t;
    while ((t = now_ns()) - start < run) {
        if (launch((void *)1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0) != 0) abort();
        t = now_ns();
        if (t - prev > gap && n < 100000) {
            gaps[0][n] = prev;
            gaps[1][n++] = t;
        }
        prev = t;
    }
    for (int i = 0; i < n; i++)
        printf("%lld %lld\n", gaps[0][i], gaps[1][i]);
    return 0;
}
"""


def turn_costs(gaps: Sequence[Sequence[tuple[int, int]]], wait_ns: int) -> list[float]:
    """Microseconds from the leaving process's last launch to the coming one's first, for
    every turn. A turn ends a gap of at least ``wait_ns`` in one process (it waited for the
    other's turn; shorter gaps are the machine's own interruptions) that the other's own
    waiting gap, begun at its last launch, spans."""
    waits = [sorted((began, ended) for began, ended in g if ended - began >= wait_ns)
             for g in gaps]
    costs: list[float] = []
    for mine, theirs in ((waits[0], waits[1]), (waits[1], waits[0])):
        starts = [began for began, _ in theirs]
        for _, resumed in mine:
            i = bisect.bisect_right(starts, resumed) - 1
            if i >= 0 and theirs[i][1] >= resumed:
                costs.append((resumed - theirs[i][0]) / 1e3)
    return costs


def measure(seconds: float, tq: float, gap_us: int) -> tuple[list[float], int]:
    """The turns' costs (µs) of two processes taking turns of ``tq`` for ``seconds``, and the
    gaps found in all (a gap that is no turn: the machine preempted a process)."""
    from kiwi_jupyter.shim import library_path

    with tempfile.TemporaryDirectory(prefix="kiwi-", dir="/tmp") as scratch:
        directory = Path(scratch)
        fake = fake_driver(directory)
        program = compile_program(directory, "turner", TURNER)
        with running_daemon(directory, "--gpus", "1", "--mode", "on", "--tq", str(tq)) as socket:
            # The fake driver has no checkpoint API for the daemon to load: managed memory,
            # which stays where it is at every turn here as the checkpoint evictor's would.
            env = {**without_kiwi(), "LD_PRELOAD": str(library_path()), "KIWI_SOCKET": socket,
                   "KIWI_IDLE_RELEASE": "0", "KIWI_EVICT": "managed"}
            procs = [subprocess.Popen([str(program), str(fake), str(seconds), str(gap_us)],
                                      env=env, stdout=subprocess.PIPE, text=True)
                     for _ in range(2)]
            outs = [proc.communicate(timeout=seconds + 60)[0] for proc in procs]
            if any(proc.returncode for proc in procs):
                raise RuntimeError(f"a turner failed: {[proc.returncode for proc in procs]}")
    gaps = [[(int(a), int(b)) for a, b in (line.split() for line in out.splitlines())]
            for out in outs]
    # A process waits a whole turn of the other's; half a TQ tells waiting from interruptions.
    return turn_costs(gaps, int(tq * 1e9 / 2)), sum(len(g) for g in gaps)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shim.turns")
    parser.add_argument("--seconds", type=float, default=5.0, help="how long they take turns")
    parser.add_argument("--tq", type=float, default=0.02, help="each turn's length (s)")
    parser.add_argument("--gap-us", type=int, default=20,
                        help="a pause between launches longer than this is a turn (µs)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    costs, gaps = measure(args.seconds, args.tq, args.gap_us)
    if not costs:
        raise SystemExit("no turn was seen: the two processes never took turns")
    floor = relay_floor()
    results = {"turns": float(len(costs)), "gaps": float(gaps),
               "p50_us": percentile(costs, 50), "p99_us": percentile(costs, 99),
               "floor_p50_us": percentile(floor, 50), "floor_p99_us": percentile(floor, 99)}
    ratio = results["p50_us"] / results["floor_p50_us"]
    report_row("turns seen", "turn p50 (µs)", "turn p99 (µs)", "floor p50 (µs)",
               "turn / floor p50", "p50 as a share of a 1 s turn")
    report_row(*(["---"] * 6))
    report_row(len(costs), f"{results['p50_us']:.0f}", f"{results['p99_us']:.0f}",
               f"{results['floor_p50_us']:.0f}", f"{ratio:.1f}x",
               f"{results['p50_us'] / 1e6:.4%}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
