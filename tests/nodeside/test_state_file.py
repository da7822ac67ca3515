"""The state file (``kiwictl -S`` / ``-T`` kept across restarts) read back field by field."""

from __future__ import annotations

import json
import logging

from nodeside.daemon.state import StateFile


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
