"""The state file (``kiwictl -S`` / ``-T`` kept across restarts) read back field by field."""

from __future__ import annotations

import json
import logging

from nodeside.config import SchedulerConfig
from nodeside.daemon.state_file import StateFile
from nodeside.scheduler.core import GpuSpec, Scheduler


def test_a_hand_edited_mode_is_read_in_any_case_as_the_config_reads_it(tmp_path) -> None:
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"mode": "Off", "tq": 12}))
    assert StateFile(path).restore() == {"mode": "off", "tq": 12.0, "gpu_tq": {}}


def test_an_unknown_mode_is_named_and_skipped(tmp_path, caplog) -> None:
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"mode": "sometimes", "tq": 5}))
    with caplog.at_level(logging.WARNING, logger="kiwi.state"):
        restored = StateFile(path).restore()
    assert restored == {"tq": 5.0, "gpu_tq": {}}
    assert "Ignoring mode in state file" in caplog.text
    assert "'sometimes'" in caplog.text


def test_a_saved_gpu_tq_is_put_back_through_the_scheduler_on_the_gpus_it_has(tmp_path) -> None:
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"gpu_tq": {"1": 7.5, "5": 3.0}}))
    state = StateFile(path)
    scheduler = Scheduler(state.apply(SchedulerConfig(tq=30.0)), [GpuSpec(0), GpuSpec(1)], 0.0)
    assert state.restore_gpu_tq(scheduler, 0.0) == []  # nobody holds: nothing follows
    assert (scheduler.tq_for(0), scheduler.tq_for(1)) == (30.0, 7.5)
