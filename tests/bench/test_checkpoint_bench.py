"""The checkpoint benchmark's report and options (its measurements need a GPU and r570+)."""

from __future__ import annotations

import argparse

import pytest

from benchmarks.shim.checkpoint import SIZES_GIB, Report, parse_sizes


def test_each_line_of_the_report_is_printed_as_soon_as_it_is_known(capsys):
    out = Report()
    out.table_header("size", "checkpoint")
    assert capsys.readouterr().out == "| size | checkpoint |\n| --- | --- |\n"
    out.table_row("1 GiB", "0.9 s")
    assert capsys.readouterr().out == "| 1 GiB | 0.9 s |\n"
    assert out.text == "| size | checkpoint |\n| --- | --- |\n| 1 GiB | 0.9 s |"


def test_the_default_sizes_leave_out_40_gib_and_sizes_asks_for_it():
    assert 40 not in SIZES_GIB and SIZES_GIB == (1, 10)
    assert parse_sizes("1,10,40") == (1, 10, 40)


@pytest.mark.parametrize("text", ["", "0", "ten", "1,-2"])
def test_sizes_that_are_not_whole_gib_above_0_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_sizes(text)
