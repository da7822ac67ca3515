"""One command on a GPU machine: ``make gpu-check`` (``python -m benchmarks.shim.gpu_check``).

    python -m benchmarks.shim.gpu_check [--out gpu-check.md] [--quick] [--budget 1080]
                                        [--only decisive | second | probe,vmm,smoke,vmm-tests,
                                                tests,evictors,paging,overhead,checkpoint,evict,
                                                corun]
                                        [--checkpoint-sizes 1,10,40] [--evict-copy pinned]

With the packages the machine already has (PyTorch, CuPy; no network; Jupyter's packages from
wheels carried in ``.whl`` when it lacks them): builds the CUDA shim and runs its steps, each in
a process of its own with a time limit inside one budget (18 minutes by default), and writes ONE
Markdown report (GPU, driver, CUDA, versions, every result and ratio, and a verdict per target)
to --out and to stdout, ready to paste into BENCHMARKS.md. The decisive steps come first, in
this order, and ``--only decisive`` runs just them, in one call of at most 8 minutes with the
machine's start (issue 39, Must-work 4): the vmm device probe at 16 GiB, the vmm evictor's row
at 16 GiB, a one-minute smoke under vmm through real programs, then the GPU tests under vmm and
the two-kernel switch. ``--only second`` is the next call: the other evictors and the rest of
the GPU tests.

Without an NVIDIA GPU it is a dry run: it says so in one line, builds the shim, names the steps
it would run in their order and what each is judged against, which of its packages are missing,
and exits 0. docs/gpu-check.md says how to run it through the device tool.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import REPO, demote_headings, utc_now, without_kiwi

GiB = 1 << 30

#: What the GPU steps import; a machine missing one gets a line naming it (and make gpu-wheels).
NEEDED = ("torch", "cupy", "pytest", "yaml", "prometheus_client", "pynvml", "jupyter_client",
          "ipykernel")
#: The check's steps, in the order they run: the decisive ones first.
STEPS = ("probe", "vmm", "smoke", "vmm-tests", "tests", "evictors", "paging", "overhead",
         "checkpoint", "evict", "corun")
#: Names for several steps at once: one call each through the device tool.
PRESETS = {"decisive": ("probe", "vmm", "smoke", "vmm-tests"), "second": ("tests", "evictors")}
#: The GPU tests: the shim's, and two real Kiwi kernels taking turns.
GPU_TESTS = ("tests/shim", "tests/kernel/test_kernel_gpu_switch.py")
#: The GPU tests under vmm: test_gpu.py's evictions parametrized over it, and the switch.
VMM_TESTS = ("tests/shim/test_gpu.py", "tests/kernel/test_kernel_gpu_switch.py")
#: What each step runs and what its verdict is against, for the report and the dry run.
PLANS = {
    "probe": ("`benchmarks.shim.vmm_probe` at 16 GiB, the driver alone (what the platform "
              "can do)", "(c) >= 95 % freed after release, (d) evict and restore >= 0.8 of the "
              "pinned copy both ways, (g) contents intact"),
    "vmm": ("`benchmarks.shim.evictors --only vmm` at 16 GiB: a first eviction, then 3 rounds "
            "with the shadows pinned, the data changed each round, figures read after `evicted`, "
            "rates over the bytes moved", "evict and restore >= 0.8 of the same run's pinned "
            "copy, NVML freed >= 95 % per process, contents intact"),
    "smoke": ("`benchmarks.shim.vmm_smoke`, about 60 s under vmm, an eviction between each step "
              "and its check: torch.compile, a CUDA graph replayed after a restore, "
              "backend:cudaMallocAsync, torch.as_tensor of a CuPy array and back, a forked "
              "DataLoader, a global-mode capture while shadows are built", "every step ok"),
    "vmm-tests": ("`pytest -m gpu -k vmm " + " ".join(VMM_TESTS) + "` (Jupyter's packages "
                  "from the carried wheels where missing)", "no test failed"),
    "tests": ("`pytest -m gpu -k 'not vmm' " + " ".join(GPU_TESTS) + "`", "no test failed"),
    "evictors": ("`benchmarks.shim.evictors --only managed,checkpoint`", "as `vmm`"),
    "paging": ("`benchmarks.shim.paging`", ""),
    "overhead": ("`benchmarks.shim.overhead`", ""),
    "checkpoint": ("`benchmarks.shim.checkpoint`", ""),
    "evict": ("`benchmarks.shim.evict_variants`", ""),
    "corun": ("`benchmarks.shim.gpu_corun`", ""),
}


@dataclass
class Gpu:
    name: str
    driver: str
    cuda: str
    memory_gib: float
    free_gib: float


def find_gpu() -> tuple[Gpu | None, str]:
    """The first GPU through NVML, else nvidia-smi; or None and why not."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            if pynvml.nvmlDeviceGetCount() == 0:
                return None, "NVML found no GPU"
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            name = pynvml.nvmlDeviceGetName(handle)
            driver = pynvml.nvmlSystemGetDriverVersion()
            cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            return Gpu(name if isinstance(name, str) else name.decode(),
                       driver if isinstance(driver, str) else driver.decode(),
                       f"{cuda // 1000}.{cuda % 1000 // 10}", memory.total / GiB,
                       memory.free / GiB), ""
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # no library, no driver, no device: each means no GPU here
        why = f"NVML: {exc}"
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None, f"{why}; nvidia-smi: not installed"
    done = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total,memory.free",
                           "--format=csv,noheader,nounits"], capture_output=True, text=True)
    if done.returncode != 0 or not done.stdout.strip():
        return None, f"{why}; nvidia-smi: {(done.stderr or done.stdout).strip()[:200]}"
    name, driver, total, free = (f.strip() for f in done.stdout.splitlines()[0].split(","))
    version = re.search(r"CUDA Version:\s*([\d.]+)", subprocess.run(
        [smi], capture_output=True, text=True).stdout)
    return Gpu(name, driver, version.group(1) if version else "unknown", float(total) / 1024,
               float(free) / 1024), ""


def missing_modules() -> list[str]:
    return [name for name in NEEDED if importlib.util.find_spec(name) is None]


def versions() -> str:
    found = [f"Python {platform.python_version()}"]
    for module, label in (("torch", "PyTorch"), ("cupy", "CuPy")):
        if importlib.util.find_spec(module) is None:
            found.append(f"{label} not installed")
            continue
        code = (f"import {module} as m; v = m.__version__; c = getattr(getattr(m, 'version', "
                f"None), 'cuda', None); print(v + (' (CUDA ' + c + ')' if c else ''))")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=plain_env(), timeout=120)
        found.append(f"{label} {done.stdout.strip() or 'failed to import'}")
    return ", ".join(found)


def plain_env() -> dict[str, str]:
    """This environment without any Kiwi setting or preload, the repository importable."""
    env = without_kiwi()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Budget:
    """The time left of the whole check; each step gets at most its own cap of it."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def limit(self, cap: float, keep: float = 0.0) -> float:
        """At most cap seconds, leaving keep seconds of the budget for the steps after."""
        return max(0.0, min(cap, self.deadline - time.monotonic() - keep))


def step(command: list[str], seconds: float,
         env: dict[str, str] | None = None) -> tuple[str, str]:
    """Run one step (``env``: added to the plain environment); its stdout, and how it ended
    ("" when it succeeded)."""
    if seconds < 5:
        return "", "skipped: the check's time budget is spent"
    started = time.monotonic()
    try:
        done = subprocess.run(command, cwd=REPO, env={**plain_env(), **(env or {})},
                              capture_output=True, text=True, timeout=seconds)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return out, f"stopped after its {seconds:.0f} s limit"
    took = time.monotonic() - started
    if done.returncode != 0:
        tail = " / ".join(done.stderr.strip().splitlines()[-3:])
        return done.stdout, f"failed (exit status {done.returncode}, {took:.0f} s): {tail}"
    return done.stdout, ""


def build_shim() -> tuple[str, bool]:
    try:
        from kiwi_jupyter.shim import library_path

        started = time.monotonic()
        path = library_path()
        return f"built `{path}` ({time.monotonic() - started:.1f} s)", True
    except Exception as exc:  # a build error is a result of the check, not its end
        return f"**failed**: {exc}", False


def per_test_limit() -> list[str]:
    """One hung test must not spend the whole step: pytest-timeout stops it after 120 s."""
    import importlib.util

    return ["--timeout", "120"] if importlib.util.find_spec("pytest_timeout") else []


#: pytest -v's line for a test that ended, and for the one running when the step was cut off.
TEST_ENDED = re.compile(r"^(\S+::\S+) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b")
TEST_RUNNING = re.compile(r"^(\S+::\S+)\s*$")


def ended_tests(out: str) -> tuple[dict[str, int], str | None]:
    """From pytest -v's output: how many tests ended each way, and the test that was running
    when the output stops (None when none was)."""
    counts: dict[str, int] = {}
    running = None
    for line in out.splitlines():
        if ended := TEST_ENDED.match(line):
            counts[ended.group(2).lower()] = counts.get(ended.group(2).lower(), 0) + 1
            running = None
        elif started := TEST_RUNNING.match(line):
            running = started.group(1)
    return counts, running


def carried_wheels(directory: str) -> dict[str, str]:
    """Jupyter's packages (the two-kernel test's) from the wheels carried in .whl, installed
    into directory where the machine lacks them: the environment that puts them on the path
    ({} when nothing was missing or carried)."""
    wheels = sorted((REPO / ".whl").glob("*.whl"))
    if not wheels or all(importlib.util.find_spec(name) for name in ("jupyter_client",
                                                                     "ipykernel")):
        return {}
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index",
                           "--no-deps", "--no-compile", "--no-cache-dir", "--upgrade",
                           "--target", directory, *map(str, wheels)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return {}
    return {"PYTHONPATH": os.pathsep.join([str(REPO), directory])}


def gpu_tests(seconds: float, paths: tuple[str, ...] = GPU_TESTS, select: str | None = None,
              env: dict[str, str] | None = None) -> list[str]:
    """The GPU tests (those ``-k select`` picks), each bounded by pytest-timeout: a hung test
    fails, the step goes on. Cut off by the step's own limit, the report still says how each
    finished test ended and which one was running. Tests that write a report (the two-kernel
    test) have it included."""
    chosen = ["-k", select] if select else []
    with tempfile.TemporaryDirectory(prefix="kiwi-gpu-reports-") as reports:
        out, failed = step([sys.executable, "-m", "pytest", "-m", "gpu", *chosen, *paths, "-v",
                            "-rfEs", "--tb=line", "-p", "no:cacheprovider", *per_test_limit()],
                           seconds, env={**(env or {}), "KIWI_GPU_REPORT_DIR": reports})
        written = [path.read_text() for path in sorted(Path(reports).glob("*.md"))]
    lines = out.strip().splitlines()
    summary = next((line.strip("= ") for line in reversed(lines)
                    if re.search(r"\d+ (passed|failed|skipped|error)", line)), None)
    if summary is None:
        counts, running = ended_tests(out)
        summary = "cut off: " + (", ".join(f"{n} {how}" for how, n in counts.items())
                                 or "no test ended")
        if running:
            summary += f"; running then: {running}"
    rows = [f"`pytest -m gpu {' '.join(chosen + list(paths))}`: **{summary}**"
            + (f" ({failed})" if failed else "")]
    if not per_test_limit():
        rows.append("- pytest-timeout is missing: a hung test costs the whole step "
                    "(`make gpu-wheels`)")
    problems = [line for line in lines if line.startswith(("FAILED", "ERROR", "SKIPPED"))]
    rows += [f"- {line}" for line in problems[:30]]
    for text in written:
        rows += ["", *demote_headings(text.rstrip().splitlines(), top=3)]
    return rows


def tables(out: str) -> list[str]:
    """The Markdown tables in a benchmark's output, one blank line between two of them."""
    rows: list[str] = []
    for line in out.splitlines():
        if line.startswith("|"):
            rows.append(line)
        elif not line.strip() and rows and rows[-1]:
            rows.append("")
    while rows and not rows[-1]:
        rows.pop()
    return rows


def benchmark(module: str, args: list[str], seconds: float) -> list[str]:
    out, failed = step([sys.executable, "-m", f"benchmarks.shim.{module}", *args], seconds)
    rows = tables(out)
    if failed:
        rows.append(f"\n**{module} {failed}**")
    return rows


def markdown_benchmark(module: str, argv: list[str], seconds: float) -> list[str]:
    """A benchmark that prints Markdown as it goes, flushed: all of its lines are the result
    (headings put under the report's), and a step cut off by its limit keeps what it printed."""
    out, failed = step([sys.executable, "-m", f"benchmarks.shim.{module}", *argv], seconds)
    rows = demote_headings(out.rstrip().splitlines()) or ["(it printed no Markdown)"]
    if failed:
        rows.append(f"\n**{module} {failed}**")
    return rows


def paging_gib(gpu: Gpu, quick: bool) -> float:
    """The working set for the paging benchmark: two of them and some room must fit in free memory
    (managed memory must never oversubscribe the card)."""
    room = (gpu.free_gib - 4) / 2.5
    return max(0.5, round(min(2.0 if quick else 10.0, room), 1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shim.gpu_check",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("gpu-check.md"))
    parser.add_argument("--quick", action="store_true", help="smaller working sets, fewer runs")
    parser.add_argument("--budget", type=float, default=18 * 60, help="seconds for everything")
    parser.add_argument("--evict-copy", choices=("off", "pinned", "pageable"), default="off",
                        help="the paging step's KIWI_EVICT_COPY (default off: by prefetch)")
    parser.add_argument("--checkpoint-sizes", metavar="GIB,...",
                        help="the checkpoint step's round sizes (its default: 1,10; 40 costs "
                        "minutes more)")
    parser.add_argument("--only", help=f"comma-separated steps, of: {', '.join(STEPS)}, or "
                        f"{', '.join(PRESETS)} (= {'; '.join(map(','.join, PRESETS.values()))}; "
                        "the device tool allows 10 minutes a command: split the check)")
    args = parser.parse_args(argv)
    named = args.only.split(",") if args.only else list(STEPS)
    steps = [one for name in named for one in PRESETS.get(name, (name,))]
    if unknown := [s for s in steps if s not in STEPS]:
        parser.error(f"no step {', '.join(unknown)}; there are {', '.join(STEPS)}")
    steps = [name for name in STEPS if name in steps]  # always in the check's own order
    started = time.monotonic()
    budget = Budget(args.budget)
    gpu, why = find_gpu()
    report = [f"# GPU check ({utc_now()})", ""]
    shim_line, shim_ok = build_shim()
    missing = missing_modules()
    if gpu is None:
        report += [f"**No NVIDIA GPU here: dry run, nothing measured.** ({why})", "",
                   f"- Machine: {platform.node()}, {os.cpu_count()} CPUs, "
                   f"Linux {platform.release()}; {versions()}.",
                   f"- Shim: {shim_line}.",
                   "- On a GPU machine this runs, in this order (a verdict line per target):",
                   *[f"  {i}. `{name}`: {PLANS[name][0]}"
                     + (f"; verdict against: {PLANS[name][1]}" if PLANS[name][1] else "")
                     for i, name in enumerate(steps, 1)],
                   f"- Evictors: managed, checkpoint and {vmm_line()}.",
                   f"- Packages it would need that are missing here: "
                   f"{', '.join(missing) or 'none'}."]
        return finish(report, args.out, started, 0 if shim_ok else 1)
    report += [
        "| GPU | driver | CUDA (driver) | memory | software |",
        "| --- | --- | --- | --- | --- |",
        f"| {gpu.name} | {gpu.driver} | {gpu.cuda} | {gpu.memory_gib:.1f} GiB "
        f"({gpu.free_gib:.1f} free) | {versions()} |", "",
        f"Machine: {os.cpu_count()} CPUs, Linux {platform.release()}. Shim: {shim_line}.",
    ]
    if missing:
        report.append(f"Missing packages: {', '.join(missing)} (see "
                      "benchmarks/shim/GPU-SESSIONS.md: `make gpu-wheels`, then carry `.whl`).")
    if not shim_ok:
        return finish(report, args.out, started, 1)
    verdicts: list[str] = []
    with tempfile.TemporaryDirectory(prefix="kiwi-site-") as site:
        carried = carried_wheels(site) if {"vmm-tests", "tests"} & set(steps) else {}
        for index, name in enumerate(steps):
            # Each step leaves the ones after it some time: a slow one never takes them all.
            keep = 45.0 * (len(steps) - index - 1)
            title, rows = run_step(name, gpu, args, budget, keep, carried)
            report += ["", f"## {title}", "", *rows]
            if PLANS[name][1]:
                verdicts.append(judge(name, rows))
    if verdicts:
        report += ["", "## Verdicts", "", *verdicts]
    return finish(report, args.out, started, 0)


def run_step(name: str, gpu: Gpu, args: argparse.Namespace, budget: Budget, keep: float,
             carried: dict[str, str]) -> tuple[str, list[str]]:
    """One step: its heading and its rows."""
    quick = args.quick
    if name == "probe":
        gib = "4" if quick else "16"
        return (f"VMM device probe at {gib} GiB (the driver alone)",
                markdown_benchmark("vmm_probe", ["--gib", gib], budget.limit(100, keep)))
    if name == "vmm":
        gib = "4" if quick else "16"
        return (f"The vmm evictor at {gib} GiB",
                markdown_benchmark("evictors", ["--only", "vmm", "--gib", gib, "--rounds", "3"],
                                   budget.limit(120, keep)))
    if name == "smoke":
        return ("The vmm evictor through real programs (smoke)",
                markdown_benchmark("vmm_smoke", [], budget.limit(90, keep)))
    if name == "vmm-tests":
        return ("GPU tests under vmm, and the two-kernel switch",
                gpu_tests(budget.limit(180 if quick else 240, keep), VMM_TESTS, "vmm", carried))
    if name == "tests":
        return ("GPU tests (the other evictors)",
                gpu_tests(budget.limit(300 if quick else 480, keep), GPU_TESTS, "not vmm",
                          carried))
    if name == "evictors":
        # Sized down by the module itself to what the card has free.
        return ("The other evictors side by side",
                markdown_benchmark("evictors", ["--only", "managed,checkpoint", "--gib",
                                                "2" if quick else "4"],
                                   budget.limit(240, keep)))
    if name == "paging":
        size = paging_gib(gpu, quick)
        return (f"Paging: eviction, restore and handoff ({size:g} GiB working sets)",
                benchmark("paging", ["--gib", str(size), "--evict-copy", args.evict_copy],
                          budget.limit(300, keep)))
    if name == "overhead":
        repeats = "2" if quick else "3"  # x 3 processes (plain and each evictor)
        return ("Overhead: shimmed / plain (median of alternating runs)",
                benchmark("overhead", ["--repeats", repeats], budget.limit(300, keep)))
    if name == "checkpoint":
        if importlib.util.find_spec("benchmarks.shim.checkpoint") is None:
            return "Checkpoint eviction", ["Skipped: `benchmarks/shim/checkpoint.py` is not in "
                                           "this tree."]
        sizes = ["--sizes", args.checkpoint_sizes] if args.checkpoint_sizes else []
        return ("Checkpoint eviction",
                markdown_benchmark("checkpoint", sizes, budget.limit(300, keep)))
    if name == "evict":
        # evict_variants sizes its buffer down to what the card and the host have free.
        most = "2" if quick else "10"
        return (f"Eviction strategies for managed memory ({most} GiB at most, plain process, "
                "no shim)",
                markdown_benchmark("evict_variants", ["--gib", most, "--rounds",
                                                      "1" if quick else "2"],
                                   budget.limit(420, keep)))
    seconds = "3" if quick else "5"
    return ("Side by side: work done together against one alone (`co_run`)",
            benchmark("gpu_corun", ["--seconds", seconds], budget.limit(300, keep)))


#: A verdict a step printed: the evictors' and the smoke's lines, the probe's section 8 items.
VERDICT_LINE = re.compile(r"^- verdict (\S+): (PASS|FAIL|n/a)\b(.*)$")
PROBE_LINE = re.compile(r"^- \(([cdg])\) [^:]*: (pass|FAIL)\b(.*)$")
FAILED_TESTS = re.compile(r"\b(\d+) (failed|error|errors)\b")


def judge(name: str, rows: list[str]) -> str:
    """The step's verdict, one line: PASS or FAIL against its targets, and why."""
    target = PLANS[name][1]
    if name in ("vmm", "evictors", "smoke"):
        lines = [m for m in map(VERDICT_LINE.match, rows) if m]
        if not lines:
            return f"- `{name}`: FAIL (no verdict: the step was cut off or failed) [{target}]"
        worst = "FAIL" if any(m.group(2) == "FAIL" for m in lines) else "PASS"
        detail = "; ".join(f"{m.group(1)} {m.group(2)}{m.group(3)}" for m in lines)
        return f"- `{name}`: {worst} ({detail}) [{target}]"
    if name == "probe":
        items = {m.group(1): m for m in map(PROBE_LINE.match, rows) if m}
        if set(items) != {"c", "d", "g"}:
            return (f"- `probe`: FAIL (verdicts missing: "
                    f"{', '.join(sorted({'c', 'd', 'g'} - set(items)))}) [{target}]")
        bad = [f"({k}){m.group(3)}" for k, m in sorted(items.items()) if m.group(2) == "FAIL"]
        return f"- `probe`: {'FAIL (' + '; '.join(bad) + ')' if bad else 'PASS'} [{target}]"
    summary = rows[0] if rows else ""
    failed = sum(int(m.group(1)) for m in FAILED_TESTS.finditer(summary))
    cut = "cut off" in summary or "stopped" in summary or not summary
    ok = not failed and not cut and "passed" in summary
    return f"- `{name}`: {'PASS' if ok else 'FAIL'} ({summary.split(': ', 1)[-1]}) [{target}]"


def vmm_line() -> str:
    """Whether the shim has the vmm evictor yet, asked over the tests' fake driver."""
    try:
        from benchmarks.shim.evictors import vmm_status
        from kiwi_jupyter.shim import library_path

        return vmm_status(str(library_path()))
    except Exception as exc:  # the dry run says what it could not find out, and goes on
        return f"vmm: unknown here ({exc})"


def checkpoint_line() -> str:
    if importlib.util.find_spec("benchmarks.shim.checkpoint") is None:
        return "`benchmarks.shim.checkpoint` (not in this tree: it would be skipped)"
    return "`benchmarks.shim.checkpoint`"


def finish(report: list[str], out: Path, started: float, status: int) -> int:
    report += ["", f"The check took {time.monotonic() - started:.0f} s."]
    text = "\n".join(report) + "\n"
    out.write_text(text)
    print(text, end="")
    print(f"(written to {out})", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
