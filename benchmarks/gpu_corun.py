"""Side by side on one GPU: how much work processes get done together, against one alone.

    python -m benchmarks.gpu_corun [--seconds 5] [--most 3]

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
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from collections.abc import Sequence
from multiprocessing.synchronize import Event

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
    results.put(done / (time.perf_counter() - started))


def rates(kinds: Sequence[str], seconds: float) -> list[float]:
    """Products per second of one process per kind in ``kinds``, started together, side by
    side; in the order of ``kinds``."""
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="each measurement")
    parser.add_argument("--most", type=int, default=3, help="processes side by side, at most")
    args = parser.parse_args(argv)
    measured = {kind: {k: rates([kind] * k, args.seconds) for k in range(1, args.most + 1)}
                for kind in KINDS}
    print(table(measured), flush=True)
    pair = list(KINDS)
    mixed = dict(zip(pair, rates(pair, args.seconds), strict=True))
    print()
    print(mix_table({kind: measured[kind][1][0] for kind in pair}, mixed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
