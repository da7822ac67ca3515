"""The side-by-side measurement's arithmetic and report (the measurement itself needs a GPU:
``make gpu-check`` runs it there)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from benchmarks.gpu_corun import (
    KINDS,
    Worked,
    efficiency,
    environment,
    kiwi_environment,
    mix_table,
    table,
    turns_table,
)


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


def test_the_mix_gives_each_kind_its_speed_beside_the_other_against_its_own_alone():
    rows = mix_table({"large": 600.0, "small": 50000.0},
                     {"large": 540.0, "small": 10000.0}).splitlines()
    assert rows[0].startswith("| side by side | cell |")
    assert "| large + small | large | 600.0 | 540.0 | 0.900 |" in rows
    assert "| large + small | small | 50000.0 | 10000.0 | 0.200 |" in rows


def test_turns_report_each_tq_and_kind_with_the_turns_taken_and_memory_moved():
    pair = [Worked(4.0, 10, 0), Worked(4.5, 11, 0)]
    rows = turns_table({"large": 10.0}, {1.0: {"large": pair}}, {"large": 0.9}).splitlines()
    assert rows[0].startswith("| two processes taking turns through Kiwi | TQ (s) |")
    assert "| large | 1 | 4.0, 4.5 | 21 | 0 | 0.850 | 0.900 |" in rows


def test_a_process_spawned_in_the_kiwi_environment_is_preloaded_and_the_parent_is_restored(
        tmp_path, monkeypatch):
    monkeypatch.setenv("KIWI_EVICT", "managed")
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    changes = kiwi_environment("/lib/libkiwishim.so", str(tmp_path / "kiwi.sock"))
    probe = ("import os; print(os.environ['KIWI_SOCKET'], os.environ['KIWI_EVICT'], "
             "os.environ['KIWI_IDLE_RELEASE'])")
    with environment({**changes, "LD_PRELOAD": ""}):  # the path is made up: preload nothing
        seen = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                              text=True).stdout.split()
    assert seen == [str(tmp_path / "kiwi.sock"), "checkpoint", "0"]
    assert os.environ["KIWI_EVICT"] == "managed" and "LD_PRELOAD" not in os.environ
    assert changes["LD_PRELOAD"] == "/lib/libkiwishim.so"
