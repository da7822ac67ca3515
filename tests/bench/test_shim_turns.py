"""A turn between two processes through the shim: how turns are told from interruptions, and
the benchmark run for real (daemon, shim, fake driver) to its report."""

from __future__ import annotations

import pytest

from benchmarks.shim.turns import main, turn_costs

MS = 1_000_000  # nanoseconds


def test_a_turn_runs_from_the_last_launch_of_one_to_the_first_launch_of_the_other():
    # A runs to 100 ms and waits until 200.3 ms; B waits from its last launch at 0 until
    # 100.2 ms, runs, and hands back at 200.2 ms.
    a = [(100 * MS, 200 * MS + 300_000)]
    b = [(0, 100 * MS + 200_000), (200 * MS + 200_000, 300 * MS)]
    assert turn_costs([a, b], wait_ns=50 * MS) == pytest.approx([100.0, 200.0])


def test_an_interruption_while_running_is_no_turn():
    # B is interrupted for 30 µs at 104 ms while A waits: neither that gap nor its end counts.
    a = [(100 * MS, 200 * MS + 300_000)]
    b = [(0, 100 * MS + 200_000), (104 * MS, 104 * MS + 30_000),
         (200 * MS + 200_000, 300 * MS)]
    assert turn_costs([a, b], wait_ns=50 * MS) == pytest.approx([100.0, 200.0])


def test_a_gap_in_one_process_the_other_does_not_span_is_no_turn():
    assert turn_costs([[(0, 60 * MS)], [(70 * MS, 140 * MS)]], wait_ns=50 * MS) == []


def test_two_processes_take_turns_through_a_real_daemon_and_the_report_says_what_each_cost():
    results = main(["--seconds", "1", "--tq", "0.05"])
    assert results["turns"] >= 1
    assert 0 < results["p50_us"] <= results["p99_us"]
    assert results["floor_p50_us"] > 0
