"""Each daemon benchmark, and the runner that repeats them, runs to its Markdown report.

Tiny settings against a real daemon: this shows the benchmarks still run and report what they
say (tables with separator rows, the goals, no raw JSON), never how fast anything is.
"""

from __future__ import annotations

import os
import re

import pytest

import benchmarks.__main__ as runner
from benchmarks.daemon import attack, handoff, handoff_core, soak


def tables(text: str) -> list[list[str]]:
    """The Markdown tables in text, each as its lines."""
    found: list[list[str]] = []
    for block in re.split(r"\n\s*\n", text):
        rows = [line for line in block.splitlines() if line.startswith("|")]
        if rows:
            found.append(rows)
    return found


def well_formed(text: str) -> None:
    assert tables(text), "no table"
    for rows in tables(text):
        assert re.fullmatch(r"\|( --- \|)+", rows[1]), f"no separator row under {rows[0]}"
        assert len({row.count("|") for row in rows}) == 1, f"ragged table {rows[0]}"
    assert not re.search(r"^\s*[{\[]", text, re.M), "raw JSON in the report"


def test_handoff_core_reports_the_daemons_work_beside_a_bare_relay_and_names_its_core() -> None:
    text = handoff_core.main(["--handoffs", "200", "--repeats", "1", "--clients", "2,8"])
    well_formed(text)
    assert "| 2 |" in text and "| 8 |" in text
    assert re.search(r"Scheduler core: (compiled \(mypyc\)|pure Python \(.+\))\.", text)


def test_handoff_reports_kiwi_beside_the_floor_with_the_issue_goals() -> None:
    text = handoff.main(["--repeats", "1", "--handoffs", "100", "--clients", "2,8", "--no-idle"])
    well_formed(text)
    assert "| 8 |" in text
    assert "| handoff p50 / floor, 8 waiting | ≤ 1.5x |" in text
    assert "| Kiwi p50 growth 2 → 8 waiting | ≤ 1.2x |" in text


def test_handoff_runs_again_beside_a_cpu_hog_with_processes_flat_out() -> None:
    text = handoff.main(["--repeats", "2", "--handoffs", "100", "--clients", "2", "--no-idle",
                         "--throughput", "2", "--throughput-seconds", "0.5", "--hog", "1",
                         "--hog-lead", "0"])
    well_formed(text)
    assert "### As the machine was" in text and "### Beside a CPU hog (1 busy loop," in text
    assert text.count("| Kiwi, 2 processes flat out |") == 2
    # each repeat's ratios, with the load it began under, in both phases
    assert len(re.findall(r"^\| 2 \| [\d.]+ \| 2 processes flat out \|", text, re.M)) == 2


@pytest.mark.skipif(not os.environ.get("KIWI_BENCH_NVSHARE"),
                    reason="KIWI_BENCH_NVSHARE names no nvshare-scheduler build")
def test_handoff_reports_nvshare_beside_the_daemon_with_the_issue_44_goals() -> None:
    text = handoff.main(["--repeats", "1", "--handoffs", "100", "--clients", "2,8", "--no-idle",
                         "--nvshare", os.environ["KIWI_BENCH_NVSHARE"], "--throughput", "2",
                         "--throughput-seconds", "0.5"])
    well_formed(text)
    assert "| daemon CPU per handoff / nvshare's, 8 waiting (issue 44) | ≤ 1.00x |" in text
    assert "| handoff p50 / nvshare's, 2 waiting (issue 44) | ≤ 1.00x |" in text
    assert "| handoffs/s / nvshare's, 2 processes flat out (issue 44) | ≥ 1.00x |" in text
    assert "| nvshare, 2 processes flat out |" in text


def test_soak_reports_the_daemon_rss_over_the_run() -> None:
    text = soak.main(["--handoffs", "3000", "--seconds", "60", "--contenders", "2"])
    well_formed(text)
    assert "| RSS, median of the last tenth / the first |" in text


@pytest.mark.slow
def test_probe_under_attack_ends_by_itself_and_reports_both_phases() -> None:
    text = attack.main(["--idle", "20", "--seconds", "0.5"])
    well_formed(text)
    assert "| quiet |" in text and "| under attack |" in text
    assert "| probe p99 under attack / quiet |" in text


def test_the_runner_repeats_a_benchmark_into_one_section_with_ranges_and_load(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    tiny = ("--handoffs", "2000", "--seconds", "60", "--contenders", "2")
    monkeypatch.setitem(runner.BENCHMARKS, "soak",
                        runner.Benchmark("Soak", "daemon.soak", tiny, tiny))
    text = runner.main(["--only", "soak", "--repeat", "2"])
    well_formed(text)
    assert "## Soak (`python -m benchmarks.daemon.soak`)" in text
    assert re.search(r"2 runs; 1-minute load average before each: [\d.]+, [\d.]+\.", text)
    assert "### Soak: 2,000 handoffs" in text  # the benchmark's heading, one level under
    assert "Run failed" not in text
