"""The fleet over many seeds: the figures issue 16 judges, as a mean and a range over seeds.

    python -m benchmarks.fleet --seeds 1-20 [--jobs N]

One seed's figures move a lot with any small change of the rules (a 0.1 s change of the light
request's quantum moves LOW notebooks' short cells by a third on a ten-seed mean): the fleet is
a closed loop, and one cell served a moment earlier changes every later arrival. So a rule is
judged on many seeds, never on one. Each run of ``KEY_RUNS`` replays every seed; a table gives
each figure's mean over the seeds and its range, and counts the seeds that meet the issue's
target (short cells' mean slowdown at most 2x, long cells within 10% of round robin TQ 30 s).
Seeds run in parallel processes (the replays are independent and single-threaded). With
``--oracle`` the clairvoyant reference and its variant (``runs.ORACLE_RUNS``), and with
``--hints`` the reference on hinted estimates (``hints.HINT_RUNS``), follow in pure Python
processes (``oracle``), as columns of the same table; with ``--turns`` the run taking
turns at dearer switches (``turns.TURN_RUNS``), on the compiled core like the key runs. With
``--overlap`` each run that moves memory also replays with its handoffs overlapped
(``memory``), and ``--link`` puts them all on one host link.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor

from benchmarks.fleet.hints import HINT_RUNS
from benchmarks.fleet.memory import find, on_link, overlapped
from benchmarks.fleet.oracle import pure_workers
from benchmarks.fleet.runs import ORACLE_RUNS, RUNS, run
from benchmarks.fleet.turns import TURN_RUNS
from benchmarks.fleet.workload import GPU_MEMORY

#: The runs compared over seeds, by their label in ``runs.RUNS``; the first is the base that
#: long cells are measured against.
KEY_RUNS = ("round robin, TQ 30 s", "round robin, TQ 5 s", "interactive, TQ 30 s",
            "interactive, TQ 10 s", "auto, TQ 30 s", "auto, interactive, TQ 30 s",
            "auto, interactive, TQ 30 s, 1 s turns")
#: Issue 16's target: short cells' mean slowdown at most this, ...
TARGET_SHORT = 2.0
#: ... while long cells' mean slowdown is at most this times round robin TQ 30 s's.
TARGET_LONG = 1.10

#: (name, the figure from a run and its seed's base run, its format).
Figure = tuple[str, Callable[[dict, dict], float], str]
FIGURES: tuple[Figure, ...] = (
    ("short cells' mean slowdown", lambda r, _: r["short_slowdown_mean"], "{:.2f}x"),
    ("NORMAL notebooks' short cells", lambda r, _: r["short_slowdown_mean_normal"], "{:.2f}x"),
    ("LOW notebooks' short cells", lambda r, _: r["short_slowdown_mean_low"], "{:.2f}x"),
    ("floor for any policy, all short cells",
     lambda r, _: r["short_slowdown_mean_floor_any_policy"], "{:.2f}x"),
    ("long cells against round robin TQ 30 s",
     lambda r, base: r["long_slowdown_mean"] / base["long_slowdown_mean"], "{:.3f}x"),
    ("NORMAL notebooks' long cells against round robin TQ 30 s",
     lambda r, base: r["long_slowdown_mean_normal"] / base["long_slowdown_mean_normal"],
     "{:.3f}x"),
    ("LOW notebooks' long cells against round robin TQ 30 s",
     lambda r, base: r["long_slowdown_mean_low"] / base["long_slowdown_mean_low"], "{:.3f}x"),
    ("switching loss", lambda r, _: r["switching_loss"], "{:.3f}"),
)


def parse_seeds(text: str) -> list[int]:
    """``1-20``, ``1,2,5`` or a mix (``1-3,7``) as a sorted list of distinct seeds."""
    seeds: set[int] = set()
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        try:
            low, high = int(first), int(last or first)
        except ValueError:
            raise ValueError(f"seeds must look like 1-20 or 1,2,5, got {text!r}") from None
        if high < low:
            raise ValueError(f"an empty range of seeds: {part.strip()!r}")
        seeds.update(range(low, high + 1))
    return sorted(seeds)


#: (seed, run label, notebooks, GPUs, hours, co_run, host link or None for the run's own):
#: one replay for a worker process. The label may be an overlapped twin's (``memory``).
Job = tuple[int, str, int, int, float, float, str | None]


def replay_one(job: Job) -> tuple[int, str, dict]:
    """One run of one seed, in a worker process: its figures without the replay itself."""
    seed, label, notebooks, gpus, hours, co_run, on = job
    _, mode, tq, policy, link = on_link(
        find(label, (*RUNS, *ORACLE_RUNS, *HINT_RUNS, *TURN_RUNS)), on)
    result = run(notebooks, gpus, hours, seed, mode, GPU_MEMORY, tq, policy, link,
                 co_run=co_run)
    return seed, label, {k: v for k, v in result.items() if not k.startswith("_")}


def replay_seeds(seeds: list[int], notebooks: int = 20, gpus: int = 2, hours: float = 8.0,
                 jobs: int | None = None, pure: Sequence[tuple] = (), co_run: float = 1.0,
                 more: Sequence[str] = (), overlap: bool = False, link: str | None = None
                 ) -> dict[str, dict[int, dict]]:
    """Each of ``KEY_RUNS`` and of the labels ``more`` (rows of ``turns.TURN_RUNS``) on each
    seed, with ``overlap`` each followed by its overlapped twin (``memory``), then each of the
    runs ``pure`` (rows of ``runs.ORACLE_RUNS`` or ``hints.HINT_RUNS``, ``replay_pure``), all
    on the host link ``link`` where given: label -> seed -> figures."""
    labels: list[str] = []
    for label in (*KEY_RUNS, *more):
        twin = overlapped(find(label, (*RUNS, *TURN_RUNS))) if overlap else None
        labels += [label] if twin is None else [label, twin[0]]
    results: dict[str, dict[int, dict]] = {label: {} for label in labels}
    work: list[Job] = [(seed, label, notebooks, gpus, hours, co_run, link) for seed in seeds
                       for label in labels]
    with ProcessPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        for seed, label, figures in pool.map(replay_one, work):
            results[label][seed] = figures
    if pure:
        results.update(replay_pure(seeds, pure, notebooks, gpus, hours, jobs, co_run, link))
    return results


def replay_pure(seeds: list[int], runs: Sequence[tuple], notebooks: int = 20, gpus: int = 2,
                hours: float = 8.0, jobs: int | None = None, co_run: float = 1.0,
                link: str | None = None) -> dict[str, dict[int, dict]]:
    """Each of ``runs`` (the references of ``runs.ORACLE_RUNS`` and ``hints.HINT_RUNS``) on
    each seed, in pure Python processes (they subclass the compiled policy, ``oracle``), on
    the host link ``link`` where given: label -> seed -> figures."""
    results: dict[str, dict[int, dict]] = {label: {} for label, *_ in runs}
    work: list[Job] = [(seed, label, notebooks, gpus, hours, co_run, link) for seed in seeds
                       for label in results]
    with pure_workers(jobs) as pool:
        for seed, label, figures in pool.map(replay_one, work):
            results[label][seed] = figures
    return results


def summary(results: dict[str, dict[int, dict]]) -> str:
    """The Markdown table: one column per run (``KEY_RUNS`` first, the base), each figure's
    mean over seeds (min-max), and the seeds meeting the target: for all short cells, then for
    NORMAL notebooks' alone (what is in reach under the priorities, docs/policy.md)."""
    base = results[KEY_RUNS[0]]
    seeds = sorted(base)
    labels = list(results)
    lines = [f"{len(seeds)} seeds ({seeds[0]}-{seeds[-1]}); each figure's mean over the seeds "
             "(lowest-highest)", "",
             "| | " + " | ".join(labels) + " |", "| --- |" + " --- |" * len(labels)]
    for name, figure, form in FIGURES:
        cells = []
        for label in labels:
            values = [figure(results[label][s], base[s]) for s in seeds]
            mean, low, high = (form.format(v) for v in
                               (statistics.fmean(values), min(values), max(values)))
            cells.append(f"{mean} ({low}-{high})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for name, short in (("", "short_slowdown_mean"),
                        ("NORMAL notebooks' short cells: ", "short_slowdown_mean_normal")):
        met = []
        for label in labels:
            meeting = [s for s in seeds if results[label][s][short] <= TARGET_SHORT
                       and results[label][s]["long_slowdown_mean"]
                       <= TARGET_LONG * base[s]["long_slowdown_mean"]]
            met.append(f"{len(meeting)} of {len(seeds)}")
        lines.append(f"| {name}seeds meeting the target (short <= {TARGET_SHORT:g}x, long <= "
                     f"{TARGET_LONG:.2f}x) | " + " | ".join(met) + " |")
    return "\n".join(lines)
