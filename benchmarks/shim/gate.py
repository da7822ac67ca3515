"""The gate's cost per driver call, without a GPU: ``python -m benchmarks.shim.gate``.

A small C program calls cuLaunchKernel of the test suite's fake libcuda (which returns at once)
in a tight loop, from 1 and from 8 threads, three ways in the same run:

- plain: no shim (the floor);
- pass-through: the shim preloaded with KIWI_SHIM=0;
- gated: the shim preloaded and holding the GPU (a real daemon granted it), so every call takes
  the gate's fast path.

It reports nanoseconds per call and the nanoseconds the shim adds. A real kernel launch costs
2-5 microseconds of CPU time, so the added nanoseconds divided by that is the launch overhead
the GPU benchmark (overhead.py, launch_bound) measures end to end.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

from benchmarks.common import REPO, report_row, running_daemon, without_kiwi

DRIVER = r"""
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, void *, void **, void **);
static launch_fn launch;
static long calls;
static void *run(void *unused) {
    (void)unused;
    for (long i = 0; i < calls; i++)
        if (launch((void *)1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0) != 0) abort();
    return 0;
}
int main(int argc, char **argv) {
    void *cuda = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    launch = (launch_fn)dlsym(cuda, "cuLaunchKernel");
    int threads = atoi(argv[2]);
    calls = atol(argv[3]);
    run(0); /* the first call acquires the GPU; time only the rest */
    pthread_t t[64];
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < threads; i++) pthread_create(&t[i], 0, run, 0);
    for (int i = 0; i < threads; i++) pthread_join(t[i], 0);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / ((double)calls);
    printf("%.3f\n", ns); /* wall ns per call per thread */
    return 0;
}
"""


def fake_driver(directory: Path) -> Path:
    """The test suite's fake libcuda, built into ``directory``."""
    fake = directory / "libcuda.so.1"
    subprocess.run(["gcc", "-O2", "-fPIC", "-shared", "-o", str(fake),
                    str(REPO / "tests" / "shim" / "fake_cuda.c"), "-lpthread"], check=True)
    return fake


def compile_program(directory: Path, name: str, code: str) -> Path:
    """The C program ``code``, built into ``directory`` as ``name``."""
    program = directory / name
    source = directory / f"{name}.c"
    source.write_text(code)
    subprocess.run(["gcc", "-O2", "-o", str(program), str(source), "-ldl", "-lpthread"],
                   check=True)
    return program


def measure(program: Path, fake: Path, threads: int, calls: int, env: dict[str, str]) -> float:
    best = float("inf")
    for _ in range(3):
        out = subprocess.run([str(program), str(fake), str(threads), str(calls)], env=env,
                             check=True, capture_output=True, text=True).stdout
        best = min(best, float(out))
    return best


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shim.gate")
    parser.add_argument("--json", help="also write the results to this file")
    json_path = parser.parse_args(argv).json
    from kiwi_jupyter.shim import library_path

    shim = str(library_path())
    base = without_kiwi()
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="kiwi-", dir="/tmp") as scratch:
        directory = Path(scratch)
        fake = fake_driver(directory)
        program = compile_program(directory, "launch_loop", DRIVER)
        with running_daemon(directory, "--gpus", "1") as socket:
            ways = {
                "plain": base,
                "pass-through": {**base, "LD_PRELOAD": shim, "KIWI_SHIM": "0"},
                "gated": {**base, "LD_PRELOAD": shim, "KIWI_SOCKET": socket,
                          "KIWI_IDLE_RELEASE": "0"},
            }
            report_row("threads", *(f"{way} (ns/call)" for way in ways), "added by the gate (ns)")
            report_row(*(["---"] * (len(ways) + 2)))
            for threads in (1, 8):
                row = {way: measure(program, fake, threads, 2_000_000, env)
                       for way, env in ways.items()}
                added = row["gated"] - row["plain"]
                results.update({f"{way}_{threads}t_ns": v for way, v in row.items()})
                results[f"added_{threads}t_ns"] = added
                report_row(threads, *(f"{v:.1f}" for v in row.values()), f"{added:.1f}")
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
