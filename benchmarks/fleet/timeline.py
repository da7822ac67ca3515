"""Timelines of GPU holders, drawn with matplotlib (the ``bench`` extra).

``draw_seed_example`` replays the seed's two-notebook example (seeds/kiwi-overview.txt, "Example
Timeline of Kiwi Applications") through the real scheduler core and draws it with the seed's
T0..T4 marks; ``draw_fleet`` draws a slice of a fleet replay, one row per notebook.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, never a display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from nodeside.config import from_mapping  # noqa: E402
from nodeside.scheduler.core import GpuSpec, Scheduler  # noqa: E402
from nodeside.testing import Replay  # noqa: E402

POOL_COLOURS = {"training": "#1f77b4", "simulation": "#ff7f0e", "default": "#2ca02c"}
CPU_COLOUR = "#d9d9d9"
WAIT_COLOUR = "#d62728"
SWITCH_COLOUR = "#000000"
#: A holder paused while another has its turn (mode auto, ``interactive.turns``).
PAUSED_COLOUR = "#d9d9d9"


def draw_seed_example(path: Path) -> None:
    """A: CPU work, then a GPU burst longer than a quantum. B: idle, CPU work, then a short GPU
    burst that arrives while A holds the GPU. TQ 10."""
    tq = 10.0
    replay = Replay(Scheduler(from_mapping({"tq": tq}), [GpuSpec(0)], 0.0))
    a, b = replay.add("A"), replay.add("B")
    t1, t2 = 2.0, 6.0
    replay.burst(a, 14.0, when=t1)
    replay.burst(b, 5.0, when=t2)
    replay.run_until(30.0)
    holds = {w: [(s.start, s.end) for s in replay.spans if s.name == w] for w in "AB"}
    waits = {w: [(s.start, s.end) for s in replay.wait_spans
                 if s.name == w and s.end is not None and s.end > s.start] for w in "AB"}
    cpu = {"A": [(0.0, t1), (holds["A"][-1][1], 30.0)],
           "B": [(3.0, t2), (holds["B"][-1][1], 30.0)]}
    t3 = holds["A"][0][1]
    t4 = holds["B"][0][1]
    assert t3 is not None and t4 is not None  # both holds ended within the 30 s replayed

    fig, ax = plt.subplots(figsize=(9, 2.6))
    for row, name in enumerate(("B", "A")):
        _bars(ax, row, cpu[name], CPU_COLOUR)
        _bars(ax, row, waits[name], WAIT_COLOUR, hatch="//", alpha=0.5)
        _bars(ax, row, holds[name], POOL_COLOURS["default"])
    for label, t in (("T0", 0.0), ("T1", t1), ("T2", t2), ("T3 = T1 + TQ", t3), ("T4", t4)):
        ax.axvline(t, color="black", linewidth=0.6, linestyle=":")
        ax.text(t + 0.15, 1.55, label, fontsize=8)
    ax.set_yticks([0, 1], ["application B", "application A"])
    ax.set_xlim(0, 30)
    ax.set_ylim(-0.6, 1.9)
    ax.set_xlabel("time (s), TQ = 10 s; replayed through nodeside.scheduler.core")
    ax.legend(handles=[Patch(color=POOL_COLOURS["default"], label="GPU (holds it)"),
                       Patch(color=WAIT_COLOUR, alpha=0.5, hatch="//", label="waits for it"),
                       Patch(color=CPU_COLOUR, label="CPU work")],
              loc="upper right", fontsize=7, ncol=3, bbox_to_anchor=(1.0, -0.35))
    ax.set_title("Two notebooks sharing one GPU (the seed's example timeline)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)


def draw_fleet(replay: Replay, path: Path, *, gpu: int, start: float, end: float,
               title: str = "mode on, TQ 30 s") -> None:
    names = sorted({s.name for s in replay.spans if s.gpu == gpu})
    fig, ax = plt.subplots(figsize=(10, 0.32 * len(names) + 1.4))
    for row, name in enumerate(names):
        waits = [(max(s.start, start), min(s.end or end, end)) for s in replay.wait_spans
                 if s.name == name and s.start < end and (s.end or end) > start]
        spans = [s for s in replay.spans
                 if s.name == name and s.gpu == gpu and s.start < end and (s.end or end) > start]
        _bars(ax, row, waits, WAIT_COLOUR, alpha=0.35, height=0.35)
        for span in spans:
            begin, stop = max(span.start, start), min(span.end or end, end)
            _bars(ax, row, [(begin, stop)], POOL_COLOURS.get(span.pool, "grey"))
            moving = (begin, min(span.start + span.switching, stop))
            _bars(ax, row, [moving], SWITCH_COLOUR, height=0.6)
            paused = [(max(a, begin), min(b, stop)) for a, b in span.paused]
            _bars(ax, row, paused, PAUSED_COLOUR, height=0.6)
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.set_xlim(start, end)
    ticks = [start + i * 60 for i in range(int((end - start) // 60) + 1)]
    ax.set_xticks(ticks, [f"{(t - start) / 60:.0f}" for t in ticks], fontsize=7)
    ax.set_xlabel(f"minutes (GPU {gpu}, from hour {start / 3600:g} of the replay)")
    ax.legend(handles=[Patch(color=c, label=f"holds: pool {p}") for p, c in
                       POOL_COLOURS.items() if p != "default"]
              + [Patch(color=WAIT_COLOUR, alpha=0.35, label="waits"),
                 Patch(color=SWITCH_COLOUR, label="moves memory (nobody works)")]
              + ([Patch(color=PAUSED_COLOUR, label="holds, paused: another's turn")]
                 if any(s.paused for s in replay.spans) else []),
              loc="upper right", fontsize=7, ncol=4, bbox_to_anchor=(1.0, -0.12))
    ax.set_title(f"Notebook fleet on one shared GPU: holders by quantum ({title})",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def _bars(ax: plt.Axes, row: int, spans: list, colour: str, *, height: float = 0.6,
          **style: Any) -> None:
    ranges = [(s[0], s[1] - s[0]) for s in spans if s[1] is not None and s[1] > s[0]]
    if ranges:
        ax.broken_barh(ranges, (row - height / 2, height), facecolors=colour, **style)
