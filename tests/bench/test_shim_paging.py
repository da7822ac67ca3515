"""shim_paging's arithmetic (its measurements need a GPU: ``make gpu-check``)."""

from __future__ import annotations

from benchmarks.shim.paging import full_speed_after, seconds


def test_full_speed_counts_from_the_grant_not_from_the_request():
    # The first pass waited 3 s for the grant (the other holder's eviction) and then restored.
    granted = 103.0
    spans = [(100.0, 103.5), (103.5, 103.6), (103.6, 103.7)]
    assert full_speed_after(spans, steady=0.1, granted_at=granted) == 0.5


def test_demand_paging_reaches_full_speed_after_its_slow_passes():
    granted = 10.0
    spans = [(9.0, 10.4), (10.4, 10.7), (10.7, 10.85), (10.85, 10.95), (10.95, 11.05)]
    assert abs(full_speed_after(spans, steady=0.1, granted_at=granted) - 0.85) < 1e-9


def test_no_pass_at_full_speed_is_said_so_not_guessed():
    spans = [(0.0, 1.0), (1.0, 2.0)]
    assert full_speed_after(spans, steady=0.1, granted_at=0.5) is None
    assert seconds(None) == "not within 20 passes"


def test_the_row_gives_seconds_to_the_millisecond_not_raw_floats():
    assert seconds(3.4834053530000233) == "3.483"
