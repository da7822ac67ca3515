"""kiwictl end to end: the exact lines of the seed's operations guide, and its exit codes."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable

import pytest
from support import DaemonProcess, client_state, scaled, wait_for_status

from nodeside.client import Client


def kiwictl(daemon_socket: str, *args: str, **popen) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nodeside.ctl", "--socket", daemon_socket,
                           *args], capture_output=True, text=True, timeout=30, **popen)


def test_turning_on_and_off_prints_and_logs_the_guide_lines(daemon: DaemonProcess) -> None:
    off = kiwictl(daemon.socket, "-S", "off")
    assert off.returncode == 0
    assert off.stdout == "[INFO] Successfully turned off the Kiwi scheduler.\n"
    daemon.wait_log(r"\[INFO\] Received SCHED_OFF from <UNREGISTERED> \[FD=\d+\]\n"
                    r"\[INFO\] Scheduler status changed to OFF, broadcasting it \.\.\.")
    on = kiwictl(daemon.socket, "-S", "on")
    assert on.stdout == "[INFO] Successfully turned on the Kiwi scheduler.\n"
    daemon.wait_log(r"Received SCHED_ON from <UNREGISTERED> \[FD=\d+\]\n"
                    r"\[INFO\] Scheduler status changed to ON, broadcasting it \.\.\.")


def test_auto_mode_is_accepted(daemon: DaemonProcess) -> None:
    result = kiwictl(daemon.socket, "-S", "auto")
    assert result.returncode == 0
    daemon.wait_log(r"Scheduler status changed to AUTO, broadcasting it")


def test_setting_the_tq_prints_the_guide_line(daemon: DaemonProcess) -> None:
    result = kiwictl(daemon.socket, "-T", "30")
    assert result.stdout == "[INFO] Successfully set the Kiwi scheduler's TQ to 30 seconds.\n"
    with Client(daemon.socket, register=False) as c:
        assert c.status()["tq"] == 30


def test_fractional_tq_is_accepted(daemon: DaemonProcess) -> None:
    assert "TQ to 0.05 seconds" in kiwictl(daemon.socket, "-T", "0.05").stdout


def test_status_json_is_the_status_document(daemon: DaemonProcess) -> None:
    with Client(daemon.socket, name="nb-1") as c:
        c.acquire(timeout=5)
        result = kiwictl(daemon.socket, "status", "--json")
    doc = json.loads(result.stdout)
    assert doc["version"] == 1 and doc["clients"][0]["name"] == "nb-1"


def test_status_is_readable(start_daemon: Callable[..., DaemonProcess]) -> None:
    # Quantum and grace outlast the test: nb-1 holds and nb-2 waits until the test ends, however
    # long kiwictl takes to start (with the usual 0.2 s and 1 s, nb-1 lost the GPU to nb-2 when
    # it took longer than 1.2 s on a loaded machine).
    daemon = start_daemon("--tq", "3600", "--grace", "3600")
    with Client(daemon.socket, name="nb-1") as a, Client(daemon.socket, name="nb-2") as b:
        a.acquire(timeout=scaled(5))

        def wait() -> None:
            with contextlib.suppress(ConnectionError):
                b.acquire()  # until the test ends: closing b ends the wait

        threading.Thread(target=wait, daemon=True).start()
        wait_for_status(daemon.socket, lambda doc: client_state(doc, "nb-2") == "waiting",
                        what="nb-2 to queue")
        out = kiwictl(daemon.socket, "status").stdout
    assert "mode on," in out and "holding: nb-1" in out and "#1 waiting: nb-2" in out


def test_unreachable_daemon_exits_1_with_one_line(scratch) -> None:
    result = kiwictl(str(scratch / "nobody-home.sock"), "-S", "on")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "cannot reach the Kiwi scheduler" in result.stderr


@pytest.mark.parametrize("args", [[], ["-S", "sideways"], ["-T", "-1"], ["-T", "soon"],
                                  ["-T", "nan"], ["-T", "inf"], ["-T", "1e400"],
                                  ["-T", "86401"]])
def test_bad_usage_exits_2(scratch, args: list[str]) -> None:
    assert kiwictl(str(scratch / "s.sock"), *args).returncode == 2


NOBODY = 65534
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second user")


def kiwictl_as(uid: int, groups: list[int], *args: str) -> tuple[int, str]:
    """Run kiwictl's main in a forked child that has become another user.

    A fork rather than a new process: the interpreter lives under a home directory the other
    user may not read, and what is tested is the daemon's view of the peer, not the exec.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 99
        try:
            sys.stderr = open(write_end, "w")  # noqa: SIM115 - the child exits right after
            os.setgroups(groups)
            os.setgid(NOBODY)
            os.setuid(uid)
            from nodeside.ctl import main

            code = main(list(args))
            sys.stderr.flush()
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as err:
        stderr = err.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), stderr


def world_reachable_daemon(start_daemon, scratch, extra_config: str = "") -> DaemonProcess:
    """A daemon whose socket other users can reach, so that permission is the daemon's call."""
    config = scratch / "kiwi.yaml"
    config.write_text("socket_mode: '0666'\n" + extra_config)
    daemon = start_daemon("--config", str(config))
    os.chmod(daemon.directory, 0o755)
    return daemon


@root_only
def test_non_admin_is_refused_with_exit_1(start_daemon, scratch) -> None:
    daemon = world_reachable_daemon(start_daemon, scratch)
    code, stderr = kiwictl_as(NOBODY, [], "--socket", daemon.socket, "-S", "off")
    assert code == 1
    assert stderr.startswith("[ERROR] Permission denied") and stderr.count("\n") == 1
    daemon.wait_log(r"\[WARN\] Refused: uid 65534 may not change the scheduler's mode")
    with Client(daemon.socket, register=False) as c:
        assert c.status()["mode"] == "on"


@root_only
def test_admin_group_member_may_change_the_mode(start_daemon, scratch) -> None:
    daemon = world_reachable_daemon(start_daemon, scratch, "admin_group: '4242'\n")
    code, stderr = kiwictl_as(NOBODY, [4242], "--socket", daemon.socket, "-S", "off")
    assert code == 0, stderr
    with Client(daemon.socket, register=False) as c:
        assert c.status()["mode"] == "off"


@root_only
def test_socket_group_owns_the_socket(start_daemon) -> None:
    daemon = start_daemon("--socket-group", "4243")
    assert os.stat(daemon.socket).st_gid == 4243


def test_status_says_in_words_when_the_gpus_memory_is_unknown(daemon: DaemonProcess) -> None:
    """A daemon without NVML and without --gpu-memory (the embedded one on a laptop) knows
    neither the size nor the use of its logical GPU: say so, not `(? / ?)`."""
    with Client(daemon.socket, name="nb-1") as holder:
        holder.acquire(timeout=5)  # a holder that reported no working set: use unknown too
        out = kiwictl(daemon.socket, "status").stdout
    assert "  memory: its size is not known here" in out.splitlines(), out
    assert "?" not in out, out
