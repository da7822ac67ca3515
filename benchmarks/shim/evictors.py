"""The evictors side by side on one working set (GPU, PyTorch): ``python -m
benchmarks.shim.evictors [--gib 4]``, the step ``evictors`` of ``make gpu-check``.

For each of ``vmm``, ``managed`` and ``checkpoint`` (``KIWI_EVICT``): a shimmed worker A fills
the working set and holds the GPU; a second worker B, with a small working set that the daemon
is told does not fit beside A's (``--gpu-memory``), touches the GPU, so A is evicted; then A
checks its working set, so B leaves and A is restored. Each round first changes A's data (a
shadow left from an earlier round then fails the check), and its figures are read once A says
its way out has ended (``evicted``: a grant may reach B after the first progress report, long
before). Under vmm the first round comes right after the fill, before the host shadows are
pinned (a first eviction: pageable shadows made then, through the staging ring), and the others
(``--rounds``, 3) once they are. Each row gives

- evict and restore GB/s over the bytes each move moved (the evictor's count), by its own clock
  (the shim's statistics) where it keeps one, and by the wall clock otherwise (B's wait; A's
  first pass less a steady one), each against a pinned ``cudaMemcpy`` of the same bytes in the
  same run (issue 30's target: 0.8 both ways); the first eviction apart, the others the worst;
- the GPU memory NVML saw leave A's process (its per-process figure; the card's where NVML has
  none) in the round that freed least, against the working set (the target: 95 %);
- whether A's working set came back intact every round (a checksum per 2 MiB row).

A verdict line per evictor says PASS or FAIL against those three targets.

An evictor the shim runs as another (``vmm`` on a device without VMM, ``checkpoint`` where the
daemon cannot checkpoint) gets one line that says so. ``KIWI_VMM_SHADOW`` is passed on, so the
vmm row can be measured with registered huge pages (the default) and with ``allochost``
(``--vmm-shadow``), whose "pin" column compares the two ways of pinning. Without a GPU,
PyTorch or NVML it says so, and runs the vmm row over the tests' fake driver instead (the
workers drive the driver API through ctypes, the card's count stands for NVML): a dry run of
the whole path, whose rates are this host's memory copies, not a GPU's link. The working set
shrinks to what the card has free (two sets and headroom never oversubscribe it); rows are
printed as they are measured.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import select
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import start_daemon, without_kiwi

REPO = Path(__file__).resolve().parents[2]
GiB = 1 << 30
MiB = 1 << 20
#: In the order they run: the one the next change is about first, the one known to hang at
#: times (NVIDIA/cuda-checkpoint#30) last.
EVICTORS = ("vmm", "managed", "checkpoint")
#: B's working set: small beside A's, so NVML's "freed" is almost all A's.
SMALL = 64 * MiB
#: The daemon's memory reserve (nodeside/config/settings.py, memory_reserve).
DAEMON_RESERVE = 512 * MiB
HEADROOM = 4 * GiB
#: The longest a worker may take to answer: a hung eviction fails its row, not the step.
OP_TIMEOUT = 60.0


def gpu_memory_flag(nbytes: int) -> int:
    """The GPU size the daemon is told: A's working set fits alone, not with B's beside it."""
    return nbytes + DAEMON_RESERVE + SMALL // 2


def working_set(wanted: int, card_free: int) -> int:
    """At most wanted, in whole 2 MiB rows, leaving room for a second set and headroom (a
    managed working set must never oversubscribe the card)."""
    room = (card_free - HEADROOM) // 2
    return max(0, min(wanted, room) // (2 * MiB) * (2 * MiB))


#: The targets (issue 30, issue 39 Must-work 4).
TARGET_RATE = 0.8
TARGET_FREED = 0.95


@dataclass
class Round:
    first: bool  # before the host shadows were pinned (vmm's first eviction)
    moved_out: int  # bytes the way out moved, by the evictor's count (0: it keeps none)
    evict_s: float | None  # the evictor's own clock, where it keeps one
    waited_s: float  # B's wait for the GPU
    moved_in: int
    restore_s: float | None
    back_s: float  # A's first pass after asking, less a steady pass
    freed: int | None  # NVML: what left A's process, read once its way out had ended
    intact: bool


def out_rate(nbytes: int, r: Round) -> float | None:
    """Bytes/s of a way out: the bytes it moved by its own clock; else the working set over
    B's wait."""
    if r.evict_s is not None:
        return r.moved_out / r.evict_s if r.evict_s > 0 else None
    return nbytes / r.waited_s if r.waited_s > 0 else None


def in_rate(nbytes: int, r: Round) -> float | None:
    if r.restore_s is not None:
        return r.moved_in / r.restore_s if r.restore_s > 0 else None
    return nbytes / r.back_s if r.back_s > 0 else None


def rate(value: float | None, floor: float) -> str:
    return "n/a" if value is None else f"{value / 1e9:.1f} ({value / floor:.2f})"


def worst(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return min(known) if known and len(known) == len(values) else None


def figures(nbytes: int, rounds: list[Round]) -> dict[str, float | None]:
    """The row's figures: the first eviction's rate, the worst of the other evictions' and of
    every restore's, the least NVML saw freed (a fraction of the working set)."""
    freed = [r.freed / nbytes if r.freed is not None else None for r in rounds]
    return {"first": worst([out_rate(nbytes, r) for r in rounds if r.first]) if any(
                r.first for r in rounds) else None,
            "out": worst([out_rate(nbytes, r) for r in rounds if not r.first]),
            "in": worst([in_rate(nbytes, r) for r in rounds]),
            "freed": worst(freed)}


def row_cells(evictor: str, nbytes: int, rounds: list[Round], floor: dict[str, float]) -> list[str]:
    f = figures(nbytes, rounds)
    freed = "n/a" if f["freed"] is None else f"{f['freed']:.0%}"
    by_clock = all(r.evict_s is not None for r in rounds)
    return [evictor, rate(f["first"], floor["to_host"]), rate(f["out"], floor["to_host"]),
            rate(f["in"], floor["to_device"]), f"{max(r.waited_s for r in rounds):.3f}", freed,
            "yes" if all(r.intact for r in rounds) else "**NO**",
            "the evictor's clock" if by_clock else "wall clock (B's wait, A's pass)"]


def verdict(evictor: str, nbytes: int, rounds: list[Round], floor: dict[str, float]) -> str:
    """PASS or FAIL against the three targets, and what missed."""
    f = figures(nbytes, rounds)
    missed = []
    for name, key, side in (("first eviction", "first", "to_host"), ("evict", "out", "to_host"),
                            ("restore", "in", "to_device")):
        value = f[key]
        if key == "first" and not any(r.first for r in rounds):
            continue
        if value is None or value < TARGET_RATE * floor[side]:
            missed.append(f"{name} {'n/a' if value is None else f'{value / floor[side]:.2f}'} "
                          f"< {TARGET_RATE}")
    freed = f["freed"]
    if freed is None or freed < TARGET_FREED:
        missed.append(f"NVML freed {'n/a' if freed is None else f'{freed:.0%}'} "
                      f"< {TARGET_FREED:.0%}")
    if not all(r.intact for r in rounds):
        missed.append("contents not intact")
    return (f"- verdict {evictor}: {'FAIL' if missed else 'PASS'}"
            + (f" ({'; '.join(missed)})" if missed else
               f" (evict and restore >= {TARGET_RATE} of the pinned copy, NVML freed >= "
               f"{TARGET_FREED:.0%}, contents intact)"))


HEADER = ["evictor", "first eviction GB/s (vs D->H)", "evict GB/s, worst (vs D->H)",
          "restore GB/s, worst (vs H->D)", "B waited (s), most", "NVML freed, least", "intact",
          "measured by"]


class Worker:
    def __init__(self, socket: str, shim: str, evictor: str, name: str, evict_copy: str,
                 extra: dict[str, str] | None = None) -> None:
        env = {**without_kiwi(), "LD_PRELOAD": shim, "KIWI_SOCKET": socket,
               "KIWI_IDLE_RELEASE": "0", "KIWI_EVICT": evictor, "KIWI_CLIENT_NAME": name,
               "KIWI_EVICT_COPY": evict_copy, "PYTHONPATH": str(REPO), **(extra or {})}
        self.process = subprocess.Popen([sys.executable, "-m", "benchmarks.shim.evictors_worker"],
                                        cwd=REPO, env=env, text=True, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE)

    def __call__(self, op: str, **fields: Any) -> Any:
        assert self.process.stdin and self.process.stdout
        self.process.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], OP_TIMEOUT)
        if not ready:
            self.process.kill()
            raise RuntimeError(f"{op}: no answer in {OP_TIMEOUT:.0f} s")
        reply = json.loads(self.process.stdout.readline() or '{"error": "the worker died"}')
        if "error" in reply:
            raise RuntimeError(f"{op}: {reply['error']}")
        return reply["result"]

    def close(self) -> None:
        if self.process.stdin:
            self.process.stdin.close()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def nvml_used() -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used)
    except Exception:  # no NVML: the column says n/a
        return None


def pinned_floor(nbytes: int) -> dict[str, float]:
    """Bytes/s of a pinned-host cudaMemcpy each way, best of 3, in a process without the shim."""
    code = f"""
import json, torch
n = {nbytes}
host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
device = torch.empty(n, dtype=torch.uint8, device="cuda")
def best(copy):
    copy(); torch.cuda.synchronize()
    times = []
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(); copy(); end.record(); end.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return n / min(times)
print(json.dumps({{"to_host": best(lambda: host.copy_(device, non_blocking=True)),
                   "to_device": best(lambda: device.copy_(host, non_blocking=True))}}))
"""
    out = subprocess.run([sys.executable, "-c", code], env=without_kiwi(), check=True,
                         capture_output=True, text=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def nvml_process_used(pid: int) -> int | None:
    """NVML's per-process used GPU memory of pid (0 when it is not listed); None without."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if process.pid == pid:
                return int(process.usedGpuMemory or 0)
        return 0
    except Exception:  # no NVML, or no per-process figures (MIG, some containers)
        return None


#: How long a round waits for A to say its way out has ended, or its shadows are pinned.
SETTLE_TIMEOUT = 120.0


def until(check: Callable[[], bool], timeout: float = SETTLE_TIMEOUT) -> bool:
    """Polls check (the workers' figures: no event says so) until it holds; False on timeout."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def one_evictor(evictor: str, socket: str, shim: str, nbytes: int, evict_copy: str,
                used: Callable[[int], int | None] | None = None,
                extra: dict[str, str] | None = None, rounds: int = 3) -> tuple[list[Round], str]:
    """Rounds of eviction and restore (under vmm a first eviction, then rounds once the shadows
    are pinned); or no rounds and why. used(pid): the GPU memory of A's process (NVML's by
    default, or the fake card's row); extra: more environment for the workers."""
    used = used or nvml_process_used
    a = Worker(socket, shim, evictor, f"evictors-a-{evictor}", evict_copy, extra)
    b = Worker(socket, shim, evictor, f"evictors-b-{evictor}", evict_copy, extra)
    try:
        a("cell_begin")
        a("fill", bytes=nbytes)
        stats = a("stats")
        ran_as, pid = stats["evict"], stats["pid"]
        if ran_as != evictor:
            return [], f"{evictor}: unavailable here (the shim ran KIWI_EVICT={evictor} as " \
                       f"{ran_as})"
        steady = statistics.median(a("check")["seconds"] for _ in range(3))
        b("cell_begin")
        b("small", bytes=SMALL)
        plan = ([True] if evictor == "vmm" else []) + [False] * rounds
        results: list[Round] = []
        for number, first in enumerate(plan, 1):
            if not first and evictor == "vmm" and not until(
                    lambda: a("stats")["host_shadow_pinned"] >= nbytes):
                return results, f"{evictor}: the host shadows were not pinned within " \
                                f"{SETTLE_TIMEOUT:.0f} s"
            a("change", round=number)  # a stale shadow fails the check
            before_stats, before_used = a("stats"), used(pid)
            waited = b("touch")  # A is evicted first
            done = before_stats["evictions"]

            def out_ended(done: int = done) -> bool:
                stats = a("stats")
                return bool(stats["evictions"] > done and stats["evicted"])

            if not until(out_ended):
                return results, f"{evictor}: the way out did not end within " \
                                f"{SETTLE_TIMEOUT:.0f} s"
            after_used, evicted_stats = used(pid), a("stats")
            checked = a("check")  # B leaves, A is restored first
            after_stats = a("stats")
            results.append(Round(
                first=first,
                moved_out=evicted_stats["bytes_evicted"] - before_stats["bytes_evicted"],
                evict_s=evicted_stats["seconds_evicting"] - before_stats["seconds_evicting"]
                if evicted_stats["bytes_evicted"] > before_stats["bytes_evicted"] else None,
                waited_s=waited,
                moved_in=after_stats["bytes_restored"] - evicted_stats["bytes_restored"],
                restore_s=after_stats["seconds_restoring"] - evicted_stats["seconds_restoring"]
                if after_stats["bytes_restored"] > evicted_stats["bytes_restored"] else None,
                back_s=max(0.0, checked["seconds"] - steady),
                freed=None if before_used is None or after_used is None
                else before_used - after_used,
                intact=checked["intact"]))
        a("release")
        b("release")
        return results, ""
    finally:
        a.close()
        b.close()


#: The dry run's working set over the fake driver: its bytes are really copied, on this host.
FAKE_WORKING_SET = 64 * MiB


def build_fake(directory: str) -> Path | None:
    """The tests' fake driver (tests/shim/fake_cuda.c) built into directory; None without it."""
    source = REPO / "tests" / "shim" / "fake_cuda.c"
    fake = Path(directory) / "libcuda.so.1"
    if not source.is_file():
        return None
    built = subprocess.run(["gcc", "-std=c11", "-O1", "-fPIC", "-shared", "-fvisibility=hidden",
                            "-Wl,-soname,libcuda.so.1", "-Wl,-Bsymbolic", "-o", str(fake),
                            str(source), "-lpthread"], capture_output=True, text=True)
    return fake if built.returncode == 0 else None


def card_used(card: Path, pid: int | None = None) -> int | None:
    """The fake card's bytes in use, or process pid's row (tests/shim/fake_device.py reads the
    same layout: the card's count, then rows of pid, bytes and bytes checkpointed)."""
    try:
        data = card.read_bytes()
        if pid is None:
            return int(struct.unpack_from("=Q", data)[0])
        for offset in range(8, len(data) - 23, 24):
            row_pid, nbytes, _ = struct.unpack_from("=qQQ", data, offset)
            if row_pid == pid:
                return int(nbytes)
        return 0
    except (OSError, struct.error):
        return None


def host_copy_floor(nbytes: int) -> dict[str, float]:
    """What the fake driver's copies are made of: one memmove of nbytes on this host, best of 3."""
    source, target = ctypes.create_string_buffer(nbytes), ctypes.create_string_buffer(nbytes)
    best = min(_timed(lambda: ctypes.memmove(target, source, nbytes)) for _ in range(3))
    return {"to_host": nbytes / best, "to_device": nbytes / best}


def _timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def vmm_status(shim: str, directory: str | None = None) -> str:
    """Whether this shim runs KIWI_EVICT=vmm as vmm: asked over the tests' fake driver, which
    supports the VMM API (no GPU needed), built in directory (or a directory of its own)."""
    if directory is None:
        with tempfile.TemporaryDirectory(prefix="kiwi-fake-") as scratch:
            if build_fake(scratch) is None:
                return "vmm: unknown here (no tests/shim/fake_cuda.c, or it did not build)"
            return vmm_status(shim, scratch)
    code = ("import ctypes; from kiwi_jupyter.shim import Shim\n"
            "cu = ctypes.CDLL('libcuda.so.1'); cu.cuInit(0); p = ctypes.c_uint64()\n"
            "cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(1 << 21))\n"
            "print(Shim.attach().stats()['evict'])\n")
    env = {**without_kiwi(), "LD_PRELOAD": shim, "LD_LIBRARY_PATH": directory,
           "KIWI_EVICT": "vmm", "KIWI_SOCKET": f"{directory}/none.sock",
           "KIWI_FAIL_TIMEOUT": "0", "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60)
    ran_as = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "nothing"
    if ran_as == "vmm":
        return "vmm: built (the shim runs KIWI_EVICT=vmm as vmm over the fake driver)"
    return f"vmm: not built (the shim runs KIWI_EVICT=vmm as {ran_as} over the fake driver)"


def dry_run(shim: str, shadow: str) -> None:
    """The vmm row over the tests' fake driver, where there is no GPU: the whole path (two
    shimmed workers, the real daemon, evictions and restores, the card's count), at this host's
    memory-copy speed."""
    with tempfile.TemporaryDirectory(prefix="kiwi-fake-", dir="/tmp") as directory:
        fake = build_fake(directory)
        if fake is None:
            say("vmm: unknown here (no tests/shim/fake_cuda.c, or it did not build)")
            return
        card = Path(directory) / "card"
        nbytes = FAKE_WORKING_SET
        floor = host_copy_floor(nbytes)
        say("Over the tests' fake driver instead, vmm only (KIWI_VMM_SHADOW=" + shadow + "): "
            f"working set {nbytes / MiB:.0f} MiB; the rates are this host's memory copies "
            f"(memmove {floor['to_host'] / 1e9:.1f} GB/s, the ratios' floor), not a GPU's "
            "link; the fake card's row of the process stands for NVML's.", "")
        say("| " + " | ".join(HEADER) + " |", "|" + " --- |" * len(HEADER))
        extra = {"LD_LIBRARY_PATH": directory, "FAKE_CUDA_DEVICE": str(card),
                 "KIWI_EVICTORS_BACKEND": "driver", "KIWI_VMM_SHADOW": shadow}
        daemon, socket = start_daemon(directory, "--tq", "0.05", "--grace", "120", "--gpus",
                                      "1", "--gpu-memory", str(gpu_memory_flag(nbytes)))
        try:
            rounds, why = one_evictor("vmm", socket, shim, nbytes, "off",
                                      used=lambda pid: card_used(card, pid), extra=extra)
        except (RuntimeError, OSError, ValueError) as exc:
            rounds, why = [], f"vmm: failed ({exc})"
        finally:
            daemon.terminate()
            daemon.wait(10)
        if rounds:
            say("| " + " | ".join(row_cells("vmm", nbytes, rounds, floor)) + " |")
        say("", *([f"- {why}"] if why else []), vmm_status(shim, directory))


def say(*lines: str) -> None:
    for line in lines:
        print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shim.evictors",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=4.0, help="the working set at most, GiB")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of eviction and restore (besides vmm's first eviction)")
    parser.add_argument("--only", help=f"comma-separated evictors, of {', '.join(EVICTORS)}")
    parser.add_argument("--evict-copy", choices=("off", "pinned", "pageable"), default="off",
                        help="KIWI_EVICT_COPY for the managed evictor (default off: prefetch)")
    parser.add_argument("--vmm-shadow", choices=("register", "allochost", "pageable"),
                        default="register",
                        help="KIWI_VMM_SHADOW for the vmm evictor: how its host shadows are "
                             "pinned (default register: huge pages, cuMemHostRegister)")
    args = parser.parse_args(argv)
    evictors = args.only.split(",") if args.only else list(EVICTORS)
    if unknown := [e for e in evictors if e not in EVICTORS]:
        parser.error(f"no evictor {', '.join(unknown)}; there are {', '.join(EVICTORS)}")
    from kiwi_jupyter.shim import library_path

    shim = str(library_path())
    say("## Evictors side by side", "")
    try:
        import torch

        usable = torch.cuda.is_available()
    except ImportError:
        usable = False
    if not usable or nvml_used() is None:
        say("Skipped: no GPU (or no PyTorch with CUDA, or no NVML).", "")
        dry_run(shim, args.vmm_shadow)
        return 0
    free, _total = torch.cuda.mem_get_info(0)
    nbytes = working_set(int(args.gib * GiB), free)
    if nbytes == 0:
        say(f"Skipped: {free / GiB:.1f} GiB free on the card is too little for two working "
            f"sets and {HEADROOM / GiB:.0f} GiB of headroom.")
        return 0
    floor = pinned_floor(nbytes)
    say(f"{torch.cuda.get_device_name(0)}, {time.strftime('%Y-%m-%d')}: working set "
        f"{nbytes / GiB:.2f} GiB; pinned cudaMemcpy floor D->H {floor['to_host'] / 1e9:.1f} "
        f"GB/s, H->D {floor['to_device'] / 1e9:.1f} GB/s (the ratios in brackets).", "")
    say("| " + " | ".join(HEADER) + " |", "|" + " --- |" * len(HEADER))
    notes: list[str] = []
    verdicts: list[str] = []
    with tempfile.TemporaryDirectory(prefix="kiwi-", dir="/tmp") as directory:
        daemon, socket = start_daemon(directory, "--tq", "0.05", "--grace", "120", "--gpus", "1",
                                      "--gpu-memory", str(gpu_memory_flag(nbytes)))
        try:
            for evictor in evictors:
                try:
                    rounds, why = one_evictor(evictor, socket, shim, nbytes, args.evict_copy,
                                              extra={"KIWI_VMM_SHADOW": args.vmm_shadow},
                                              rounds=args.rounds)
                except (RuntimeError, OSError, ValueError) as exc:
                    rounds, why = [], f"{evictor}: failed ({exc})"
                if rounds:
                    say("| " + " | ".join(row_cells(evictor, nbytes, rounds, floor)) + " |")
                    verdicts.append(verdict(evictor, nbytes, rounds, floor))
                if why:
                    notes.append(why)
                    verdicts.append(f"- verdict {evictor}: "
                                    + ("n/a" if "unavailable here" in why else f"FAIL ({why})"))
        finally:
            daemon.terminate()
            daemon.wait(10)
    say("", *[f"- {note}" for note in notes], "", *verdicts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
