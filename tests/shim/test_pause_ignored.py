"""A pausable holder that NVML shows working while paused is noted and reported (issue 34.12).

Two shim processes take turns through the real daemon (as in test_turns.py); the daemon loads a
fake NVML (fake_nvml.c, through pynvml and the dynamic linker) whose per-process samples the
test writes. The trainer is paused for the person's cell, and NVML shows its process still at
80 % of the SMs: the daemon logs it once and the status document counts it. The person, at
work in its turn, is never noted. The rule itself is tested in tests/nodeside/test_pause_watch.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from run_builds import BuildOnce
from support import build_fake_nvml, wait_for, wait_for_status
from test_turns import entry

#: GPU seconds the trainer has held before the person's cell comes: the person keeps the turn,
#: and the trainer stays paused, until its cell has done as much (longer than the watch needs:
#: a grace of 1 s and a read every 2 s).
TRAINED = 8.0


@pytest.fixture(scope="session")
def fake_nvml(build_once: BuildOnce) -> Path:
    """A directory holding the fake libnvidia-ml.so.1."""
    return build_once("fake-nvml", build_fake_nvml)


@pytest.fixture
def processes(fake_nvml: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file of the fake NVML's samples, "<pid> <sm percent>" a line; the daemon started
    after this loads the fake."""
    samples = tmp_path / "processes"
    monkeypatch.setenv("FAKE_NVML_PROCESSES", str(samples))
    monkeypatch.setenv("LD_LIBRARY_PATH",
                       os.pathsep.join(filter(None, [str(fake_nvml),
                                                     os.environ.get("LD_LIBRARY_PATH")])))
    return samples


@pytest.fixture
def sampled_turns(processes, start_daemon, scratch):
    """test_turns.py's daemon (mode auto, turns of 0.5 s, TQ 30 s, one 8 GiB GPU) on the fake
    NVML."""
    config = scratch / "kiwi.yaml"
    config.write_text("mode: auto\npolicy: interactive\n"
                      "interactive:\n  turns: 0.5\n  first_quantum: 30\n")
    daemon = start_daemon("--tq", "30", "--grace", "30", "--gpus", "1", "--gpu-memory", "8GiB",
                          "--config", str(config))
    daemon.wait_log(r"Found 1 GPU\(s\) through NVML: 0: Fake GPU")
    return daemon


def test_a_paused_holder_that_nvml_shows_working_is_noted_once_and_counted(
        sampled_turns, processes, workload) -> None:
    daemon = sampled_turns
    first = workload(KIWI_SOCKET=daemon.socket, KIWI_CLIENT_NAME="trainer")
    first.call("shim.cell_begin()")
    first.call("d.alloc(1 << 30)")
    assert first.call("d.launch()") == 0
    wait_for(lambda: entry(daemon, first)["gpu_seconds"] > TRAINED, timeout=TRAINED + 30,
             what="the trainer to work")

    second = workload(KIWI_SOCKET=daemon.socket, KIWI_CLIENT_NAME="person")
    # What NVML sees from now on: both processes busy on the GPU.
    processes.write_text(f"{first.process.pid} 80\n{second.process.pid} 90\n")
    second.call("shim.cell_begin()")
    second.call("d.alloc(1 << 30)")
    assert second.call("d.launch()") == 0
    wait_for(lambda: first.stats()["paused"], what="the trainer to be paused")

    trainer_id = entry(daemon, first)["id"]
    wait_for_status(daemon.socket, lambda doc: any(
        c["id"] == trainer_id and c.get("pause_ignored") == 1 for c in doc["clients"]),
        timeout=TRAINED, what="the trainer counted as working while paused")
    daemon.wait_log(rf"\[WARN\] \S+ \({trainer_id}, pid {first.process.pid}\) works on GPU 0 "
                    r"while paused: 80 % of its SMs [\d.]+ s into its pause, 1 pause\(s\) so far")
    assert "pause_ignored" not in entry(daemon, second)  # at work in its turn
    assert daemon.log().count("while paused") == 1
    assert "Traceback" not in daemon.log()
