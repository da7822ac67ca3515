"""The fleet benchmark's figures as one Markdown table, the runs side by side."""

from __future__ import annotations

from collections.abc import Callable

Row = tuple[str, Callable[[dict], str]]


def _share_error(result: dict) -> str:
    errors = result["share_error"]
    return " / ".join(f"{e:.3f}" for e in errors.values()) if errors else "(none sustained)"


def _against(base: dict, key: str) -> Callable[[dict], str]:
    return lambda r: f"{r[key] / base[key]:.2f}x"


def rows(base: dict) -> list[Row]:
    """Figure rows; ``base`` is the run the long cells are compared with (round robin TQ 30)."""
    return [
        ("GPU cells completed (short / long)",
         lambda r: f"{r['cells']} ({r['short_cells']} / {r['long_cells']})"),
        ("offered load", lambda r: f"{r['offered_load']:.3f}"),
        ("GPU utilization (working)", lambda r: f"{r['utilization']:.3f}"),
        ("switching loss (GPU time moving memory)", lambda r: f"{r['switching_loss']:.3f}"),
        ("memory moved over the link", lambda r: f"{r['moved_gib']:.0f} GiB"),
        ("wait per GPU cell, mean / p95",
         lambda r: f"{r['wait_mean_s']:.1f} s / {r['wait_p95_s']:.1f} s"),
        ("slowdown, all cells, mean", lambda r: f"{r['slowdown_mean']:.2f}x"),
        ("slowdown, short cells (< 10 s), mean / p95",
         lambda r: f"{r['short_slowdown_mean']:.2f}x / {r['short_slowdown_p95']:.2f}x"),
        ("short cells' mean slowdown, NORMAL / LOW notebooks",
         lambda r: f"{r['short_slowdown_mean_normal']:.2f}x / {r['short_slowdown_mean_low']:.2f}x"),
        ("slowdown, long cells, mean / p95",
         lambda r: f"{r['long_slowdown_mean']:.2f}x / {r['long_slowdown_p95']:.2f}x"),
        ("long cells' mean slowdown against round robin TQ 30",
         _against(base, "long_slowdown_mean")),
        ("pool share error, training / simulation", _share_error),
        ("grants / drops", lambda r: f"{r['counts']['grants']} / {r['counts']['drops']}"),
    ]


def side_by_side(results: list[dict], base_label: str = "round robin, TQ 30 s") -> str:
    """A table with one column per run; long cells are compared with ``base_label``'s."""
    base = next((r for r in results if r.get("label") == base_label), results[0])
    first = results[0]
    lines = [
        f"{first['notebooks']} notebooks on {first['gpus']} GPUs, {first['hours']:g} h, "
        f"seed {first['seed']}",
        "",
        "| | " + " | ".join(r.get("label", r["mode"]) for r in results) + " |",
        "| --- |" + " --- |" * len(results),
    ]
    for name, cell in rows(base):
        lines.append(f"| {name} | " + " | ".join(cell(r) for r in results) + " |")
    return "\n".join(lines)
