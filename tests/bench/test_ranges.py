"""Several runs of a benchmark become one report whose figures carry their run-to-run range."""

from __future__ import annotations

from benchmarks.ranges import merge

RUN = """## Handoff (2026-11-23 11:34 UTC)

Machine: 2 CPUs, load average {load} (1 min)

| clients | p50 (µs) | handoffs/s | Kiwi / floor |
| --- | --- | --- | --- |
| 512 | {p50} | {rate} | {ratio}x |"""


def run(load: str = "2.29", p50: str = "51.7", rate: str = "2,231", ratio: str = "3.34") -> str:
    return RUN.format(load=load, p50=p50, rate=rate, ratio=ratio)


def test_a_figure_that_moved_reads_median_lowest_to_highest() -> None:
    merged = merge([run(p50="51.7"), run(p50="48.2"), run(p50="60.1")])
    assert "| 512 | 51.7 (48.2–60.1) |" in merged


def test_a_figure_that_did_not_move_and_the_settings_stay_as_printed() -> None:
    merged = merge([run(), run(), run()])
    assert merged == run()


def test_ratios_keep_their_sign_and_thousands_their_separators() -> None:
    merged = merge([run(rate="2,231", ratio="3.34"), run(rate="12,500", ratio="2.90"),
                    run(rate="9,000", ratio="3.00")])
    assert "9,000 (2,231–12,500)" in merged
    assert "3.00x (2.90x–3.34x)" in merged


def test_dates_are_not_figures() -> None:
    merged = merge([run(), run().replace("11:34", "11:39")])
    assert merged.splitlines()[0] == "## Handoff (2026-11-23 11:34 UTC)"


def test_runs_that_printed_other_lines_are_shown_whole_not_mixed() -> None:
    odd = run() + "\n| 1024 | 70.0 | 1,000 | 4.00x |"
    merged = merge([run(), odd])
    assert merged.startswith(run())
    assert "Run 2 printed other lines than run 1" in merged
    assert merged.endswith(odd)
