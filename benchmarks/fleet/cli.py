"""A notebook fleet replayed through the real scheduler core, in simulated time.

    python -m benchmarks.fleet [--notebooks 20] [--gpus 2] [--hours 8] [--seed 1] [--plot]
                               [--explain] [--oracle] [--hints] [--turns] [--overlap]
                               [--link gen5]
    python -m benchmarks.fleet --seeds 1-20 [--jobs N] [--oracle] [--hints] [--turns]
                               [--overlap] [--link gen5]
    python -m benchmarks.fleet --tiers [--host-gib 256] [--gpus 8] [--gpu-gib 80]
                               [--per-gpu 6,8,10] [--seeds 1-2] [--hours 2] [--jobs N]

``--oracle`` adds a clairvoyant reference, a policy that knows each cell's length
(``oracle``): how far any real policy could get under the same rules. ``--hints`` adds
the same reference told estimates from length hints of stated quality (``hints``): what
a hint from the kernel could buy. ``--turns`` adds the run of holders taking turns (mode auto,
``interactive.turns``) at several costs of a switch (``turns``). ``--overlap`` adds beside each
run that moves memory its twin with each handoff's way out and way in overlapped, as a chunked
evictor would run them, and the table of what that gains (``memory``); ``--link`` puts every
run that moves memory on one host link. ``--tiers`` instead sweeps notebooks per GPU on a node
whose host RAM is a budget, with and without the disk tier (``tier_sweep``, ``tiers``).

What a run replays and reports is ``runs``'s; ``--seeds`` is ``seeds``'s.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.common import REPO
from benchmarks.fleet.hints import HINT_RUNS
from benchmarks.fleet.memory import OVERLAPPED, gains, on_link, twins_only, with_twins
from benchmarks.fleet.report import explain_table, side_by_side
from benchmarks.fleet.runs import ORACLE_RUNS, RUNS, run
from benchmarks.fleet.seeds import parse_seeds, replay_pure, replay_seeds, summary
from benchmarks.fleet.tier_sweep import Node, sweep, table
from benchmarks.fleet.tiers import NVME_READ, NVME_WRITE, SPILL_AFTER
from benchmarks.fleet.turns import TURN_RUNS
from benchmarks.fleet.workload import GPU_MEMORY


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"a fraction in (0, 1], not {text}")
    return value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fleet",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--notebooks", type=int, default=20)
    parser.add_argument("--gpus", type=int, help="GPUs replayed (default 2; with --tiers 8)")
    parser.add_argument("--hours", type=float, help="simulated hours (default 8; with "
                        "--tiers 2)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the figures here (with "
                        "--seeds: each run's, seed by seed)")
    parser.add_argument("--plot", action="store_true",
                        help="draw docs/timeline.png and the fleet timelines into docs/")
    parser.add_argument("--explain", action="store_true",
                        help="also break short cells' waiting down by cause, run by run")
    parser.add_argument("--seeds", type=parse_seeds, metavar="1-20",
                        help="instead: the key runs over these seeds, as means and ranges")
    parser.add_argument("--jobs", type=int, help="processes for --seeds, --oracle and "
                        "--hints (default: CPUs)")
    parser.add_argument("--oracle", action="store_true",
                        help="also the clairvoyant reference and its variant (ORACLE_RUNS, "
                             "oracle): a policy told each cell's length")
    parser.add_argument("--hints", action="store_true",
                        help="also that reference told estimates from length hints of falling "
                             "quality (HINT_RUNS, hints)")
    parser.add_argument("--turns", action="store_true",
                        help="also the run taking turns with a switch costing 10, 50 and 200 "
                             "ms (TURN_RUNS, turns)")
    parser.add_argument("--overlap", action="store_true",
                        help="also each run that moves memory with its handoffs' way out and "
                             "way in overlapped (a chunked evictor: max(out, in) and a chunk, "
                             "not out + in), and what that gains (memory)")
    parser.add_argument("--link", choices=("gen4", "gen5"),
                        help="the host link of every run that moves memory (default: each "
                             "run's own, gen4 but for the Gen5 columns; gen5 is 55 GB/s, the "
                             "pinned copy measured on the H100 and H200)")
    parser.add_argument("--co-run", type=_fraction, default=1.0, metavar="FRACTION",
                        help="the GPU's work holders side by side get done together, as "
                             "benchmarks.shim.gpu_corun measures it (default 1.0: sharing is free)")
    tiers = parser.add_argument_group("host budget and disk tier (--tiers)")
    tiers.add_argument("--tiers", action="store_true",
                       help="instead: notebooks per GPU carried at the interactive targets, "
                            "host RAM only against host + disk (tier_sweep)")
    tiers.add_argument("--host-gib", type=float, default=256.0,
                       help="host RAM the GPUs share (the daemon's default budget of it)")
    tiers.add_argument("--gpu-gib", type=float, default=80.0, help="each GPU's memory")
    tiers.add_argument("--per-gpu", type=parse_seeds, default=[6, 8, 10, 12, 14, 16],
                       metavar="6,8,10", help="the notebooks per GPU swept")
    tiers.add_argument("--nvme-read", type=float, default=NVME_READ / 1e9, metavar="GB/s")
    tiers.add_argument("--nvme-write", type=float, default=NVME_WRITE / 1e9, metavar="GB/s")
    tiers.add_argument("--spill-after", type=float, default=SPILL_AFTER, metavar="SECONDS")
    args = parser.parse_args(argv)
    if args.tiers:
        node = Node(args.gpus or 8, args.gpu_gib, args.host_gib, args.link or "gen5",
                    args.nvme_read * 1e9, args.nvme_write * 1e9, args.spill_after)
        hours = args.hours or 2.0
        swept = sweep(node, args.per_gpu, args.seeds or [args.seed], hours, args.jobs)
        print(table(node, swept, hours))
        if args.json:
            args.json.write_text(json.dumps(swept, indent=2))
        return
    args.gpus, args.hours = args.gpus or 2, args.hours or 8.0
    pure = [*(ORACLE_RUNS if args.oracle else ()), *(HINT_RUNS if args.hints else ())]
    if args.co_run != 1.0:
        print(f"Holders side by side get {args.co_run:g} of the GPU's work done together "
              "(--co-run).\n")
    if args.link:
        print(f"Every run that moves memory does so over the host link {args.link} "
              "(--link).\n")
    if args.seeds:
        by_seed = replay_seeds(args.seeds, args.notebooks, args.gpus, args.hours, args.jobs,
                               pure=pure, co_run=args.co_run,
                               more=[r[0] for r in TURN_RUNS] if args.turns else (),
                               overlap=args.overlap, link=args.link)
        print(summary({k: v for k, v in by_seed.items() if not k.endswith(OVERLAPPED)}))
        if args.overlap:
            print("\nThe same runs with each handoff's way out and way in overlapped:\n")
            print(summary(twins_only(by_seed)))
            print()
            print(gains(by_seed))
        if args.json:
            args.json.write_text(json.dumps(by_seed, indent=2))
        return
    results = []
    rows = [on_link(row, args.link) for row in (*RUNS, *(TURN_RUNS if args.turns else ()))]
    for label, mode, tq, policy, link in with_twins(rows) if args.overlap else rows:
        result = run(args.notebooks, args.gpus, args.hours, args.seed, mode, GPU_MEMORY, tq,
                     policy, link, explain=args.explain, co_run=args.co_run)
        result["label"] = label
        results.append(result)
    if pure:  # on the pure Python core, in processes of their own; never explained
        references = replay_pure([args.seed], pure, args.notebooks, args.gpus, args.hours,
                                 args.jobs, co_run=args.co_run, link=args.link)
        for label, figures in references.items():
            results.append({**figures[args.seed], "label": label})
    print(side_by_side(results))
    if args.overlap:
        print()
        print(gains({r["label"]: {args.seed: r} for r in results}))
    if args.explain:
        print()
        print(explain_table(results))
    if args.json:
        args.json.write_text(json.dumps([{k: v for k, v in r.items() if not k.startswith("_")}
                                         for r in results], indent=2))
    if args.plot:
        from benchmarks.fleet.timeline import draw_fleet, draw_seed_example

        docs = REPO / "docs"
        draw_seed_example(docs / "timeline.png")
        by_label = {r["label"]: r for r in results}
        for label, name in (("round robin, TQ 30 s", "fleet-timeline.png"),
                            ("interactive, TQ 10 s", "fleet-timeline-interactive.png"),
                            ("auto, interactive, TQ 30 s, 1 s turns", "fleet-timeline-turns.png")):
            # The same quarter hour of GPU 0 in both.
            draw_fleet(by_label[label]["_replay"], docs / name, title=label, gpu=0,
                       start=3600.0, end=3600.0 + 900.0)
        print(f"wrote timeline.png, fleet-timeline.png, fleet-timeline-interactive.png and "
              f"fleet-timeline-turns.png into {docs}")

