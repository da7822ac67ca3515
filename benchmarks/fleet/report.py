"""The fleet benchmark's figures as one Markdown table, the runs side by side."""

from __future__ import annotations

from collections.abc import Callable

Row = tuple[str, Callable[[dict], str]]


def _share_error(result: dict) -> str:
    errors = result["share_error"]
    return " / ".join(f"{e:.3f}" for e in errors.values()) if errors else "(none sustained)"


def _against(base: dict, key: str) -> Callable[[dict], str]:
    return lambda r: f"{r[key] / base[key]:.2f}x"


def _floor(kind: str) -> Callable[[dict], str]:
    """Short cells' mean slowdown floor (``bound``), NORMAL / LOW / all."""
    return lambda r: " / ".join(f"{r[f'short_slowdown_mean{part}_floor{kind}']:.2f}x"
                                for part in ("_normal", "_low", ""))


def rows(base: dict) -> list[Row]:
    """Figure rows; ``base`` is the run the long cells are compared with (round robin TQ 30)."""
    return [
        ("GPU cells completed (short / long)",
         lambda r: f"{r['cells']} ({r['short_cells']} / {r['long_cells']})"),
        ("offered load", lambda r: f"{r['offered_load']:.3f}"),
        ("GPU utilization (working)", lambda r: f"{r['utilization']:.3f}"),
        ("switching loss (GPU time moving memory)", lambda r: f"{r['switching_loss']:.3f}"),
        ("memory moved over the link", lambda r: f"{r['moved_gib']:.0f} GiB"),
        ("grants that moved memory; their switch, mean / p95",
         lambda r: f"{r['switches']}; {r['switch_seconds'] / max(1, r['switches']):.2f} s / "
                   f"{r['switch_p95_s']:.2f} s"),
        ("wait per GPU cell, mean / p95",
         lambda r: f"{r['wait_mean_s']:.1f} s / {r['wait_p95_s']:.1f} s"),
        ("slowdown, all cells, mean", lambda r: f"{r['slowdown_mean']:.2f}x"),
        ("slowdown, short cells (< 10 s), mean / p95",
         lambda r: f"{r['short_slowdown_mean']:.2f}x / {r['short_slowdown_p95']:.2f}x"),
        ("short cells' mean slowdown, NORMAL / LOW notebooks",
         lambda r: f"{r['short_slowdown_mean_normal']:.2f}x / {r['short_slowdown_mean_low']:.2f}x"),
        ("floor under it in this run (rules, handoffs, restores): NORMAL / LOW / all",
         _floor("")),
        ("floor under it for any policy, given the arrivals: NORMAL / LOW / all",
         _floor("_any_policy")),
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


def explain_table(results: list[dict]) -> str:
    """Where short cells' waiting went (``--explain``), one column per run: each cause's share
    of the waiting, then the decisions behind it."""
    from benchmarks.fleet.explain import CAUSES

    explained = [r for r in results if "explain" in r]
    lines = [
        "Short cells' waiting by cause: its share of all their waiting seconds / what it adds "
        "to their mean slowdown",
        "",
        "| | " + " | ".join(r.get("label", r["mode"]) for r in explained) + " |",
        "| --- |" + " --- |" * len(explained),
    ]

    def share(cause: str) -> Callable[[dict], str]:
        def cell(r: dict) -> str:
            seconds = r["explain"]["short_wait_seconds"]
            total = sum(seconds.values())
            added = r["explain"]["short_slowdown_by_cause"].get(cause, 0.0)
            return f"{seconds.get(cause, 0.0) / total:.1%} / +{added:.2f}x" if total else "-"
        return cell

    figures: list[Row] = [(cause, share(cause)) for cause in CAUSES]
    figures += [
        ("short cells' mean slowdown, explained / measured",
         lambda r: f"{1 + sum(r['explain']['short_slowdown_by_cause'].values()):.2f}x / "
                   f"{r['short_slowdown_mean']:.2f}x"),
        ("short cells' waiting, explained / measured (s)",
         lambda r: f"{sum(r['explain']['short_wait_seconds'].values()):.0f} / "
                   f"{r['explain']['short_wait_total']:.0f}"),
        ("mean wait per short cell (s)",
         lambda r: f"{r['explain']['short_wait_total'] / max(1, r['short_cells']):.1f}"),
        ("quanta ended with waiters / of them cut short",
         lambda r: f"{r['explain']['quanta_ended']} / {r['explain']['cut_short']}"),
        ("a cut-short quantum ran, mean (s)",
         lambda r: f"{r['explain']['cut_short_ran_mean']:.2f}"),
        ("short cells dropped mid-cell, by reason",
         lambda r: ", ".join(f"{k} {v}" for k, v in sorted(r["explain"]["short_dropped"].items()))
         or "none"),
        ("grants / of them moving memory",
         lambda r: f"{r['explain']['grants']} / {r['explain']['grants_moving_memory']}"),
        ("short-cell requests: with over 1 s of recent GPU time / median (s)",
         lambda r: f"{r['explain']['short_asked_with_history']} of "
                   f"{r['explain']['short_asked']} / "
                   f"{r['explain']['short_asked_attained_median']:.1f}"),
        ("short-cell requests at most half the holder's recent GPU time",
         lambda r: str(r["explain"]["short_asked_lighter_than_half_the_holder"])),
    ]
    for name, cell in figures:
        lines.append(f"| {name} | " + " | ".join(cell(r) for r in explained) + " |")
    return "\n".join(lines)
