"""The memory tiers' benchmarks over the fake driver run to their Markdown reports and verdicts.

Tiny settings against the real daemon and shimmed processes: this shows the benchmarks still
run to their end (restore on intent once waited for good for an eviction the daemon never asked)
and report what they say, never how fast anything is.
"""

from __future__ import annotations

import re

import pytest
from test_benchmarks_run import well_formed

from benchmarks.shim import host_budget, restore_on_intent


@pytest.mark.slow
def test_restore_on_intent_runs_to_its_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    assert restore_on_intent.main(["--gib", "0.0625"]) == 0
    text = capsys.readouterr().out
    well_formed(text)
    assert len(re.findall(r"^\| \d \| (yes|no) \|", text, re.M)) == 6
    assert "contents intact" in text and re.search(r"\*\*Verdict: (PASS|FAIL)\*\*", text)


@pytest.mark.slow
def test_kernels_taking_turns_within_a_host_budget_run_to_their_verdict(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert host_budget.main(["--kernels", "3", "--mib", "8", "--budget", "2",
                             "--rounds", "1"]) == 0
    text = capsys.readouterr().out
    well_formed(text)
    assert "contents intact every turn" in text
    assert re.search(r"\*\*Verdict: (PASS|FAIL)\*\*", text)
