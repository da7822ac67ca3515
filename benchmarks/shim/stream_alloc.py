"""What a stream-ordered allocation costs under the vmm evictor, without a GPU:
``python -m benchmarks.shim.stream_alloc [--steps 60] [--callgrind]``.

PyTorch's ``backend:cudaMallocAsync`` and CuPy's async pool call cuMemAllocAsync and
cuMemFreeAsync for every tensor, and leave the reuse of freed memory to the driver's pool; under
``KIWI_EVICT=vmm`` the shim serves them itself (mechanisms/vmm.c). A small C program plays a
training loop against the tests' fake driver (tests/shim/fake_cuda.c): each step allocates nine
tensors of 512 B to 96 MiB on one stream and frees them there. Two ways:

- ``keeps up``: the stream's work completes at once, as when the GPU keeps up with the CPU;
- ``behind``: the stream's work never completes while the loop runs
  (``FAKE_CUDA_PENDING_STREAM``), as when the CPU runs a step or more ahead of the GPU, which
  is how a training loop runs: memory freed in stream order cannot be known to be free to any
  other stream, only to its own.

Each way with the same sizes every step (``fixed``) and with sizes that change from step to step
(``varying``: dynamic shapes). Per allocation and free:

- **driver calls** the shim made, and of those the virtual memory management API's (reserve,
  create, map, set access, unmap, release, free: on a GPU tens of microseconds each), counted
  by callgrind's call graph (``--callgrind``);
- **instructions** in the shim's cuMemAllocAsync and cuMemFreeAsync, the driver's own work left
  out (``--callgrind``), against **the floor**: the fake driver's own stream-ordered pool, asked
  directly without the shim, in the same run;
- **CPU time** of the allocating thread, the fake driver's work included, best of three, against
  the same floor.

Counts come from two processes that differ only in the number of steps (``--steps`` and three
times that), so start-up and the first allocations cancel out.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections import defaultdict
from pathlib import Path

from benchmarks.common import REPO, utc_now, without_kiwi

PROGRAM = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
typedef int (*alloc_fn)(unsigned long long *, size_t, void *);
typedef int (*free_fn)(unsigned long long, void *);
static const size_t sizes[] = {512, 4096, 36864, 300000, 1 << 20, 2621440, 6 << 20, 24 << 20,
                               96 << 20};
#define COUNT (sizeof sizes / sizeof sizes[0])
int main(int argc, char **argv)
{
    void *cuda = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    alloc_fn allocate = (alloc_fn)dlsym(cuda, "cuMemAllocAsync");
    free_fn release = (free_fn)dlsym(cuda, "cuMemFreeAsync");
    long steps = atol(argv[2]), warm = atol(argv[3]);
    int varying = atoi(argv[4]);
    void *stream = (void *)0x77;
    unsigned long long ptr[COUNT];
    struct timespec a = {0}, b;
    for (long step = 0; step < warm + steps; step++) {
        if (step == warm)
            clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
        for (size_t i = 0; i < COUNT; i++) {
            size_t size = sizes[i] + (varying ? (size_t)(step % 7) * 8192 * (i + 1) : 0);
            if (allocate(&ptr[i], size, stream) != 0)
                abort();
        }
        for (size_t i = COUNT; i-- > 0;)
            if (release(ptr[i], stream) != 0)
                abort();
    }
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
    double ns = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / (double)(steps * COUNT);
    typedef unsigned long long (*used_fn)(void);
    used_fn used = (used_fn)dlsym(cuda, "fake_cuda_process_used");
    /* CPU ns per allocation and free; bytes on the card at the end */
    printf("%.1f %llu\n", ns, used ? used() : 0ull);
    fflush(stdout);
    _exit(0); /* no teardown: a stream that never completes would hold it */
}
"""
TENSORS = 9
#: What a step allocates (the program's sizes).
STEP_BYTES = 512 + 4096 + 36864 + 300000 + (1 << 20) + 2621440 + (6 << 20) + (24 << 20) + (96 << 20)
WARM = 3
#: The virtual memory management API's calls: what a GPU charges tens of microseconds for.
VMM_CALLS = {"cuMemAddressReserve", "cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap",
             "cuMemRelease", "cuMemAddressFree"}
WAYS = {"keeps up, fixed": (False, False), "keeps up, varying": (False, True),
        "behind, fixed": (True, False), "behind, varying": (True, True)}


def build(directory: Path) -> tuple[Path, Path]:
    """The fake driver (linked as the tests link it) and the program."""
    fake = directory / "libcuda.so.1"
    subprocess.run(["gcc", "-std=c11", "-O2", "-fPIC", "-shared", "-fvisibility=hidden",
                    "-Wl,-Bsymbolic", "-o", str(fake), str(REPO / "tests/shim/fake_cuda.c"),
                    "-lpthread"], check=True)
    source, program = directory / "alloc_loop.c", directory / "alloc_loop"
    source.write_text(PROGRAM)
    subprocess.run(["gcc", "-O2", "-g", "-o", str(program), str(source), "-ldl"], check=True)
    return fake, program


def environment(shim: str | None, behind: bool, directory: Path) -> dict[str, str]:
    env = {**without_kiwi(), "FAKE_CUDA_TOTAL": str(1 << 40)}
    if behind:
        env.update(FAKE_CUDA_PENDING_STREAM="0x77",
                   FAKE_CUDA_PENDING_UNTIL=str(directory / "never"))
    if shim:
        env.update(LD_PRELOAD=shim, KIWI_EVICT="vmm", KIWI_VMM_SHADOW="pageable",
                   KIWI_SOCKET=str(directory / "no-daemon.sock"), KIWI_FAIL_TIMEOUT="0",
                   KIWI_IDLE_RELEASE="0")
    return env


def cpu_ns(program: Path, fake: Path, env: dict[str, str], steps: int,
           varying: bool) -> tuple[float, int]:
    """The best of three runs' CPU ns per allocation and free, and the bytes on the card at
    the end of the run."""
    best, held = float("inf"), 0
    for _ in range(3):
        out = subprocess.run([str(program), str(fake), str(steps), str(WARM), str(int(varying))],
                             env=env, check=True, capture_output=True, text=True,
                             timeout=600).stdout.split()
        best, held = min(best, float(out[0])), int(out[1])
    return best, held


def parse_callgrind(path: Path, shim: bool) -> tuple[int, dict[str, int], int]:
    """(instructions collected, driver calls by name, instructions inside those calls) of a
    callgrind.out written with --compress-strings=no --compress-pos=no."""
    total = 0
    calls: dict[str, int] = defaultdict(int)
    inside = 0
    caller_ob = callee_ob = callee_fn = ""
    pending_calls = 0
    for line in path.read_text().splitlines():
        if line.startswith("ob="):
            caller_ob = line[3:]
        elif line.startswith("cob="):
            callee_ob = line[4:]
        elif line.startswith("cfn="):
            callee_fn = line[4:]
        elif line.startswith("calls="):
            pending_calls = int(line.split("=")[1].split()[0])
        elif line.startswith("summary:") or line.startswith("totals:"):
            total = int(line.split()[1])
        elif pending_calls and line[:1].isdigit():
            cost = int(line.split()[1])
            into_driver = callee_ob.endswith("libcuda.so.1") and (
                "libkiwishim" in caller_ob if shim else True)
            if into_driver and re.fullmatch(r"cu[A-Z]\w*", callee_fn):
                calls[callee_fn] += pending_calls
                inside += cost
            pending_calls = 0
    return total, dict(calls), inside


def callgrind(program: Path, fake: Path, env: dict[str, str], steps: int, varying: bool,
              out: Path, shim: bool) -> tuple[int, dict[str, int], int]:
    subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                    "--toggle-collect=cuMemAllocAsync", "--toggle-collect=cuMemFreeAsync",
                    "--compress-strings=no", "--compress-pos=no",
                    str(program), str(fake), str(steps), str(WARM), str(int(varying))],
                   env=env, check=True, capture_output=True, text=True, timeout=1800)
    return parse_callgrind(out, shim)


def per_pair(low: tuple[int, dict[str, int], int], high: tuple[int, dict[str, int], int],
             pairs: int) -> dict[str, float]:
    """The difference between two runs, per allocation and free."""
    names = set(low[1]) | set(high[1])
    calls = {n: (high[1].get(n, 0) - low[1].get(n, 0)) / pairs for n in names}
    return {"instructions": (high[0] - high[2] - low[0] + low[2]) / pairs,
            "driver_instructions": (high[2] - low[2]) / pairs,
            "all_instructions": (high[0] - low[0]) / pairs,
            "calls": sum(calls.values()), "vmm_calls": sum(calls[n] for n in calls
                                                           if n in VMM_CALLS),
            "by_call": calls}  # type: ignore[dict-item]


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shim.stream_alloc")
    parser.add_argument("--steps", type=int, default=60, help="measured steps (60)")
    parser.add_argument("--callgrind", action="store_true",
                        help="count driver calls and instructions under callgrind too")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    from kiwi_jupyter.shim import library_path

    shim = str(library_path())
    results: dict[str, dict[str, object]] = {}
    lines = [f"Measured {utc_now()}; {args.steps} steps of {TENSORS} tensors each way "
             f"(512 B to 96 MiB), CPU time best of 3.", ""]
    with tempfile.TemporaryDirectory(prefix="kiwi-alloc-", dir="/tmp") as scratch:
        directory = Path(scratch)
        fake, program = build(directory)
        counted = args.callgrind and shutil.which("valgrind")
        header = ["way", "floor CPU (ns)", "shim CPU (ns)", "CPU / floor",
                  "on the card after (steps' worth)"]
        if counted:
            header += ["driver calls", "of them VMM", "shim instructions", "floor instructions",
                       "instructions / floor"]
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + " --- |" * len(header))
        for way, (behind, varying) in WAYS.items():
            floor_env = environment(None, behind, directory)
            shim_env = environment(shim, behind, directory)
            floor_ns, _ = cpu_ns(program, fake, floor_env, args.steps, varying)
            shim_ns, held = cpu_ns(program, fake, shim_env, args.steps, varying)
            row: dict[str, object] = {"floor_ns": floor_ns, "shim_ns": shim_ns, "held": held}
            cells = [way, f"{floor_ns:.0f}", f"{shim_ns:.0f}", f"{shim_ns / floor_ns:.1f}",
                     f"{held / STEP_BYTES:.1f}"]
            if counted:
                pairs = 2 * args.steps * TENSORS
                figures = {}
                for who, env in (("shim", shim_env), ("floor", floor_env)):
                    low = callgrind(program, fake, env, args.steps, varying,
                                    directory / f"{who}-low.out", who == "shim")
                    high = callgrind(program, fake, env, 3 * args.steps, varying,
                                     directory / f"{who}-high.out", who == "shim")
                    figures[who] = per_pair(low, high, pairs)
                # The floor is the driver's own pool: all it collects is the driver's work.
                floor_instructions = figures["floor"]["all_instructions"]
                row.update(shim=figures["shim"], floor_instructions=floor_instructions)
                cells += [f"{figures['shim']['calls']:.2f}", f"{figures['shim']['vmm_calls']:.2f}",
                          f"{figures['shim']['instructions']:.0f}",
                          f"{floor_instructions:.0f}",
                          f"{figures['shim']['instructions'] / floor_instructions:.1f}"]
            results[way] = row
            lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str) + "\n")
    return text


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
