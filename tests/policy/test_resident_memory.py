"""Resident memory and overlapped handoffs in the fleet replay (issue 31, item 3).

Working sets stay on their GPU after their cells until a grant needs the room; the grant then
moves the least recently used idle ones out, never a holder (``switching.Residency``, the
replay's model of issue 31's rule). A handoff that moves memory costs out + in over the host
link, or, with a chunked evictor's overlap, max(out, in) and one chunk
(``switching.switch_seconds``).
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from policy_helpers import GiB, make_scheduler

from benchmarks.fleet.cli import main
from benchmarks.fleet.memory import OVERLAPPED, find, gains, on_link, overlapped, with_twins
from benchmarks.fleet.runs import RUNS
from benchmarks.fleet.seeds import KEY_RUNS
from benchmarks.fleet.switching import CHUNK, Residency, SwitchingModel, switch_seconds
from benchmarks.fleet.workload import PCIE_GEN5, parse_link
from nodeside.testing import Replay

LINK = 10 * GiB  # bytes per second: 10 GiB take one second
LAG = CHUNK / LINK  # one chunk's wait, in seconds


# -- what one switch costs -------------------------------------------------------------------


def test_without_overlap_a_switch_moves_out_then_in():
    assert switch_seconds(30 * GiB, 20 * GiB, LINK) == pytest.approx(5.0)


def test_with_overlap_a_switch_costs_the_longer_move_and_one_chunk():
    # Nothing free: the restore's first chunk waits for the leaver's first chunk.
    assert switch_seconds(30 * GiB, 30 * GiB, LINK, overlap=True) == pytest.approx(3.0 + LAG)
    assert switch_seconds(30 * GiB, 20 * GiB, LINK, overlap=True) == pytest.approx(3.0)


def test_a_restore_that_fits_in_the_room_already_free_waits_for_no_chunk():
    assert switch_seconds(10 * GiB, 20 * GiB, LINK, free=20 * GiB,
                          overlap=True) == pytest.approx(2.0)
    # 5 of the 30 GiB wait for released chunks: restoring the 25 GiB already free covers it.
    assert switch_seconds(5 * GiB, 30 * GiB, LINK, free=25 * GiB,
                          overlap=True) == pytest.approx(3.0)


@pytest.mark.parametrize(("out", "into"), [(30 * GiB, 0), (0, 30 * GiB), (0, 0)])
def test_a_move_in_one_direction_only_gains_nothing_from_overlap(out, into):
    assert switch_seconds(out, into, LINK, overlap=True) == switch_seconds(out, into, LINK)


@given(out=st.integers(0, 80 * GiB), into=st.integers(0, 80 * GiB),
       free=st.integers(0, 80 * GiB), chunk=st.integers(2**20, 2 * GiB))
def test_overlap_is_never_slower_than_out_plus_in_nor_faster_than_the_longer_move(
        out, into, free, chunk):
    sequential = switch_seconds(out, into, LINK)
    overlapping = switch_seconds(out, into, LINK, free=free, overlap=True, chunk=chunk)
    assert max(out, into) / LINK <= overlapping <= sequential + 1e-12


def test_moving_a_negative_amount_is_refused():
    with pytest.raises(ValueError, match="cannot move"):
        switch_seconds(-1, 0, LINK)


# -- what stays resident ---------------------------------------------------------------------


def test_a_working_set_stays_resident_after_its_cell_until_the_room_is_needed():
    gpu = Residency(capacity=40 * GiB)
    gpu.admit("A", 20 * GiB)
    gpu.admit("B", 20 * GiB)  # fits beside A: nothing moves, A stays
    assert list(gpu.resident) == ["A", "B"]
    assert gpu.admit("A", 20 * GiB) == (0, 0)
    assert gpu.admit("C", 10 * GiB) == (20 * GiB, 0)  # now B, the least recently used, goes
    assert gpu.on_host == {"B"}


def test_the_least_recently_used_goes_first_not_the_least_recently_granted():
    gpu = Residency(capacity=40 * GiB)
    gpu.admit("A", 15 * GiB)
    gpu.admit("B", 15 * GiB)
    gpu.used("A")  # A's hold ended after B's grant
    assert gpu.admit("C", 15 * GiB) == (15 * GiB, 0)
    assert gpu.on_host == {"B"}


def test_in_a_replay_a_kernel_that_held_long_beside_another_is_not_the_first_evicted():
    """Mode auto: A holds from 0 s to 100 s; B from 10 s to 15 s beside it. At 120 s C needs
    the room of one of them: B, idle since 15 s, goes; A, granted first but used until 100 s,
    stays."""
    link = SwitchingModel(40 * GiB, LINK)
    replay = Replay(make_scheduler({"tq": 1000.0, "mode": "auto"}, memory=40 * GiB),
                    switching=link)
    a, b, c = (replay.add(n, working_set=15 * GiB) for n in "ABC")
    replay.burst(a, 100.0, when=0.0)
    replay.burst(b, 5.0, when=10.0)
    replay.burst(c, 1.0, when=120.0)
    replay.run_until(200.0)
    assert link.gpus[0].on_host == {b.id}
    assert [s.switching for s in replay.spans if s.name == "C"] == [pytest.approx(1.5)]


def test_in_a_replay_an_overlapped_handoff_costs_the_longer_move_and_one_chunk():
    """A and B each fill the 40 GiB GPU and take turns: B's first grant evicts A (4 s, nothing
    to restore); A's return evicts B and restores A: 4 s and one chunk instead of 8 s."""
    replay = Replay(make_scheduler({"tq": 100.0}, memory=40 * GiB),
                    switching=SwitchingModel(40 * GiB, LINK, overlap=True))
    a = replay.add("A", working_set=40 * GiB)
    b = replay.add("B", working_set=40 * GiB)
    replay.burst(a, 10.0, when=0.0)
    replay.burst(b, 5.0, when=1.0)
    replay.burst(a, 2.0, when=20.0)
    replay.run_until(100.0)
    assert [s.switching for s in replay.spans] == [0.0, pytest.approx(4.0),
                                                   pytest.approx(4.0 + LAG)]
    assert replay.spans[-1].end == pytest.approx(20.0 + 4.0 + LAG + 2.0)
    assert replay.switching is not None
    assert replay.switching.switches == [pytest.approx(4.0), pytest.approx(4.0 + LAG)]
    assert replay.switching.evicted_bytes == 80 * GiB
    assert replay.switching.restored_bytes == 40 * GiB


def test_in_a_replay_room_left_free_covers_the_chunk_an_overlapped_restore_would_wait_for():
    """The same with 30 GiB working sets: 10 GiB are free when A comes back, so its restore
    starts at once and the chunks it needs next are out in time: 3 s, not 3 s and a chunk."""
    replay = Replay(make_scheduler({"tq": 100.0}, memory=40 * GiB),
                    switching=SwitchingModel(40 * GiB, LINK, overlap=True))
    a = replay.add("A", working_set=30 * GiB)
    b = replay.add("B", working_set=30 * GiB)
    replay.burst(a, 10.0, when=0.0)
    replay.burst(b, 5.0, when=1.0)
    replay.burst(a, 2.0, when=20.0)
    replay.run_until(100.0)
    assert [s.switching for s in replay.spans] == [0.0, pytest.approx(3.0), pytest.approx(3.0)]


# -- the runs and the table -------------------------------------------------------------------


def test_a_link_name_says_its_rate_and_whether_handoffs_overlap():
    assert parse_link("gen5") == (PCIE_GEN5, False)
    assert parse_link("gen5+overlap") == (PCIE_GEN5, True)
    assert parse_link("none") == (None, False)
    for name in ("none+overlap", "gen6", "gen5+overlap+overlap"):
        with pytest.raises(ValueError, match="no host link"):
            parse_link(name)


def test_each_run_that_moves_memory_gets_an_overlapped_twin_beside_it():
    rows = with_twins(RUNS[:3])
    assert [r[0] for r in rows] == [RUNS[0][0], RUNS[1][0], RUNS[1][0] + OVERLAPPED,
                                    RUNS[2][0], RUNS[2][0] + OVERLAPPED]
    assert rows[2][4] == "gen4+overlap"
    assert find(RUNS[1][0] + OVERLAPPED, RUNS) == rows[2]
    assert overlapped(rows[2]) is None
    assert on_link(rows[2], "gen5")[4] == "gen5+overlap" and on_link(RUNS[0], "gen5") == RUNS[0]


def _figures(switches: int, seconds: float, wait: float) -> dict:
    return {"switches": switches, "switch_seconds": seconds, "switch_p95_s": 2 * seconds / 10,
            "counts": {"grants": 100}, "wait_mean_s": wait, "wait_p95_s": 3 * wait,
            "short_slowdown_mean": 2.0, "switching_loss": 0.02}


def test_the_gains_table_pools_switches_over_seeds_and_gives_the_change():
    results = {"rr": {1: _figures(10, 20.0, 4.0), 2: _figures(30, 20.0, 6.0)},
               "rr" + OVERLAPPED: {1: _figures(10, 11.0, 3.0), 2: _figures(30, 11.0, 5.0)},
               "alone": {1: _figures(0, 0.0, 1.0), 2: _figures(0, 0.0, 1.0)}}
    table = gains(results).splitlines()
    assert table[0].startswith("What overlapping") and "2 seeds (1-2)" in table[0]
    [row] = [line for line in table if line.startswith("| rr |")]
    cells = row.split(" | ")
    assert cells[1] == "20.0% -> 20.0%"  # 10 and 30 of 100 grants
    assert cells[2] == "1.00 s -> 0.55 s (-45%)"  # 40 s over 40 switches, then 22 s
    assert cells[4] == "5.0 s -> 4.0 s (-20%)"
    assert not any(line.startswith("| alone |") for line in table)


def test_the_command_line_replays_each_key_run_beside_its_twin_on_the_link_asked(tmp_path,
                                                                                  capsys):
    out = tmp_path / "seeds.json"
    main(["--seeds", "1", "--notebooks", "8", "--gpus", "1", "--hours", "0.5", "--jobs", "1",
          "--overlap", "--link", "gen5", "--json", str(out)])
    by_label = json.loads(out.read_text())
    assert list(by_label) == [label for key in KEY_RUNS for label in (key, key + OVERLAPPED)]
    for label, by_seed in by_label.items():
        figures = by_seed["1"]
        twin = label.endswith(OVERLAPPED)
        assert figures["link"] == ("gen5+overlap" if twin else "gen5"), label
        assert figures["overlap"] is twin
        assert figures["switches"] > 0, label  # the small fleet does move memory
    printed = capsys.readouterr().out
    assert "over the host link gen5 (--link)" in printed
    assert "The same runs with each handoff's way out and way in overlapped" in printed
    assert sum(line.startswith("| ") and " -> " in line
               for line in printed.splitlines()) == len(KEY_RUNS)
