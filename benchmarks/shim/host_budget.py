"""Kernels that take turns on a card with room for one, within a host budget, over the fake
driver: ``python -m benchmarks.shim.host_budget [--kernels 8] [--mib 64] [--budget 3]
[--rounds 3]``.

The real daemon, told its card has room for one working set (``--gpu-memory``), with
``host_budget`` ``--budget`` working sets and ``spill_after: 0`` (only a short budget
spills); ``--kernels`` shimmed processes under the vmm evictor (benchmarks/shim/evictors_worker.py,
the driver API through ctypes), each spilling to a directory on this machine's disk
(``KIWI_SPILL_DIR``). Each fills its working set with its own pattern, then they take turns,
round after round: a turn is one cell that checks the whole working set (it waits for the
grant, and for the restore from host memory or from disk) and changes it for the next check.

The daemon's status document is read after every change it tells of (hello feature
``changes``): the node's host use as the daemon counts it (each client's host copy, or its
pinned memory where more: nodeside/scheduler/tiers.py) at its peak against the budget, and the
spills and reads back seen (a client's ``disk_bytes`` rising from 0, falling to 0).

Verdict: every turn found its working set intact, and the peak host use stayed within the
budget. The round's time is set against a floor measured in the same run: one kernel alone on
the card doing the same cells, nothing moving (a round of N kernels against N such turns).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from benchmarks.shim.evictors import Worker, build_fake
from benchmarks.shim.modelled_link import MiB, daemon, fake_env, filled, say

#: The modelled link is fast here: what this measures is the tiers' bookkeeping, not the link.
LINK_GBPS = 4.0
PIN_GBPS = 8.0


@dataclass
class HostWatch:
    """The daemon's status after each change it tells of: the peak host use, spills, reads."""

    path: str
    budget: int = 0
    peak: int = 0
    #: Of it, the host copies alone (pinned or pageable), at their own peak.
    copies: int = 0
    documents: int = 0
    spills: int = 0
    reads: int = 0
    on_disk: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(self.path)
        self._lines = self._sock.makefile("rb")
        self._sock.sendall(b'{"op":"hello","version":1,"features":["changes"]}\n')
        self._lines.readline()
        self._read(self._ask())  # the first figures before anything moves
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _ask(self) -> dict[str, Any]:
        self._sock.sendall(b'{"op":"status","seq":1}\n')
        while True:
            message = json.loads(self._lines.readline())
            if message["op"] == "status":
                return dict(message["status"])

    def _run(self) -> None:
        while not self._stop.is_set():
            line = self._lines.readline()
            if not line:
                return
            if json.loads(line)["op"] == "changed":
                self._read(self._ask())

    def _read(self, document: dict[str, Any]) -> None:
        self.documents += 1
        gpu = document["gpus"][0]
        self.budget = gpu.get("host_budget") or self.budget  # None once every kernel left
        used = copies = 0
        for client in document["clients"]:
            used += max(client["host_bytes"], client.get("pinned_bytes") or 0)
            copies += client["host_bytes"]
            disk = client.get("disk_bytes") or 0
            before = self.on_disk.get(client["id"], 0)
            self.spills += disk > 0 and before == 0
            self.reads += disk == 0 and before > 0
            self.on_disk[client["id"]] = disk
            if client.get("tier_failed"):
                self.failures.append(f"{client['name']}: {client['tier_failed']}")
        self.peak = max(self.peak, used)
        self.copies = max(self.copies, copies)

    def close(self) -> None:
        self._stop.set()
        self._sock.sendall(b'{"op":"ping","seq":2}\n')  # wakes the reader to see the stop
        self._thread.join(10)
        self._sock.close()


def turn(kernel: Worker, round_: int) -> tuple[float, bool]:
    """One cell: the whole working set checked (after the grant and the restore), then
    changed for the next check; its seconds, and whether the check found it intact."""
    started = time.monotonic()
    kernel("cell_begin")
    intact = bool(kernel("check")["intact"])
    kernel("change", round=round_)
    kernel("release")
    return time.monotonic() - started, intact


def floor(directory: str, shim: str, nbytes: int, rounds: int) -> float:
    """One kernel alone on a card with room for it, nothing moving: its median turn."""
    extra = {**fake_env(directory, LINK_GBPS, PIN_GBPS, nbytes), "KIWI_SPILL_DIR": directory}
    with daemon(directory, 2 * nbytes, overlap=False, more="spill_after: 0\n") as path:
        kernel = filled(path, shim, "alone", nbytes, extra)
        try:
            return statistics.median(turn(kernel, r)[0] for r in range(1, 2 * rounds + 1))
        finally:
            kernel.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shim.host_budget",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--kernels", type=int, default=8)
    parser.add_argument("--mib", type=int, default=64, help="each kernel's working set, MiB")
    parser.add_argument("--budget", type=float, default=3.0,
                        help="the node's host budget, in working sets")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kernel-pin-budget", type=float, default=0.25,
                        help="each kernel's own pin budget (KIWI_VMM_PIN_BUDGET), in working "
                             "sets: its staging ring is a quarter of it (none under 8 MiB a "
                             "ring), at most 64 MiB")
    args = parser.parse_args(argv)
    nbytes = args.mib * MiB
    budget = int(args.budget * nbytes)
    from kiwi_jupyter.shim import library_path

    shim = str(library_path())
    say("## Kernels taking turns within a host budget, over the fake driver", "")
    with tempfile.TemporaryDirectory(prefix="kiwi-budget-", dir="/var/tmp") as directory:
        if build_fake(directory) is None:
            say("Skipped: tests/shim/fake_cuda.c is not here, or did not build.")
            return 0
        alone = floor(directory, shim, nbytes, args.rounds)
        say(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {args.kernels} kernels of "
            f"{args.mib} MiB, room on the card for one, host budget {args.budget:g} working "
            f"sets ({budget // MiB} MiB), each kernel's own pin budget "
            f"{args.kernel_pin_budget:g} working sets, spill directory on {directory}'s disk; "
            f"the floor, one kernel's turn alone with nothing moving: {alone * 1000:.0f} ms.", "")
        extra = {**fake_env(directory, LINK_GBPS, PIN_GBPS, nbytes), "KIWI_SPILL_DIR": directory,
                 "KIWI_VMM_PIN_BUDGET": str(int(args.kernel_pin_budget * nbytes))}
        config = f"host_budget: {budget}\nspill_after: 0\n"
        kernels: list[Worker] = []
        rounds: list[float] = []
        broken: list[str] = []
        with daemon(directory, nbytes + nbytes // 2, overlap=False, more=config) as path:
            watch = HostWatch(path)
            try:
                for i in range(args.kernels):  # each fills while the last is evicted for it
                    kernels.append(filled(path, shim, f"kernel-{i}", nbytes, extra,
                                          pinned_ahead=False))
                for round_ in range(1, args.rounds + 1):
                    started = time.monotonic()
                    for i, kernel in enumerate(kernels):
                        _, intact = turn(kernel, round_)
                        if not intact:
                            broken.append(f"kernel-{i} in round {round_}")
                    rounds.append(time.monotonic() - started)
            finally:
                for kernel in kernels:
                    kernel.close()
                watch.close()
    median = statistics.median(rounds)
    say("| round | seconds | vs the floor's turns |", "| --- | --- | --- |")
    for i, seconds in enumerate(rounds, 1):
        say(f"| {i} | {seconds:.2f} | {seconds / (alone * args.kernels):.1f} |")
    within = watch.peak <= budget
    ok = not broken and within and not watch.failures
    say("", f"Peak host use {watch.peak / MiB:.0f} MiB against the budget {budget / MiB:.0f} MiB "
        f"({watch.peak / budget:.2f} of it; the host copies alone at most "
        f"{watch.copies / MiB:.0f} MiB; the daemon's budget: {watch.budget / MiB:.0f} MiB), "
        f"over {watch.documents} status documents; spills seen "
        f"{watch.spills}, reads back {watch.reads}; contents "
        f"{'intact every turn' if not broken else 'NOT intact: ' + ', '.join(broken)}"
        f"{'; failed moves: ' + '; '.join(watch.failures) if watch.failures else ''}. The "
        f"median round {median:.2f} s, {median / (alone * args.kernels):.1f} x {args.kernels} "
        "turns alone.", "", f"**Verdict: {'PASS' if ok else 'FAIL'}** (contents intact every "
        "turn, host use never above the budget)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
