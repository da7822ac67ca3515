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


# -- issue 40, X14: a file that is no config is never echoed, not even as its keys ----------------

#: /etc/shadow's shape: YAML reads each line, ending in ":", as a key with no value.
SHADOW_LINES = "".join(f"user{i}:$6$s3cr3t-{i}-hash-that-must-not-leak:19000:0:99999:7:::\n"
                       for i in range(25))


def test_a_config_symlinked_to_a_file_yaml_reads_as_keys_is_refused_without_a_key(
        scratch) -> None:
    secret = scratch / "shadow"
    secret.write_text(SHADOW_LINES)
    secret.chmod(0o640)  # root's, 0640: passes the owner and mode checks
    config = scratch / "kiwi.yaml"
    config.symlink_to(secret)
    code, log = start_fails(scratch, "--config", str(config))
    assert code == 2
    assert "s3cr3t" not in log and "user0" not in log and "Traceback" not in log
    [line] = [line for line in log.splitlines() if "kiwi.yaml" in line]
    assert "not a Kiwi config" in line and "25 top-level key(s)" in line


def test_a_config_that_turns_into_a_secret_file_is_not_echoed_on_sighup(start_daemon,
                                                                       scratch) -> None:
    secret = scratch / "shadow"
    secret.write_text(SHADOW_LINES)
    secret.chmod(0o640)
    config = scratch / "kiwi.yaml"
    config.write_text("tq: 30\n")
    daemon = start_daemon("--config", str(config))
    config.unlink()
    config.symlink_to(secret)
    daemon.process.send_signal(signal.SIGHUP)
    daemon.wait_log(r"Config reload failed, keeping the running config: .*not a Kiwi config")
    assert "s3cr3t" not in daemon.log() and "user0" not in daemon.log()


def test_unknown_keys_of_a_config_are_named_a_few_at_most_each_cut_short(scratch) -> None:
    config = scratch / "kiwi.yaml"
    long_key = "k" * 200
    config.write_text("tq: 30\n" + "".join(f"{long_key}{i}: 1\n" for i in range(10)))
    code, log = start_fails(scratch, "--config", str(config))
    assert code == 2
    [line] = [line for line in log.splitlines() if "kiwi.yaml" in line]
    assert "unknown key(s)" in line and "7 more" in line
    assert long_key not in line and len(line) < 500


def test_a_value_the_config_refuses_is_shown_cut_short(scratch) -> None:
    config = scratch / "kiwi.yaml"
    config.write_text(f"tq: '{SECRET}'\n")
    code, log = start_fails(scratch, "--config", str(config))
    assert code == 2
    [line] = [line for line in log.splitlines() if "kiwi.yaml" in line]
    assert "tq: expected a number of seconds" in line and SECRET[30:] not in line


def configmap(directory: Path, text: str, stamp: str) -> None:
    """What the kubelet does to a ConfigMap volume: the files in a new timestamped folder,
    then ``..data`` swapped to it in one rename; ``kiwi.yaml`` links through ``..data``."""
    version = directory / f"..{stamp}"
    version.mkdir()
    (version / "kiwi.yaml").write_text(text)
    (directory / "..data_tmp").symlink_to(version.name)
    (directory / "..data_tmp").rename(directory / "..data")
    if not (directory / "kiwi.yaml").is_symlink():
        (directory / "kiwi.yaml").symlink_to("..data/kiwi.yaml")


def test_a_config_mounted_from_a_configmap_is_read_and_reloaded(start_daemon, scratch) -> None:
    mount = scratch / "config"
    mount.mkdir()
    configmap(mount, "tq: 12\npools: {first: {guarantee: 0.5}}\n", "2026_11_29_01_00_00.1")
    daemon = start_daemon("--config", str(mount / "kiwi.yaml"))
    with Client(daemon.socket, name="k") as c:
        status = c.status()
        assert (status["tq"], status["configured_pools"]) == (12, ["first"])
    configmap(mount, "pools: {second: {guarantee: 0.5}}\n", "2026_11_29_01_05_00.2")
    daemon.process.send_signal(signal.SIGHUP)
    daemon.wait_log(r"Config reloaded from .*kiwi\.yaml")
    with Client(daemon.socket, name="k") as c:
        assert c.status()["configured_pools"] == ["second"]
