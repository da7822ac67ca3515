"""The vmm evictor's switch speed on the fake driver's modelled link, without a GPU (issue 39,
Must-work 3): ``python -m benchmarks.shim.modelled_link [--gib 1] [--link-gbps 0.25]``, the
``shim_link`` step of ``make bench``.

The tests' fake driver (tests/shim/fake_cuda.c, fake_streams.c) gives the card a link with one
copy engine per direction at ``--link-gbps`` from and to pinned memory (a fifth of that from and
to pageable memory, staged and synchronous, as the driver does), and pinning that takes its time
and holds the driver (``--pin-gbps``). Over it, with the real daemon and shimmed processes
(benchmarks/shim/evictors_worker.py, the driver API through ctypes):

- **floor**: the fake link's own pinned ``cuMemcpy`` of the working set, each way, in the same
  run, in a process without the shim (the ratios' denominator);
- **evict and restore**, by the shim's own clock over the bytes it moved, in two ways: with the
  shadows pinned ahead (waited for before the first round), and as a first eviction (a pin
  budget that leaves room for the staging ring only, so every chunk goes out to pageable memory
  made then, through the ring); three rounds each, the data changed before each, its checksum
  checked after each restore (target: 0.8 of the floor each way);
- **switch**: two processes with a working set each and a card with room for one and a chunk,
  the daemon with ``handoff_overlap``: one's cell begins while the other holds the card; the
  time from the newcomer's first GPU call to its return (the leaver's way out and the
  newcomer's way in, overlapped on the two engines) against max(out, in) at the floor's rate
  (target: at most 1.25).

The fake card and the shadows are real host memory: a working set of G GiB takes about 5G GiB
while the switch runs (two working sets on the card and in host memory, the floor's buffers).
The rates are the model's, not a GPU's: what this measures is whether the shim keeps the link's
engines busy, both at once. The link's default is slow enough for a busy 2-core machine's CPU
to keep up with the fake's own work (each copy is a real memmove, and a first eviction's copies
fault fresh pages in): at 0.5 GB/s on such a machine under load the staged way out is CPU-bound.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import start_daemon, without_kiwi
from benchmarks.shim.evictors import Worker, build_fake, card_used

GiB = 1 << 30
MiB = 1 << 20
ROUNDS = 3
#: The daemon's memory reserve is left at 0 here: the card is the fake's, all of it the test's.
TARGET_MOVE = 0.8
TARGET_SWITCH = 1.25

FLOOR_CODE = """
import ctypes, json, sys, time
cu = ctypes.CDLL("libcuda.so.1"); cu.cuInit(0)
n = int(sys.argv[1])
c_u64, c_size = ctypes.c_uint64, ctypes.c_size_t
class Prop(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("handles", ctypes.c_int), ("ltype", ctypes.c_int),
                ("lid", ctypes.c_int), ("win32", ctypes.c_void_p), ("rest", ctypes.c_ubyte * 8)]
class Access(ctypes.Structure):
    _fields_ = [("ltype", ctypes.c_int), ("lid", ctypes.c_int), ("flags", ctypes.c_int)]
def check(name, code):
    if code:
        raise SystemExit(f"{name} failed with CUresult {code}")
va, handle = c_u64(), c_u64()
check("reserve", cu.cuMemAddressReserve(ctypes.byref(va), c_size(n), c_size(0), c_u64(0), c_u64(0)))
prop = Prop(1, 0, 1, 0)
check("create", cu.cuMemCreate(ctypes.byref(handle), c_size(n), ctypes.byref(prop), c_u64(0)))
check("map", cu.cuMemMap(va, c_size(n), c_size(0), handle, c_u64(0)))
check("access", cu.cuMemSetAccess(va, c_size(n), ctypes.byref(Access(1, 0, 3)), c_size(1)))
host = ctypes.c_void_p()
check("host", cu.cuMemAllocHost_v2(ctypes.byref(host), c_size(n)))
ctypes.memset(host, 7, n)
def best(copy):
    times = []
    for _ in range(3):
        started = time.perf_counter()
        check("copy", copy())
        times.append(time.perf_counter() - started)
    return n / min(times)
to_host = best(lambda: cu.cuMemcpyDtoH_v2(host, va, c_size(n)))
to_device = best(lambda: cu.cuMemcpyHtoD_v2(va, host, c_size(n)))
print(json.dumps({"to_host": to_host, "to_device": to_device}))
"""


@dataclass
class Move:
    out_rate: float
    in_rate: float
    intact: bool


@dataclass
class Switch:
    seconds: float
    out_bytes: int
    in_bytes: int
    out_seconds: float
    in_seconds: float


def say(*lines: str) -> None:
    for line in lines:
        print(line, flush=True)


def fake_env(directory: str, link: float, pin: float, nbytes: int) -> dict[str, str]:
    """The workers' fake driver: a card shared by all (``directory/card``) with room for four
    working sets of ``nbytes`` and 4 GiB, the link, pinning's speed; and device memory kept
    for reuse once written (a GPU's needs no page faults, which the fake's would cost inside
    the link's time)."""
    return {"LD_LIBRARY_PATH": directory, "FAKE_CUDA_DEVICE": str(Path(directory) / "card"),
            "FAKE_CUDA_TOTAL": str(card_total(nbytes)),
            "FAKE_CUDA_LINK_GBPS": str(link), "FAKE_CUDA_PIN_GBPS": str(pin),
            "FAKE_CUDA_BACKING_CACHE": str(nbytes + 512 * MiB),
            "KIWI_EVICTORS_BACKEND": "driver"}


def card_total(nbytes: int) -> int:
    return 4 * nbytes + 4 * GiB


def pinned(w: Worker, nbytes: int) -> None:
    """Until w's shadows are pinned (the builder's progress shows only in the figures)."""
    while w("stats")["host_shadow_pinned"] < nbytes:
        time.sleep(0.05)


def filled(socket: str, shim: str, name: str, nbytes: int, extra: dict[str, str],
           pinned_ahead: bool = True) -> Worker:
    """A shimmed worker that filled a working set of ``nbytes`` in one cell and is idle, its
    shadows pinned where ``pinned_ahead``."""
    w = Worker(socket, shim, "vmm", name, "off", extra)
    w("cell_begin")
    w("fill", bytes=nbytes)
    w("release")
    if pinned_ahead:
        pinned(w, nbytes)
    return w


def evicted(w: Worker) -> None:
    """Until w's way out has ended (a grant may reach the other after its first report)."""
    while not w("stats")["evicted"]:
        time.sleep(0.01)


def floor(directory: str, nbytes: int, link: float) -> dict[str, float]:
    """The fake link's pinned cuMemcpy each way, bytes/s, best of 3, without the shim."""
    env = {**without_kiwi(), "LD_LIBRARY_PATH": directory, "FAKE_CUDA_LINK_GBPS": str(link),
           "FAKE_CUDA_TOTAL": str(2 * nbytes)}
    out = subprocess.run([sys.executable, "-c", FLOOR_CODE, str(nbytes)], env=env, check=True,
                         capture_output=True, text=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


@contextlib.contextmanager
def daemon(directory: str, gpu_memory: int, overlap: bool, more: str = "") -> Iterator[str]:
    """The real daemon for one phase, told the card is gpu_memory bytes (nothing in reserve);
    ``more``: further lines of its config."""
    config = Path(directory) / "kiwi.yaml"
    # A way out of several GiB on a slow modelled link takes longer than the default 10 s the
    # daemon gives an eviction to end (it does not yet follow the eviction's progress).
    config.write_text(f"handoff_overlap: {'true' if overlap else 'false'}\nmemory_reserve: 0\n"
                      f"evict_timeout: 600\n{more}")
    process, socket = start_daemon(directory, "--tq", "0.05", "--grace", "120", "--gpus", "1",
                                   "--gpu-memory", str(gpu_memory), "--config", str(config))
    try:
        yield socket
    finally:
        process.terminate()
        process.wait(10)


def moves(socket: str, shim: str, nbytes: int, extra: dict[str, str],
          pinned_ahead: bool) -> list[Move]:
    """ROUNDS evictions and restores of one working set: a worker fills it and holds; another,
    small, takes the GPU (the daemon is told the two do not fit: the first is evicted); the
    first's check brings it back."""
    a = filled(socket, shim, "link-a", nbytes, extra, pinned_ahead)
    b = Worker(socket, shim, "vmm", "link-b", "off", extra)
    rounds = []
    try:
        b("cell_begin")
        b("small", bytes=2 * MiB)  # with a's, one more than the daemon is told fits
        for round_ in range(1, ROUNDS + 1):
            a("cell_begin")
            a("change", round=round_)
            a("release")
            before = a("stats")
            b("touch")  # a is asked to evict for it
            b("release")
            evicted(a)
            away = a("stats")
            a("cell_begin")
            checked = a("check")  # a comes back first
            a("release")
            after = a("stats")
            out_bytes = away["bytes_evicted"] - before["bytes_evicted"]
            in_bytes = after["bytes_restored"] - away["bytes_restored"]
            rounds.append(Move(
                out_rate=out_bytes / max(1e-9, away["seconds_evicting"]
                                         - before["seconds_evicting"]),
                in_rate=in_bytes / max(1e-9, after["seconds_restoring"]
                                       - away["seconds_restoring"]),
                intact=checked["intact"]))
        return rounds
    finally:
        a.close()
        b.close()


def switches(socket: str, shim: str, nbytes: int, extra: dict[str, str],
             total: int) -> list[Switch]:
    """Two working sets on a card with room for one and a chunk, taking turns."""
    # Each fills its set while the card still has room for both.
    pair = [filled(socket, shim, f"switch-{name}", nbytes, extra) for name in "ab"]
    results = []
    try:
        room = nbytes + 256 * MiB  # the card's room from now on: one set and a chunk
        for w in pair:
            w("env", name="FAKE_CUDA_OTHERS_USED", value=str(total - room))
        for turn in range(2 * ROUNDS):
            newcomer, leaver = pair[turn % 2], pair[(turn + 1) % 2]
            newcomer_before, leaver_before = newcomer("stats"), leaver("stats")
            newcomer("cell_begin")
            seconds = newcomer("poke")
            newcomer("release")
            evicted(leaver)
            newcomer_after, leaver_after = newcomer("stats"), leaver("stats")
            results.append(Switch(
                seconds=seconds,
                out_bytes=leaver_after["bytes_evicted"] - leaver_before["bytes_evicted"],
                in_bytes=newcomer_after["bytes_restored"] - newcomer_before["bytes_restored"],
                out_seconds=leaver_after["seconds_evicting"] - leaver_before["seconds_evicting"],
                in_seconds=(newcomer_after["seconds_restoring"]
                            - newcomer_before["seconds_restoring"])))
        return [r for r in results if r.in_bytes]  # the first turn may find its set resident
    finally:
        for w in pair:
            w.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shim.modelled_link",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=1.0, help="each working set, GiB")
    parser.add_argument("--link-gbps", type=float, default=0.25,
                        help="the modelled link, each way, GB/s (pinned memory)")
    parser.add_argument("--pin-gbps", type=float, default=2.0,
                        help="how fast the modelled driver pins host memory, GB/s")
    args = parser.parse_args(argv)
    nbytes = int(args.gib * GiB) // (2 * MiB) * (2 * MiB)
    from kiwi_jupyter.shim import library_path

    shim = str(library_path())
    say("## The vmm evictor on the fake driver's modelled link", "")
    with tempfile.TemporaryDirectory(prefix="kiwi-link-", dir="/tmp") as directory:
        if build_fake(directory) is None:
            say("Skipped: tests/shim/fake_cuda.c is not here, or did not build.")
            return 0
        rate = floor(directory, nbytes, args.link_gbps)
        say(f"{time.strftime('%Y-%m-%d')}: working set {nbytes / GiB:.2f} GiB, link "
            f"{args.link_gbps:g} GB/s each way (pageable: a fifth), pinning "
            f"{args.pin_gbps:g} GB/s; the floor, the fake link's own pinned cuMemcpy: D->H "
            f"{rate['to_host'] / 1e9:.2f} GB/s, H->D {rate['to_device'] / 1e9:.2f} GB/s.", "")
        total = card_total(nbytes)
        card = Path(directory) / "card"
        extra = fake_env(directory, args.link_gbps, args.pin_gbps, nbytes)
        say("| shadows | evict GB/s (vs floor) | worst | restore GB/s (vs floor) | worst "
            "| intact |", "| --- | --- | --- | --- | --- | --- |")
        ok = True
        for label, pinned_ahead, more in (
                ("pinned ahead", True, {}),
                ("first eviction: pageable, through the staging ring", False,
                 {"KIWI_VMM_PIN_BUDGET": str(256 * MiB)})):
            with daemon(directory, nbytes + MiB, overlap=False) as socket:
                rounds = moves(socket, shim, nbytes, {**extra, **more}, pinned_ahead)
            out = statistics.median(r.out_rate for r in rounds)
            back = statistics.median(r.in_rate for r in rounds)
            worst_out = min(r.out_rate for r in rounds) / rate["to_host"]
            worst_back = min(r.in_rate for r in rounds) / rate["to_device"]
            intact = all(r.intact for r in rounds)
            ok = ok and intact and out >= TARGET_MOVE * rate["to_host"] and \
                back >= TARGET_MOVE * rate["to_device"]
            say(f"| {label} | {out / 1e9:.2f} ({out / rate['to_host']:.2f}) | {worst_out:.2f} | "
                f"{back / 1e9:.2f} ({back / rate['to_device']:.2f}) | {worst_back:.2f} | "
                f"{'yes' if intact else '**NO**'} |")
        say("", f"The median of {ROUNDS} rounds (and the worst), the data changed before each, by "
            "the shim's clock over the bytes it moved (target: the median at 0.8 of the floor "
            "each way; the worst shows this shared machine's noise).", "")
        with daemon(directory, nbytes * 3 // 2, overlap=True) as socket:
            turns = switches(socket, shim, nbytes, extra, total)
        say("| switch | seconds | out (s) | in (s) | vs max(out, in) at the floor |",
            "| --- | --- | --- | --- | --- |")
        ratios = []
        for i, turn in enumerate(turns, 1):
            ideal = max(turn.out_bytes / rate["to_host"], turn.in_bytes / rate["to_device"])
            ratios.append(turn.seconds / ideal)
            say(f"| {i} | {turn.seconds:.3f} | {turn.out_seconds:.3f} | "
                f"{turn.in_seconds:.3f} | {ratios[-1]:.2f} |")
        median = statistics.median(ratios) if ratios else float("inf")
        ok = ok and median <= TARGET_SWITCH
        say("", f"Switch: the newcomer's first GPU call, from asking to its return, the daemon "
            f"with handoff_overlap; the median of {len(ratios)} switches "
            f"{median:.2f} x max(out, in) at the floor's rate (target: at most {TARGET_SWITCH}), "
            f"the worst {max(ratios, default=float('inf')):.2f}; the card's used bytes at the "
            f"end: {(card_used(card) or 0) / GiB:.2f} GiB.", "",
            f"**Verdict: {'PASS' if ok else 'FAIL'}** (evict and restore >= {TARGET_MOVE} of the "
            f"floor each way, with shadows pinned ahead and without; switch <= "
            f"{TARGET_SWITCH}).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
