"""Restore on intent on the fake driver's modelled link, without a GPU (issue 42, Measured):
``python -m benchmarks.shim.restore_on_intent [--gib 1] [--link-gbps 0.25] [--lead SECONDS]``.

A kernel's memory is in host memory (evicted for another kernel, which has left: the card has
room for it again). A cell is sent to it. Between the cell's execute request, which the Jupyter
server sees, and its first GPU call, the kernel does the cell's own work first (``--lead``
seconds: imports, reading data; by default as long as the restore takes at the floor's rate).
Measured: the first GPU call's stall, from asking to its return, in two ways, alternating:

- **without the hint**: the restore starts at the first GPU call, as before issue 42;
- **with the hint**: at the execute request the server's ``intent`` (reason ``execute``) is sent,
  as kiwi_jupyter/server/intents.py sends it (one ControlClient request: the same message on the
  same kind of connection), and the daemon asks the kernel to ``fetch`` its memory to the GPU,
  which it does while the cell does its own work.

Target: the hint hides at least half of the restore, i.e. the stall with it is at most half the
stall without it. The floor (the fake link's own pinned host-to-device cuMemcpy of the working
set, in the same run, without the shim) gives the restore's least time.

Needs the daemon's ``intent`` handling (tiers-core) and the shim's ``fetch`` ``gpu`` (tiers-shim):
where the daemon refuses ``intent`` the run says so and stops, without figures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass

from benchmarks.shim.evictors import Worker, build_fake
from benchmarks.shim.modelled_link import GiB, MiB, daemon, evicted, fake_env, filled, floor, say
from nodeside import protocol as p
from nodeside.client import ControlClient
from nodeside.client.common import KiwiError

ROUNDS = 3
TARGET_HIDDEN = 0.5
NAME = "intent-kernel"


@dataclass
class Stall:
    hinted: bool
    #: The first GPU call, from asking to its return.
    seconds: float
    #: From the cell's execute request to the first GPU call's return.
    from_execute: float


def evict_for_a_passer_by(socket: str, shim: str, extra: dict[str, str], round_: int,
                          kernel: Worker) -> None:
    """Another kernel takes the card (the daemon is told the two do not fit: the kernel is
    evicted), then leaves: the card has room for the kernel again, its memory in host memory."""
    passer = Worker(socket, shim, "vmm", f"passer-by-{round_}", "off", extra)
    try:
        passer("cell_begin")
        passer("small", bytes=2 * MiB)
        passer("touch")  # its first work: the kernel is asked to evict for it
        evicted(kernel)
        passer("release")
    finally:
        passer.close()


def stall(kernel: Worker, control: ControlClient, hinted: bool, lead: float) -> Stall:
    executed = time.monotonic()  # the execute request the server sees
    if hinted:
        control.request(p.INTENT, name=NAME, reason="execute")
    time.sleep(max(0.0, executed + lead - time.monotonic()))  # the cell's own work first
    kernel("cell_begin")
    seconds = kernel("poke")
    returned = time.monotonic()
    kernel("release")
    return Stall(hinted, float(seconds), returned - executed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shim.restore_on_intent",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=1.0, help="the kernel's working set, GiB")
    parser.add_argument("--link-gbps", type=float, default=0.25,
                        help="the modelled link, each way, GB/s (pinned memory)")
    parser.add_argument("--pin-gbps", type=float, default=2.0,
                        help="how fast the modelled driver pins host memory, GB/s")
    parser.add_argument("--lead", type=float, default=None,
                        help="seconds of the cell's own work before its first GPU call "
                             "(default: the restore's time at the floor's rate)")
    args = parser.parse_args(argv)
    nbytes = int(args.gib * GiB) // (2 * MiB) * (2 * MiB)
    from kiwi_jupyter.shim import library_path

    shim = str(library_path())
    say("## Restore on intent on the fake driver's modelled link", "")
    with tempfile.TemporaryDirectory(prefix="kiwi-intent-", dir="/tmp") as directory:
        if build_fake(directory) is None:
            say("Skipped: tests/shim/fake_cuda.c is not here, or did not build.")
            return 0
        rate = floor(directory, nbytes, args.link_gbps)["to_device"]
        restore = nbytes / rate
        lead = restore if args.lead is None else args.lead
        say(f"{time.strftime('%Y-%m-%d')}: working set {nbytes / GiB:.2f} GiB, link "
            f"{args.link_gbps:g} GB/s each way; the floor, the fake link's own pinned "
            f"host-to-device cuMemcpy: {rate / 1e9:.2f} GB/s, {restore:.2f} s for the set; the "
            f"cell's own work before its first GPU call: {lead:.2f} s.", "")
        extra = fake_env(directory, args.link_gbps, args.pin_gbps, nbytes)
        with daemon(directory, nbytes + MiB, overlap=False) as socket, \
                ControlClient(socket) as control:
            kernel = filled(socket, shim, NAME, nbytes, extra)
            try:
                try:
                    control.request(p.INTENT, name=NAME, reason="execute")
                except KiwiError as exc:
                    say(f"Not run: the daemon refuses `intent` ({exc}); this needs the daemon's "
                        "intent handling and the shim's `fetch` to the GPU (issue 42).")
                    return 1
                stalls = []
                for round_ in range(2 * ROUNDS):
                    evict_for_a_passer_by(socket, shim, extra, round_, kernel)
                    stalls.append(stall(kernel, control, round_ % 2 == 1, lead))
                intact = kernel("check")["intact"]
            finally:
                kernel.close()
    without = statistics.median(s.seconds for s in stalls if not s.hinted)
    hinted = statistics.median(s.seconds for s in stalls if s.hinted)
    plain_span = statistics.median(s.from_execute for s in stalls if not s.hinted)
    hinted_span = statistics.median(s.from_execute for s in stalls if s.hinted)
    hidden = (1 - hinted / without if without > 0 else 0.0) + 0.0  # no "-0%"
    say("| round | hint | execute request to the first GPU call's return (s) | the call's stall "
        "(s) |", "| --- | --- | --- | --- |")
    for i, s in enumerate(stalls, 1):
        say(f"| {i} | {'yes' if s.hinted else 'no'} | {s.from_execute:.3f} | {s.seconds:.3f} |")
    ok = intact and hidden >= TARGET_HIDDEN
    say("", f"The median stall without the hint {without:.3f} s ({without / restore:.2f} x the "
        f"floor's restore), with it {hinted:.3f} s: the hint hides {hidden:.0%} of it (target: "
        f"at least {TARGET_HIDDEN:.0%}); from the execute request to the first GPU call's "
        f"return, the median {plain_span:.3f} s without the hint and {hinted_span:.3f} s with "
        f"it (the "
        f"cell's own work first: {lead:.2f} s); contents "
        f"{'intact' if intact else '**NOT intact**'}.",
        "", f"**Verdict: {'PASS' if ok else 'FAIL'}**")
    return 0


if __name__ == "__main__":
    sys.exit(main())
