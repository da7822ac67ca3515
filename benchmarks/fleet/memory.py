"""Resident memory and overlapped handoffs in the fleet (issue 31): each run that moves memory
beside its twin with a chunked evictor, and what the overlap gains.

    python -m benchmarks.fleet --overlap [--link gen5]
    python -m benchmarks.fleet --seeds 1-10 --overlap [--link gen5] [--turns --co-run 0.901]

Every replay keeps working sets resident on their GPU after their cells until a grant needs the
room, and then moves the least recently used idle ones out, never a holder
(``switching.Residency``: issue 31's rule, modelled in the replay until the core keeps resident
memory itself). A handoff that must move memory costs out + in over the host link, as today's
evictors move it; its twin (label ``..., overlapped``, link ``...+overlap``) runs the newcomer's
restore while the leaver's chunks go out: max(out, in) and one chunk
(``switching.switch_seconds``). ``--link`` puts every run that moves memory on one link (gen5:
55 GB/s, the pinned copy measured on the H100 and H200).

``gains`` is the table of what overlap changes, run by run: the mean and p95 switch (over the
grants that moved memory), the wait per GPU cell, short cells' slowdown and the share of GPU
time spent moving memory, each out + in against overlapped.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable

from benchmarks.fleet.workload import OVERLAP

#: A run: (label, mode, TQ, policy, link), as in ``runs.RUNS``.
Run = tuple[str, str, float, str, str]
#: What a twin's label adds to its run's.
OVERLAPPED = ", overlapped"


def overlapped(row: Run) -> Run | None:
    """``row``'s twin with its handoffs overlapped, or None if it moves no memory."""
    label, mode, tq, policy, link = row
    if link == "none" or link.endswith(OVERLAP):
        return None
    return (label + OVERLAPPED, mode, tq, policy, link + OVERLAP)


def on_link(row: Run, link: str | None) -> Run:
    """``row`` on the host link ``link`` (None: its own); a run without switching costs stays
    without, an overlapped one stays overlapped."""
    label, mode, tq, policy, own = row
    if link is None or own == "none":
        return row
    return (label, mode, tq, policy, link + (OVERLAP if own.endswith(OVERLAP) else ""))


def with_twins(rows: Iterable[Run]) -> list[Run]:
    """Each run followed by its overlapped twin (where it moves memory)."""
    paired: list[Run] = []
    for row in rows:
        twin = overlapped(row)
        paired += [row] if twin is None else [row, twin]
    return paired


def find(label: str, runs: Iterable[Run]) -> Run:
    """The run labelled ``label`` among ``runs`` or their overlapped twins."""
    rows = list(runs)
    for row in rows:
        if row[0] == label:
            return row
    for row in rows:
        twin = overlapped(row)
        if twin is not None and twin[0] == label:
            return twin
    raise KeyError(f"no fleet run labelled {label!r}")


def twins_only(results: dict[str, dict[int, dict]]) -> dict[str, dict[int, dict]]:
    """The overlapped runs' figures under their runs' labels (for ``seeds.summary``)."""
    return {label: results[label + OVERLAPPED] for label in results
            if label + OVERLAPPED in results}


def _mean_switch(by_seed: dict[int, dict]) -> float:
    """Seconds of a grant that moved memory, over every such grant of every seed."""
    count = sum(r["switches"] for r in by_seed.values())
    return sum(r["switch_seconds"] for r in by_seed.values()) / count if count else 0.0


def _seed_mean(key: str) -> Callable[[dict[int, dict]], float]:
    return lambda by_seed: statistics.fmean(r[key] for r in by_seed.values())


#: (column, the figure over a run's seeds, its format, whether to show the change in %).
COLUMNS: tuple[tuple[str, Callable[[dict[int, dict]], float], str, bool], ...] = (
    ("grants moving memory (of all grants)",
     lambda s: statistics.fmean(r["switches"] / max(1, r["counts"]["grants"])
                                for r in s.values()), "{:.1%}", False),
    ("switch, mean", _mean_switch, "{:.2f} s", True),
    ("switch, p95", _seed_mean("switch_p95_s"), "{:.2f} s", True),
    ("wait per GPU cell, mean", _seed_mean("wait_mean_s"), "{:.1f} s", True),
    ("wait per GPU cell, p95", _seed_mean("wait_p95_s"), "{:.1f} s", True),
    ("short cells' mean slowdown", _seed_mean("short_slowdown_mean"), "{:.2f}x", True),
    ("GPU time moving memory", _seed_mean("switching_loss"), "{:.2%}", True),
)


def gains(results: dict[str, dict[int, dict]]) -> str:
    """A Markdown table, one row per run with a twin: each figure out + in -> overlapped, and
    the change."""
    pairs = [(label, results[label], results[label + OVERLAPPED]) for label in results
             if label + OVERLAPPED in results]
    if not pairs:
        return ""
    seeds = sorted(pairs[0][1])
    lines = [f"What overlapping a handoff's way out and way in gains, {len(seeds)} "
             f"seed{'s' if len(seeds) > 1 else ''} ({seeds[0]}-{seeds[-1]}): out + in -> "
             "overlapped (change); a switch is a grant that had to move memory", "",
             "| | " + " | ".join(name for name, *_ in COLUMNS) + " |",
             "| --- |" + " --- |" * len(COLUMNS)]
    for label, sequential, overlapping in pairs:
        cells = []
        for _, figure, form, change in COLUMNS:
            before, after = figure(sequential), figure(overlapping)
            cell = f"{form.format(before)} -> {form.format(after)}"
            if change and before:
                cell += f" ({(after - before) / before:+.0%})"
            cells.append(cell)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
