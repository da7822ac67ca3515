"""Instructions per handoff of each server's whole process, side by side, under callgrind.

    python -m benchmarks.daemon.instructions [--clients 2,8,64,512] [--handoffs 1000]
                                             [--nvshare PATH] [--python-ring]

The handoff benchmark's CPU time per handoff moves with the machine's load; the instructions a
server runs for a handoff do not. Each server (the Kiwi daemon, the C relay-ring floor, given
``--nvshare`` nvshare's scheduler, and with ``--python-ring`` the ring in compiled Python) runs
as in benchmarks/daemon/handoff.py, with the same C harness and N clients all waiting, but under
``valgrind --tool=callgrind``, twice: for H and for 3H handoffs; the difference over 2H is its
instructions per handoff, start-up and set-up cancelled out. The whole process is counted, the
event loop, the writes and the garbage collector included (issue 44: where the daemon's time
per handoff goes); the kernel's work in the system calls is not. ``python -m
benchmarks.daemon.handoff_core --callgrind`` counts the daemon's request path alone,
in-process.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import tempfile
import time
from collections.abc import Sequence

from benchmarks.common import utc_now
from benchmarks.daemon.servers import (
    NAMES,
    add_server_options,
    chosen,
    dialect,
    harness,
    machine_load,
    serving,
)

_SUMMARY = re.compile(rb"^summary:\s+(\d+)", re.MULTILINE)
#: Seconds a server under callgrind may take to answer: the daemon imports for a minute there.
_PATIENCE = 600.0


def instructions(kind: str, n: int, handoffs: int, nvshare: str | None = None) -> int:
    """Instructions the server's whole process ran, start-up included, while ``n`` waiting
    clients handed the GPU round ``handoffs`` times."""
    with tempfile.TemporaryDirectory(prefix="kiwi-bench-", dir="/tmp") as tmp:
        out = os.path.join(tmp, "callgrind.out")
        wrapper = ["valgrind", "-q", "--tool=callgrind", f"--callgrind-out-file={out}"]
        with serving(kind, tmp, nvshare=nvshare, wrapper=wrapper, patience=_PATIENCE) \
                as (_, sock):
            harness(sock, *dialect(kind), "--contenders", str(n), "--handoffs", str(handoffs),
                    "--warmup", "0", "--seconds", "3600", "--setup-seconds", "600",
                    timeout=3600)
        # Stopped and waited for: callgrind has written its count.
        with open(out, "rb") as counted:
            found = _SUMMARY.search(counted.read())
        if found is None:
            raise RuntimeError(f"callgrind wrote no summary for {kind}")
        return int(found[1])


def per_handoff(kind: str, n: int, handoffs: int, nvshare: str | None = None) -> float:
    return (instructions(kind, n, 3 * handoffs, nvshare)
            - instructions(kind, n, handoffs, nvshare)) / (2 * handoffs)


def table(counts: dict[tuple[str, int], float], kinds: Sequence[str],
          sizes: Sequence[int]) -> list[str]:
    others = [k for k in kinds if k != "kiwi"]
    head = ["clients waiting", *(f"{NAMES[k]} instructions per handoff" for k in kinds),
            *(f"Kiwi / {NAMES[k]}" for k in others)]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for n in sizes:
        rows.append("| " + " | ".join([
            str(n), *(f"{counts[(k, n)]:,.0f}" for k in kinds),
            *(f"{counts[('kiwi', n)] / counts[(k, n)]:.2f}x" for k in others)]) + " |")
    return rows


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", default="2,8,64,512")
    parser.add_argument("--handoffs", type=int, default=1000,
                        help="H: each server runs H and 3H handoffs")
    add_server_options(parser)
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None:
        raise SystemExit("benchmarks.daemon.instructions needs valgrind")
    sizes = [int(n) for n in args.clients.split(",")]
    kinds = chosen(args)
    started = time.monotonic()
    counts = {(kind, n): per_handoff(kind, n, args.handoffs, args.nvshare)
              for n in sizes for kind in kinds}
    text = "\n".join([
        f"## Instructions per handoff, whole process ({utc_now()})", "",
        f"Each server under callgrind with the C harness, every client waiting, counted from "
        f"{args.handoffs:,} and {3 * args.handoffs:,} handoffs; user space only (the system "
        f"calls' work in the kernel is not counted). {machine_load()} (instructions do not "
        f"move with it); {time.monotonic() - started:.0f} s.", "",
        *table(counts, kinds, sizes)])
    print(text)
    return text


if __name__ == "__main__":
    main()
