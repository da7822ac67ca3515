"""How many notebooks per GPU a node carries at the interactive targets, with host RAM only and
with the disk tier (issue 42's fleet row).

    python -m benchmarks.fleet --tiers [--host-gib 256] [--gpus 8] [--gpu-gib 80]
                               [--per-gpu 6,8,10,12,14,16] [--seeds 1-2] [--hours 2]
                               [--nvme-read 6.5] [--nvme-write 3.5] [--spill-after 600]

The node: ``gpus`` GPUs of ``gpu_gib`` sharing ``host_gib`` of host RAM (the daemon's default
budget of it, ``tiers.default_budget``) and one NVMe drive for the spill directory, the link
Gen5 (55 GB/s, measured on the H100). Each count of notebooks per GPU replays, seed by seed:

* ``host RAM only``: the host budget, no disk tier (the floor the disk tier is judged against);
* ``host + disk``: the same budget and the disk tier (``tiers``);
* ``round robin, TQ 30 s`` with host memory unlimited: the base long cells are measured
  against (the simulator's target, ``seeds.TARGET_LONG``).

The first two run the key policy, mode auto, interactive, TQ 30 s, 1 s turns, with the work of
holders side by side at the co_run the H100 measured (0.901). A count is **carried** where the
simulator's interactive targets (``seeds``) are met on the mean over the seeds, as the fleet's
other tables judge them: short cells' mean slowdown at most 2x and long cells' at most 1.10x the
base's; and no cell failed on any seed (a cell whose room was refused for the shim's 300 s: host
memory could not hold the evictions it needed). The seeds meeting the targets one by one are
counted beside.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from benchmarks.fleet.runs import run
from benchmarks.fleet.seeds import TARGET_LONG, TARGET_SHORT
from benchmarks.fleet.tiers import NVME_READ, NVME_WRITE, SPILL_AFTER, TierSetting, default_budget
from benchmarks.fleet.turns import KEY_TURNS

GiB = 2**30
#: (mode, TQ, policy) of the runs compared, by variant; the base runs round robin.
POLICIES = {"host": ("auto", 30.0, KEY_TURNS.policy), "disk": ("auto", 30.0, KEY_TURNS.policy),
            "base": ("on", 30.0, "round-robin")}
LABELS = {"host": "host RAM only", "disk": "host + disk"}
#: The co_run the H100 measured (BENCHMARKS.md, "Taking turns").
CO_RUN = 0.901


@dataclass(frozen=True)
class Node:
    gpus: int = 8
    gpu_gib: float = 80.0
    host_gib: float = 256.0
    link: str = "gen5"
    nvme_read: float = NVME_READ
    nvme_write: float = NVME_WRITE
    spill_after: float = SPILL_AFTER

    def tiers(self, variant: str) -> TierSetting:
        if variant == "base":
            return TierSetting(None, disk=False)
        return TierSetting(default_budget(int(self.host_gib * GiB)), disk=variant == "disk",
                           nvme_read=self.nvme_read, nvme_write=self.nvme_write,
                           spill_after=self.spill_after)


#: (node, notebooks per GPU, seed, variant, hours): one replay for a worker process.
Job = tuple[Node, int, int, str, float]


def replay_one(job: Job) -> tuple[int, int, str, dict]:
    node, per_gpu, seed, variant, hours = job
    mode, tq, policy = POLICIES[variant]
    figures = run(per_gpu * node.gpus, node.gpus, hours, seed, mode, int(node.gpu_gib * GiB),
                  tq, policy, node.link, co_run=CO_RUN, tiers=node.tiers(variant))
    return per_gpu, seed, variant, {k: v for k, v in figures.items() if not k.startswith("_")}


def sweep(node: Node, per_gpu: list[int], seeds: list[int], hours: float,
          jobs: int | None = None) -> dict[str, dict[int, dict[int, dict]]]:
    """variant -> notebooks per GPU -> seed -> figures."""
    results: dict[str, dict[int, dict[int, dict]]] = {v: {n: {} for n in per_gpu}
                                                     for v in POLICIES}
    work: list[Job] = [(node, n, seed, variant, hours) for n in reversed(per_gpu)
                       for seed in seeds for variant in POLICIES]  # the longest first
    with ProcessPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        for n, seed, variant, figures in pool.map(replay_one, work):
            results[variant][n][seed] = figures
    return results


def meets(figures: dict, base: dict) -> bool:
    """The simulator's interactive targets, and no cell failed."""
    return (figures["tiers"]["failed_cells"] == 0
            and figures["short_slowdown_mean"] <= TARGET_SHORT
            and figures["long_slowdown_mean"] <= TARGET_LONG * base["long_slowdown_mean"])


def carried(results: dict[str, dict[int, dict[int, dict]]], variant: str) -> int:
    """The most notebooks per GPU carried (the module's docstring), every count below
    included (0: none)."""
    most = 0
    for n in sorted(results[variant]):
        by_seed, base = results[variant][n], results["base"][n]
        short = statistics.fmean(r["short_slowdown_mean"] for r in by_seed.values())
        long = statistics.fmean(r["long_slowdown_mean"] / base[s]["long_slowdown_mean"]
                                for s, r in by_seed.items())
        failed = sum(r["tiers"]["failed_cells"] for r in by_seed.values())
        if failed or short > TARGET_SHORT or long > TARGET_LONG:
            break
        most = n
    return most


def table(node: Node, results: dict[str, dict[int, dict[int, dict]]], hours: float) -> str:
    """The Markdown report: per count, each variant's figures (means over seeds), then what
    each carries and the ratio against host RAM only."""
    counts = sorted(results["host"])
    seeds = sorted(results["host"][counts[0]])
    budget = node.tiers("host").budget or 0

    def mean(variant: str, n: int, figure: Callable[[dict, dict], float]) -> float:
        by_seed = results[variant][n]
        return statistics.fmean(figure(by_seed[s], results["base"][n][s]) for s in seeds)

    rows = (
        ("short cells' mean slowdown", lambda r, _: r["short_slowdown_mean"], "{:.2f}x"),
        ("long cells against round robin TQ 30 s",
         lambda r, b: r["long_slowdown_mean"] / b["long_slowdown_mean"], "{:.2f}x"),
        ("cells failed (refused room 300 s)", lambda r, _: r["tiers"]["failed_cells"], "{:.1f}"),
        ("refusals for host memory", lambda r, _: r["tiers"]["refusals"], "{:.0f}"),
        ("peak host use / budget", lambda r, _: r["tiers"]["peak_host_gib"] * GiB / budget,
         "{:.2f}"),
        ("spills: idle", lambda r, _: r["tiers"]["spills_idle"], "{:.0f}"),
        ("spills: host budget short", lambda r, _: r["tiers"]["spills_budget"], "{:.0f}"),
        ("restores from disk", lambda r, _: r["tiers"]["restores_from_disk"], "{:.0f}"),
        ("GPU time moving memory", lambda r, _: r["switching_loss"], "{:.3f}"),
    )
    lines = [f"{node.gpus} GPUs of {node.gpu_gib:g} GiB sharing {node.host_gib:g} GiB of host "
             f"RAM (host budget {budget / GiB:.1f} GiB), one NVMe drive "
             f"({node.nvme_read / 1e9:g} GB/s read, {node.nvme_write / 1e9:g} GB/s write), "
             f"spill_after {node.spill_after:g} s, link {node.link}; {hours:g} h, "
             f"{len(seeds)} seed{'s' if len(seeds) > 1 else ''} ({', '.join(map(str, seeds))}), "
             "means over the seeds", "",
             "| notebooks per GPU | | " + " | ".join(str(n) for n in counts) + " |",
             "| --- | --- |" + " --- |" * len(counts)]
    for variant in LABELS:
        for name, figure, form in rows:
            cells = [form.format(mean(variant, n, figure)) for n in counts]
            lines.append(f"| {LABELS[variant]} | {name} | " + " | ".join(cells) + " |")
        met = [f"{sum(meets(results[variant][n][s], results['base'][n][s]) for s in seeds)}"
               f" of {len(seeds)}" for n in counts]
        lines.append(f"| {LABELS[variant]} | seeds meeting the targets | " + " | ".join(met)
                     + " |")
    host, disk = carried(results, "host"), carried(results, "disk")
    ratio = f"{disk / host:.2f}x" if host else "(host RAM only carries none)"
    lines += ["", f"Carried at the targets (on the mean over the seeds: short <= "
              f"{TARGET_SHORT:g}x, long <= {TARGET_LONG:.2f}x round robin; no cell failed on "
              f"any seed): host RAM only {host} notebooks per GPU, host + disk {disk}: {ratio}."]
    return "\n".join(lines)
