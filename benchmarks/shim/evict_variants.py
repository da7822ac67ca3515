"""Which way out of the GPU is fastest for managed memory:
``python -m benchmarks.shim.evict_variants``.

    python -m benchmarks.shim.evict_variants [--gib 10] [--rounds 2]

The first GPU session measured the shim's eviction (one batch prefetch of managed memory to
the CPU) at 0.06 of a pinned cudaMemcpy, its restore at 0.88. This measures, in a plain process
(ctypes on libcuda.so.1, no shim), one managed buffer evicted and restored by each strategy
worth trying (``STRATEGIES``), each round as GB/s against a pinned cuMemcpy of the same bytes
measured in the same run, with the GPU memory the eviction freed and a check that the bytes
came back. Each strategy runs ``--rounds`` times (the first may pay for host pages a later one
reuses). One Markdown table, printed row by row and flushed, so a timeout keeps what was
measured. Without a GPU it says why in one line and exits 0.
"""

from __future__ import annotations

import argparse
import sys

from benchmarks.shim.evict_driver import Driver
from benchmarks.shim.evict_measure import run
from benchmarks.shim.evict_strategies import STRATEGIES, GiB, emit


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="strategies (for --only):\n" + "\n".join(
            f"  {number:2d}  {strategy.name}" for number, strategy in enumerate(STRATEGIES, 1)))
    parser.add_argument("--gib", type=float, default=10.0, help="the managed buffer, at most")
    parser.add_argument("--rounds", type=int, default=2, help="evictions per strategy")
    parser.add_argument("--only", help="comma-separated strategy numbers (listed below)")
    args = parser.parse_args(argv)
    chosen = list(STRATEGIES)
    if args.only is not None:
        try:
            chosen = [STRATEGIES[int(i) - 1] for i in args.only.split(",") if int(i) >= 1]
        except (ValueError, IndexError):
            parser.error(f"--only takes numbers 1-{len(STRATEGIES)}, comma-separated")
        if not chosen:
            parser.error(f"--only takes numbers 1-{len(STRATEGIES)}, comma-separated")
    try:
        driver = Driver()
    except (OSError, RuntimeError) as exc:  # no libcuda, no device, no usable driver
        emit(f"Skipped: no usable CUDA driver or GPU here ({exc}).")
        return 0
    return run(driver, chosen, int(args.gib * GiB), args.rounds)


if __name__ == "__main__":
    sys.exit(main())
