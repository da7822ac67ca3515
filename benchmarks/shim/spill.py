"""The disk tier's speed against the disk's own, without a GPU (issue 42, "Measured"):
``python -m benchmarks.shim.spill [--mib 1024] [--dir /var/tmp/kiwi-spill-bench]
[--link-gbps 25]``.

- **floor**: ``dd`` of the same size in the same directory, 4 MiB blocks, ``oflag=direct
  conv=fdatasync`` out and ``iflag=direct`` back (the ratios' denominator);
- **spill and fetch**: a shimmed process under the vmm evictor over the tests' fake driver,
  its working set filled and evicted to host memory, then the daemon's ``spill`` (host memory
  to spill files, written, checksummed and synced) and ``fetch`` to host (read back and
  checked), each rate by the shim's own clock over the bytes it moved (``tier_moved``); three
  rounds, the best each way. Target: 0.8 of the floor each way.
- **restore from disk to the GPU**: spilled again, then restored by the next grant straight from
  the files, disk -> pinned staging -> card, pipelined; the rate by the shim's clock
  (``bytes_restored`` over ``seconds_restoring``), best of three. Its floor is the slower of
  dd's direct read of the same bytes and the fake link's copy of them from pinned memory (the
  same restore from pinned host shadows, same rounds, best of three: the fake driver's
  ``FAKE_CUDA_LINK_GBPS`` and its own copy into the card's memory): a pipeline at best runs
  at its slower stage. Target: 0.8 of that floor.

The daemon is scripted (tests/shim/scripted_daemon.py), as the shim's tests have it, until the
daemon's side of ``tier_moved`` is on main. The working set is real host memory twice (the
fake card and the shadows); the files are on the directory's disk.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import utc_now

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "shim"))
sys.path.insert(0, str(REPO / "tests"))

from scripted_daemon import ScriptedDaemon  # noqa: E402
from shim_harness import Workload, build_fake_cuda  # noqa: E402

from kiwi_jupyter.shim.build import LIBRARY_NAME, compile_library  # noqa: E402

MiB = 1 << 20
BLOCK = 4 * MiB
ROUNDS = 3
TARGET = 0.8


def dd_floor(directory: Path, size: int) -> tuple[float, float]:
    """dd's direct write (synced) and direct read of size bytes in directory, bytes/s."""
    target = directory / "dd-floor"
    count = size // BLOCK
    started = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={target}", f"bs={BLOCK}", f"count={count}",
                    "oflag=direct", "conv=fdatasync"], check=True, capture_output=True)
    write = size / (time.perf_counter() - started)
    started = time.perf_counter()
    subprocess.run(["dd", f"if={target}", "of=/dev/null", f"bs={BLOCK}", "iflag=direct"],
                   check=True, capture_output=True)
    read = size / (time.perf_counter() - started)
    target.unlink()
    return write, read


def shim_rates(scratch: Path, spill_dir: Path, size: int,
               link_gbps: float) -> list[tuple[float, float, float, float]]:
    """(spill, fetch, restore from disk, restore from pinned host memory) rates by the shim's
    clock, one row per round."""
    shim = compile_library(scratch / "shim" / LIBRARY_NAME)
    fake = build_fake_cuda(scratch)
    daemon = ScriptedDaemon(scratch / "bench.sock", features=("position", "memory", "tiers"))
    card = scratch / "card"
    w = Workload(shim, fake, scratch / "cuda.log", {
        "KIWI_SOCKET": str(daemon.path), "KIWI_EVICT": "vmm", "KIWI_SPILL_DIR": str(spill_dir),
        "FAKE_CUDA_DEVICE": str(card), "FAKE_CUDA_TOTAL": str(4 * size),
        "FAKE_CUDA_LINK_GBPS": str(link_gbps)})
    rounds = []
    evictions = 0

    def evict() -> None:
        nonlocal evictions
        w.call("shim.release()")
        daemon.send(op="evict", gpu=0, bytes=size, **{"for": "bench"})
        evictions += 1
        wait_count(daemon, "evicted", evictions)

    def restored(last: int) -> float:
        """The restore the next read's grant makes, bytes/s by the shim's clock (the read
        checks the last byte)."""
        before = w.stats()
        assert w.call(f"d.read({ptr} + {size} - 1, 1) == {bytes([last])!r}", timeout=120)
        after = w.stats()
        return ((after["bytes_restored"] - before["bytes_restored"]) /
                (after["seconds_restoring"] - before["seconds_restoring"]))

    try:
        ptr = w.call(f"d.alloc({size})", timeout=120)
        for round_ in range(ROUNDS):
            assert w.call(f"d.launch_fill({ptr}, {size}, {round_ + 1})", timeout=120) == 0
            wait_count_stat(w, "host_shadow_pinned", size)
            evict()
            from_pinned = restored(round_ + 1)  # the link's floor: pinned host memory -> card
            evict()
            moves: list[dict] = []
            # spill, fetch to host, spill again (the grant below restores from disk)
            for event in ({"op": "spill"}, {"op": "fetch", "tier": "host"}, {"op": "spill"}):
                daemon.send(gpu=0, **event)
                moves.append(wait_count(daemon, "tier_moved", 3 * round_ + len(moves) + 1))
                if moves[-1].get("failed"):
                    raise SystemExit(f"the shim's move failed: {moves[-1]['failed']}")
            spilled, fetched = moves[0], moves[1]
            rounds.append((spilled["moved"] / spilled["seconds"],
                           fetched["moved"] / fetched["seconds"],
                           restored(round_ + 1), from_pinned))
    finally:
        w.close()
        daemon.close()
    return rounds


def wait_count_stat(w: Workload, stat: str, at_least: int, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while w.stats()[stat] < at_least:
        if time.monotonic() > deadline:
            raise SystemExit(f"the shim's {stat} stayed under {at_least} for {timeout:.0f} s")
        time.sleep(0.05)


def wait_count(daemon: ScriptedDaemon, op: str, n: int, timeout: float = 600.0) -> dict:
    deadline = time.monotonic() + timeout
    while len(daemon.messages(op)) < n:
        if time.monotonic() > deadline:
            raise SystemExit(f"no {op} number {n} from the shim in {timeout:.0f} s")
        time.sleep(0.01)
    return daemon.messages(op)[n - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=1024, help="the working set, MiB")
    parser.add_argument("--dir", type=Path, default=Path("/var/tmp/kiwi-spill-bench"),
                        help="the spill directory (local disk)")
    parser.add_argument("--link-gbps", type=float, default=25.0,
                        help="the fake driver's modelled link, GB/s each way")
    args = parser.parse_args()
    size = args.mib * MiB // BLOCK * BLOCK
    args.dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        floor_write, floor_read = dd_floor(args.dir, size)
        rounds = shim_rates(Path(scratch), args.dir, size, args.link_gbps)
    spill = max(r[0] for r in rounds)
    fetch = max(r[1] for r in rounds)
    restore = max(r[2] for r in rounds)
    floor_restore = min(floor_read, max(r[3] for r in rounds))
    print(f"### The disk tier against dd's direct I/O ({utc_now()}, {args.mib} MiB in "
          f"{args.dir}, a link of {args.link_gbps:g} GB/s, {os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.2f})\n")
    print("| way | floor (MB/s): dd, or the link where slower | shim (MB/s, best of 3) | ratio "
          "| target |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| spill (write, synced) | {floor_write / 1e6:.0f} | {spill / 1e6:.0f} | "
          f"{spill / floor_write:.2f} | >= {TARGET} |")
    print(f"| fetch (read, checked) | {floor_read / 1e6:.0f} | {fetch / 1e6:.0f} | "
          f"{fetch / floor_read:.2f} | >= {TARGET} |")
    print(f"| restore from disk to the GPU (read, checked, copied) | {floor_restore / 1e6:.0f} | "
          f"{restore / 1e6:.0f} | {restore / floor_restore:.2f} | >= {TARGET} |")
    print(f"\nThe fake link's copy from pinned memory (a restore from pinned host shadows, best "
          f"of 3): {max(r[3] for r in rounds) / 1e6:.0f} MB/s; dd's direct read: "
          f"{floor_read / 1e6:.0f} MB/s.")
    shutil.rmtree(args.dir / f"uid-{os.geteuid()}", ignore_errors=True)


if __name__ == "__main__":
    main()
