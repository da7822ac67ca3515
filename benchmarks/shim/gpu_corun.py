"""Side by side on one GPU: how much work processes get done together, against one alone.

    python -m benchmarks.shim.gpu_corun [--seconds 5] [--most 3]

Mode auto runs holders side by side while their memory fits. Without MPS the GPU time-slices
between processes, so k compute-bound processes each get about 1/k of it; the question is how
much the switches between them cost, and how much better cells that do not fill the GPU do.
The fleet benchmark models this with one figure, ``Workload.co_run``: the GPU work k holders
side by side get done together per second, as a fraction of what one alone gets done (its
twenty-seed figures for mode auto move a lot between 1.0 and 0.8, docs/policy.md). This
measures it, for two kinds of cell:

* ``large``: 8192 x 8192 half-precision matrix products, which fill the GPU;
* ``small``: 512 x 512 single-precision products, launch-bound, the quick cell of a notebook.

Each process warms up (CUDA context, cuBLAS, the first products), then all start together and
count products for ``--seconds``. The figure for k processes is the sum of their rates over the
rate of one process alone, measured in the same run (the floor). Each process holds a few
hundred MiB at most: nothing near the card's memory.

Then the mix mode auto is really about: one ``large`` and one ``small`` side by side, a short
cell beside a training run. Each one's rate against its own kind alone says what each pays for
the other's company (the fleet gives both ``co_run / 2``; which is nearer is the question).

Last, the same pairs taking turns through Kiwi instead: each process under the shim, a daemon
in mode auto under ``interactive`` with ``turns`` of a second or a quarter of one
(nodeside/scheduler/taking_turns.py), their memory small enough to stay where it is. The GPU
then runs one process at a time and switches at every turn (a ``pause`` to one, a ``resume`` to
the other), not every few milliseconds as the driver does, and nothing moves at a switch.
Whether that loses less than the driver's own time-slicing is what the fleet's figures for
``interactive.turns`` assume (docs/policy.md, "Taking turns"): the table gives it as work
together against one alone, and the cost of a switch that this implies.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import NamedTuple

from benchmarks.common import REPO, running_daemon

#: The turns (seconds, ``interactive.turns``) the pairs take through Kiwi.
TURNS = (1.0, 0.25)

#: (matrix side, dtype name, products per synchronize) per kind of cell.
KINDS = {"large": (8192, "float16", 4), "small": (512, "float32", 64)}


def _products(kind: str, seconds: float, ready: multiprocessing.SimpleQueue, go: Event,
              results: multiprocessing.SimpleQueue) -> None:
    import torch

    side, dtype, batch = KINDS[kind]
    a = torch.randn(side, side, device="cuda", dtype=getattr(torch, dtype))
    b = torch.randn(side, side, device="cuda", dtype=getattr(torch, dtype))
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    ready.put(True)
    go.wait()
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for _ in range(batch):
            a @ b
        torch.cuda.synchronize()  # count only what the GPU finished
        done += batch
    rate = done / (time.perf_counter() - started)
    from kiwi_jupyter.shim import Shim

    shim = Shim.attach()  # under Kiwi: the turns it took, and whether its memory ever moved
    stats = shim.stats() if shim is not None else {}
    results.put(Worked(rate, stats.get("pauses", 0), stats.get("evictions", 0)))


class Worked(NamedTuple):
    rate: float  # products per second
    pauses: int  # under Kiwi: the times it was paused for the other's turn (0 without it)
    evictions: int  # under Kiwi: the times its memory was moved out


def rates(kinds: Sequence[str], seconds: float) -> list[float]:
    """Products per second of one process per kind in ``kinds``, started together, side by
    side; in the order of ``kinds``."""
    return [w.rate for w in work(kinds, seconds)]


def work(kinds: Sequence[str], seconds: float) -> list[Worked]:
    """What one process per kind in ``kinds`` did, started together; in the order of
    ``kinds``. Processes started in ``environment`` inherit it."""
    ctx = multiprocessing.get_context("spawn")  # CUDA does not survive a fork
    ready, go = ctx.SimpleQueue(), ctx.Event()
    results = [ctx.SimpleQueue() for _ in kinds]  # one each: the order must be kept
    workers = [ctx.Process(target=_products, args=(kind, seconds, ready, go, result))
               for kind, result in zip(kinds, results, strict=True)]
    for worker in workers:
        worker.start()
    for _ in workers:
        ready.get()
    go.set()
    out = [result.get() for result in results]
    for worker in workers:
        worker.join()
    return out


@contextlib.contextmanager
def environment(changes: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` with ``changes`` while the block runs: a spawned process starts with the
    parent's environment as it is then (this process, already started, is not preloaded)."""
    saved = {key: os.environ.get(key) for key in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def kiwi_environment(shim: str, socket: str) -> dict[str, str]:
    """What a process needs to take its turns through the daemon on ``socket``: the shim
    preloaded, no release of its own when idle (the processes wait for each other to warm up),
    and the checkpoint evictor, which leaves memory as it is (the pairs always fit)."""
    return {"LD_PRELOAD": shim, "KIWI_SOCKET": socket, "KIWI_IDLE_RELEASE": "0",
            "KIWI_EVICT": "checkpoint", "PYTHONPATH": str(REPO)}


def turns_config(turn: float) -> str:
    """The daemon's config for taking turns of ``turn`` seconds: mode auto, ``interactive``,
    and a first quantum of a TQ so that neither process steps aside (aside.py) for the other
    while it warms up: they only take turns."""
    return (f"mode: auto\npolicy: interactive\ninteractive:\n  turns: {turn:g}\n"
            "  first_quantum: 30\n")


def work_in_turns(kinds: Sequence[str], seconds: float, turn: float) -> list[Worked]:
    """As ``rates``, each process under the shim, taking turns of ``turn`` seconds through a
    daemon in mode auto (a logical GPU of 64 GiB, which both pairs' memory fits). The count
    runs at least ten turns."""
    from kiwi_jupyter.shim import library_path

    with tempfile.TemporaryDirectory(prefix="kiwi-", dir="/tmp") as directory:
        config = Path(directory) / "kiwi.yaml"
        config.write_text(turns_config(turn))
        with (running_daemon(directory, "--gpus", "1", "--gpu-memory", "64GiB", "--tq", "30",
                             "--config", str(config)) as socket,
              environment(kiwi_environment(str(library_path()), socket))):
            return work(kinds, max(seconds, 10 * turn * len(kinds)))


def efficiency(alone: float, together: list[float]) -> float:
    """The work processes side by side get done together, as a fraction of one alone's."""
    return sum(together) / alone


def table(measured: dict[str, dict[int, list[float]]]) -> str:
    """Markdown: for each kind, each process count's rates and its efficiency."""
    rows = ["| cell | processes | products/s each | together / one alone (`co_run`) |",
            "| --- | --- | --- | --- |"]
    for kind, by_count in measured.items():
        alone = by_count[1][0]
        for count, each in sorted(by_count.items()):
            side, dtype, _ = KINDS[kind]
            rows.append(f"| {kind} ({side}x{side} {dtype}) | {count} | "
                        f"{', '.join(f'{r:.1f}' for r in each)} | "
                        f"{efficiency(alone, each):.3f} |")
    return "\n".join(rows)


def mix_table(alone: dict[str, float], together: dict[str, float]) -> str:
    """Markdown: each kind's rate beside the other against its rate alone."""
    rows = ["| side by side | cell | products/s alone | beside the other | speed kept |",
            "| --- | --- | --- | --- | --- |"]
    for kind in together:
        rows.append(f"| {' + '.join(together)} | {kind} | {alone[kind]:.1f} | "
                    f"{together[kind]:.1f} | {together[kind] / alone[kind]:.3f} |")
    return "\n".join(rows)


def turns_table(alone: dict[str, float], turns: dict[float, dict[str, list[Worked]]],
                shared: dict[str, float]) -> str:
    """Markdown: for each turn and kind, two processes' rates taking turns through Kiwi, the
    pauses (switches) and the times their memory moved, their work together against one
    alone, the same pair side by side (``shared``) for comparison, and what one switch cost
    the GPU: the work lost over the switches made (``switch_cost``)."""
    rows = ["| two processes taking turns through Kiwi | turn (s) | products/s each | switches | "
            "memory moved out | together / one alone | side by side, for comparison | "
            "GPU time lost a switch (ms) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for turn, by_kind in turns.items():
        for kind, each in by_kind.items():
            rate = [w.rate for w in each]
            together = efficiency(alone[kind], rate)
            rows.append(f"| {kind} | {turn:g} | {', '.join(f'{r:.1f}' for r in rate)} | "
                        f"{sum(w.pauses for w in each)} | {sum(w.evictions for w in each)} | "
                        f"{together:.3f} | {shared[kind]:.3f} | "
                        f"{switch_cost(together, turn) * 1e3:.2f} |")
    return "\n".join(rows)


def switch_cost(together: float, turn: float) -> float:
    """Seconds of GPU work one switch loses, when turns of ``turn`` seconds get ``together`` of
    one process's work done: the fleet's ``turns`` charges each switch this much."""
    return max(0.0, (1.0 - together) * turn)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="each measurement")
    parser.add_argument("--most", type=int, default=3, help="processes side by side, at most")
    parser.add_argument("--no-turns", dest="turns", action="store_false",
                        help="leave out the pairs taking turns through Kiwi")
    args = parser.parse_args(argv)
    measured = {kind: {k: rates([kind] * k, args.seconds) for k in range(1, args.most + 1)}
                for kind in KINDS}
    print(table(measured), flush=True)
    pair = list(KINDS)
    mixed = dict(zip(pair, rates(pair, args.seconds), strict=True))
    print()
    alone = {kind: measured[kind][1][0] for kind in pair}
    print(mix_table(alone, mixed), flush=True)
    if args.turns and args.most >= 2:
        turns = {tq: {kind: work_in_turns([kind] * 2, args.seconds, tq) for kind in KINDS}
                 for tq in TURNS}
        shared = {kind: efficiency(alone[kind], measured[kind][2]) for kind in KINDS}
        print()
        print(turns_table(alone, turns, shared))
    return 0


if __name__ == "__main__":
    sys.exit(main())
