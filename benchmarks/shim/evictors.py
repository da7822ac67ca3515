"""The evictors side by side on one working set (GPU, PyTorch): ``python -m
benchmarks.shim.evictors [--gib 4]``, the step ``evictors`` of ``make gpu-check``.

For each of ``vmm``, ``managed`` and ``checkpoint`` (``KIWI_EVICT``): a shimmed worker A fills
the working set and holds the GPU; a second worker B, with a small working set that the daemon
is told does not fit beside A's (``--gpu-memory``), touches the GPU, so A is evicted; then A
checks its working set, so B leaves and A is restored. Twice: the second eviction goes into
whatever the first one kept (host shadows), so the difference is what building them cost on the
way out ("pin"). Each row gives

- evict and restore GB/s by the evictor's own clock (the shim's statistics) where it keeps one,
  and by the wall clock otherwise (B's wait; A's first pass less a steady one), each against a
  pinned ``cudaMemcpy`` of the same bytes in the same run (issue 30's target: 0.8 both ways);
- the GPU memory NVML saw freed by the eviction (the target: 95 % of the working set);
- whether A's working set came back intact (a checksum per 2 MiB row).

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


@dataclass
class Round:
    evict_s: float | None  # the evictor's own clock, where it keeps one
    waited_s: float  # B's wait for the GPU
    restore_s: float | None
    back_s: float  # A's first pass after asking, less a steady pass
    freed: int | None  # NVML
    intact: bool


def rate(nbytes: int, seconds: float | None, floor: float) -> str:
    if not seconds or seconds <= 0:
        return "n/a"
    return f"{nbytes / seconds / 1e9:.1f} ({nbytes / seconds / floor:.2f})"


def row_cells(evictor: str, nbytes: int, rounds: list[Round], floor: dict[str, float]) -> list[str]:
    first, again = rounds[0], rounds[-1]
    by_clock = first.evict_s is not None
    out = first.evict_s if by_clock else first.waited_s
    out_again = again.evict_s if by_clock else again.waited_s
    back = first.restore_s if first.restore_s is not None else first.back_s
    pin = None if out is None or out_again is None else out - out_again
    freed = "n/a" if first.freed is None else (
        f"{first.freed / GiB:.2f} of {nbytes / GiB:.2f} ({first.freed / nbytes:.0%})")
    return [evictor, rate(nbytes, out, floor["to_host"]), rate(nbytes, out_again,
                                                               floor["to_host"]),
            rate(nbytes, back, floor["to_device"]), f"{first.waited_s:.3f}", freed,
            "yes" if all(r.intact for r in rounds) else "**NO**",
            "n/a" if pin is None else f"{pin:.3f}",
            "the evictor's clock" if by_clock else "wall clock (B's wait, A's pass)"]


HEADER = ["evictor", "evict GB/s (vs D->H)", "again, warm (vs D->H)", "restore GB/s (vs H->D)",
          "B waited (s)", "NVML freed GiB", "intact", "pin (s): cold - warm", "measured by"]


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


def one_evictor(evictor: str, socket: str, shim: str, nbytes: int, evict_copy: str,
                used: Callable[[], int | None] | None = None,
                extra: dict[str, str] | None = None) -> tuple[list[Round], str]:
    """Two rounds of eviction and restore; or no rounds and why. used: the card's used bytes
    (NVML's by default, or the fake's count); extra: more environment for the workers."""
    used = used or nvml_used
    a = Worker(socket, shim, evictor, f"evictors-a-{evictor}", evict_copy, extra)
    b = Worker(socket, shim, evictor, f"evictors-b-{evictor}", evict_copy, extra)
    try:
        a("cell_begin")
        a("fill", bytes=nbytes)
        ran_as = a("stats")["evict"]
        if ran_as != evictor:
            return [], f"{evictor}: unavailable here (the shim ran KIWI_EVICT={evictor} as " \
                       f"{ran_as})"
        steady = statistics.median(a("check")["seconds"] for _ in range(3))
        b("cell_begin")
        b("small", bytes=SMALL)
        rounds = []
        for _ in range(2):
            before_stats, before_used = a("stats"), used()
            waited = b("touch")  # A is evicted first
            after_used = used()
            evicted_stats = a("stats")
            checked = a("check")  # B leaves, A is restored first
            after_stats = a("stats")
            evict_s = evicted_stats["seconds_evicting"] - before_stats["seconds_evicting"]
            restore_s = after_stats["seconds_restoring"] - evicted_stats["seconds_restoring"]
            rounds.append(Round(
                evict_s=evict_s if evicted_stats["bytes_evicted"] > before_stats["bytes_evicted"]
                else None,
                waited_s=waited,
                restore_s=restore_s if after_stats["bytes_restored"]
                > evicted_stats["bytes_restored"] else None,
                back_s=max(0.0, checked["seconds"] - steady),
                freed=None if before_used is None or after_used is None
                else before_used - after_used,
                intact=checked["intact"]))
        a("release")
        b("release")
        return rounds, ""
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


def card_used(card: Path) -> int | None:
    """The fake card's bytes in use (tests/shim/fake_device.py reads the same first field)."""
    try:
        return int(struct.unpack_from("=Q", card.read_bytes())[0])
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
            "link; the fake card's count stands for NVML. The fake's cuMemHostRegister faults "
            "no page in, as a driver's does while it pins (in the background): here the first "
            "eviction faults the shadows in, and \"pin\" is that.", "")
        say("| " + " | ".join(HEADER) + " |", "|" + " --- |" * len(HEADER))
        extra = {"LD_LIBRARY_PATH": directory, "FAKE_CUDA_DEVICE": str(card),
                 "KIWI_EVICTORS_BACKEND": "driver", "KIWI_VMM_SHADOW": shadow}
        daemon, socket = start_daemon(directory, "--tq", "0.05", "--grace", "120", "--gpus",
                                      "1", "--gpu-memory", str(gpu_memory_flag(nbytes)))
        try:
            rounds, why = one_evictor("vmm", socket, shim, nbytes, "off",
                                      used=lambda: card_used(card), extra=extra)
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
    notes = []
    with tempfile.TemporaryDirectory(prefix="kiwi-", dir="/tmp") as directory:
        daemon, socket = start_daemon(directory, "--tq", "0.05", "--grace", "120", "--gpus", "1",
                                      "--gpu-memory", str(gpu_memory_flag(nbytes)))
        try:
            for evictor in evictors:
                try:
                    rounds, why = one_evictor(evictor, socket, shim, nbytes, args.evict_copy,
                                              extra={"KIWI_VMM_SHADOW": args.vmm_shadow})
                except (RuntimeError, OSError, ValueError) as exc:
                    rounds, why = [], f"{evictor}: failed ({exc})"
                if rounds:
                    say("| " + " | ".join(row_cells(evictor, nbytes, rounds, floor)) + " |")
                else:
                    notes.append(why)
        finally:
            daemon.terminate()
            daemon.wait(10)
    say("", *[f"- {note}" for note in notes])
    return 0


if __name__ == "__main__":
    sys.exit(main())
