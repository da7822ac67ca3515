"""The side-by-side measurement's arithmetic and report (the measurement itself needs a GPU:
``make gpu-check`` runs it there)."""

from __future__ import annotations

import pytest

from benchmarks.gpu_corun import KINDS, efficiency, table


def test_efficiency_is_the_work_done_together_over_one_alone():
    assert efficiency(100.0, [45.0, 45.0]) == pytest.approx(0.9)
    assert efficiency(100.0, [100.0]) == 1.0


def test_the_table_gives_each_kind_and_count_against_the_same_kinds_one_alone():
    text = table({"large": {1: [10.0], 2: [4.0, 4.5]}, "small": {1: [200.0], 2: [150.0, 150.0]}})
    rows = text.splitlines()
    assert rows[0].startswith("| cell | processes |")
    assert "| large (8192x8192 float16) | 2 | 4.0, 4.5 | 0.850 |" in rows
    assert "| small (512x512 float32) | 2 | 150.0, 150.0 | 1.500 |" in rows
    assert set(KINDS) == {"large", "small"}
