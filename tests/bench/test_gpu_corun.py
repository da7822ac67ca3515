"""The side-by-side measurement's arithmetic and report (the measurement itself needs a GPU:
``make gpu-check`` runs it there)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from benchmarks.shim.gpu_corun import (
    KINDS,
    Worked,
    efficiency,
    environment,
    kiwi_environment,
    mix_table,
    switch_cost,
    table,
    turns_config,
    turns_table,
)
from nodeside.config import from_mapping


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


def test_turns_report_each_turn_and_kind_with_the_switches_memory_moved_and_switch_cost():
    pair = [Worked(4.9, 10, 0), Worked(4.9, 11, 0)]
    rows = turns_table({"large": 10.0}, {0.25: {"large": pair}}, {"large": 0.9}).splitlines()
    assert rows[0].startswith("| two processes taking turns through Kiwi | turn (s) |")
    # 2% of the work lost at a switch every quarter second: 5 ms a switch.
    assert "| large | 0.25 | 4.9, 4.9 | 21 | 0 | 0.980 | 0.900 | 5.00 |" in rows
    assert switch_cost(1.01, 1.0) == 0.0  # a gain is no cost


def test_the_pairs_take_turns_under_interactive_turns_in_mode_auto_and_never_step_aside():
    import yaml

    config = from_mapping(yaml.safe_load(turns_config(0.25)))
    assert (config.mode, config.policy, config.interactive.turns) == ("auto", "interactive", 0.25)
    assert config.interactive.first_quantum == config.tq == 30.0


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
