"""Files the daemon reads at start and on SIGHUP, written by someone else or by mistake (issue
34.11): each bad file is one log line naming the file and why, never a line of what it holds,
never a traceback; a file another user could have written is refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from nodeside.client import Client

NOBODY = 65534

#: What a file the daemon must never quote holds: it shows up in no log line.
SECRET = "root:$6$s3cr3t-hash-that-must-not-leak:19000:0:99999:7:::"


def start_fails(scratch: Path, *args: str) -> tuple[int, str]:
    """``kiwi-scheduler`` with ``args``, expected to exit at start: its status and its log."""
    run = subprocess.run([sys.executable, "-m", "nodeside.daemon", "--socket",
                          str(scratch / "kiwi.sock"), *args], capture_output=True, text=True,
                         timeout=60)
    return run.returncode, run.stderr


def test_a_deeply_nested_state_file_is_one_line_and_the_daemon_starts(start_daemon,
                                                                       scratch) -> None:
    state = scratch / "state.json"
    state.write_text("[" * 100_000 + "]" * 100_000)
    daemon = start_daemon("--state-file", str(state))
    daemon.wait_log(r"Ignoring state file .*state\.json")
    with Client(daemon.socket, name="k") as c:
        c.acquire(timeout=10)
    log = daemon.log()
    assert log.count("Ignoring state file") == 1 and "Traceback" not in log


def test_a_config_that_is_not_utf8_is_one_line_at_start(scratch) -> None:
    config = scratch / "kiwi.yaml"
    config.write_bytes(b"tq: 30\nmode: \xff\xfe on\n")
    code, log = start_fails(scratch, "--config", str(config))
    assert code == 2
    assert "Traceback" not in log
    [line] = [line for line in log.splitlines() if "kiwi.yaml" in line]
    assert "not UTF-8" in line


def test_a_config_that_turns_bad_is_refused_on_sighup_and_the_daemon_serves_on(
        start_daemon, scratch) -> None:
    config = scratch / "kiwi.yaml"
    config.write_text("tq: 30\n")
    daemon = start_daemon("--config", str(config))
    config.write_bytes(b"tq: \xff\n")
    daemon.process.send_signal(signal.SIGHUP)
    daemon.wait_log(r"Config reload failed, keeping the running config: .*not UTF-8")
    with Client(daemon.socket, name="k") as c:
        c.acquire(timeout=10)
        assert c.status()["tq"] == 30
    assert "Traceback" not in daemon.log()


def test_a_config_symlinked_to_a_secret_file_never_puts_the_secret_in_the_log(scratch) -> None:
    secret = scratch / "shadow"
    # A line YAML cannot parse: its error would quote it.
    secret.write_text(f"{SECRET}\n  - [unclosed: {SECRET}\n")
    secret.chmod(0o600)
    config = scratch / "kiwi.yaml"
    config.symlink_to(secret)
    code, log = start_fails(scratch, "--config", str(config))
    assert code == 2
    assert "s3cr3t" not in log and "Traceback" not in log
    [line] = [line for line in log.splitlines() if "kiwi.yaml" in line]
    assert "line 2" in line


def test_a_world_writable_config_is_refused_saying_why(scratch) -> None:
    config = scratch / "kiwi.yaml"
    config.write_text("tq: 30\n")
    config.chmod(0o666)
    code, log = start_fails(scratch, "--config", str(config))
    assert code == 2 and "Traceback" not in log
    assert "refusing config" in log and "writable by every user" in log


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_a_state_file_planted_by_another_user_is_not_applied(start_daemon, scratch) -> None:
    state = scratch / "state.json"
    state.write_text('{"mode": "off", "tq": 0.05}')
    os.chown(state, NOBODY, NOBODY)
    daemon = start_daemon("--state-file", str(state))
    daemon.wait_log(rf"Ignoring state file .*state\.json: it is owned by uid {NOBODY}")
    with Client(daemon.socket, name="k") as c:
        status = c.status()
    assert (status["mode"], status["tq"]) == ("on", 30.0)
    assert "Restored runtime settings" not in daemon.log()
