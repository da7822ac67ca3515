"""Mode auto's "step aside" rule through the real daemon: a heavy holder hears a drop (its memory
stays) when a light request comes beside it, is held back while the light one has its turn,
and ``kiwictl status`` and the metrics say so. Under round-robin the two just share.

The daemon runs on a real socket with one 8 GiB GPU, a TQ of 30 s (the light turn outlasts any
stall of a busy machine) and real ``nodeside.client`` clients; every wait is on an event.
"""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import DaemonProcess, wait_event, wait_for, wait_for_status

from nodeside import protocol as p
from nodeside.client import Client

GiB = 1 << 30
#: Past the first quantum (0.25 s) with room to spare, so the holder is heavy and its quantum
#: for a light request is over when that request comes.
HELD_FOR = 0.4
#: For a test that must see the light turn still going after several round trips and a
#: ``kiwictl`` start: the light request stays light while it used at most CUT_RATIO (half) of
#: this, 4 s of holding, which a busy 2-core machine's slowest step stays well inside (with
#: HELD_FOR it had 0.2 s, and a loaded CI run overran it).
HELD_LONG = 8.0


def auto_daemon(start_daemon: Callable[..., DaemonProcess], scratch, policy: str) -> DaemonProcess:
    config = scratch / "kiwi.yaml"
    config.write_text(f"mode: auto\npolicy: {policy}\n")
    return start_daemon("--tq", "30", "--grace", "30", "--gpus", "1", "--gpu-memory", "8GiB",
                        "--config", str(config), "--metrics-port", "0",
                        "--metrics-address", "127.0.0.1")


def gpu_seconds(client: Client) -> float:
    doc = client.status()
    return next(c["gpu_seconds"] for c in doc["clients"] if c["id"] == client.id)


def held_a_while(daemon: DaemonProcess, seconds: float = HELD_FOR) -> Client:
    """A client that acquired, reported a working set that fits beside another, and has held
    for ``seconds`` of GPU time (past its first quantum)."""
    trainer = Client(daemon.socket, name="trainer")
    trainer.acquire(timeout=10)
    trainer.report_working_set(2 * GiB)
    wait_for(lambda: gpu_seconds(trainer) >= seconds, timeout=seconds + 30,
             what="the trainer to hold a while")
    return trainer


def fresh(daemon: DaemonProcess) -> Client:
    person = Client(daemon.socket, name="person")
    person.report_working_set(GiB)
    return person


def kiwictl_status(daemon: DaemonProcess) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nodeside.ctl", "--socket", daemon.socket,
                           "status"], capture_output=True, text=True, timeout=30)


def steps_aside_total(daemon: DaemonProcess) -> float:
    match = daemon.wait_log(r"Serving Prometheus metrics on (http://[\d.]+:\d+/metrics)")
    with urllib.request.urlopen(match.group(1), timeout=10) as reply:
        text = reply.read().decode()
    return next(s.value for family in text_string_to_metric_families(text)
                for s in family.samples if s.name == "kiwi_steps_aside_total")


@pytest.fixture
def interactive(start_daemon, scratch) -> DaemonProcess:
    return auto_daemon(start_daemon, scratch, "interactive")


def test_a_heavy_holder_steps_aside_for_a_light_request_and_keeps_its_memory(interactive):
    trainer = held_a_while(interactive)
    with trainer, fresh(interactive) as person:
        person.acquire(timeout=10)  # granted at once, beside the trainer
        wait_event(trainer.drop_requested, what="the trainer's drop")
        assert trainer.last_drop is not None
        assert (trainer.last_drop["reason"], trainer.last_drop["evict"]) == (
            p.REASON_QUANTUM, False)
        assert person.holding


def test_a_light_request_early_in_a_heavy_hold_gets_its_drop_when_the_first_quantum_ends(
        interactive):
    """The trainer is heavy from its last hold and has just been granted again: the light
    request comes (on a quiet machine) before its first quantum is over, no event follows, and
    the drop comes from the daemon's own tick at that quantum's end."""
    trainer = held_a_while(interactive)
    trainer.release()
    trainer.acquire(timeout=10)
    with trainer, fresh(interactive) as person:
        person.acquire(timeout=10)
        wait_event(trainer.drop_requested, what="the trainer's drop")
        assert trainer.last_drop is not None
        assert (trainer.last_drop["reason"], trainer.last_drop["evict"]) == (
            p.REASON_QUANTUM, False)


def test_the_heavy_holder_is_held_back_during_the_light_turn_and_told_why(interactive):
    trainer = held_a_while(interactive, HELD_LONG)
    with trainer, fresh(interactive) as person:
        person.acquire(timeout=10)
        wait_event(trainer.drop_requested, what="the trainer's drop")
        trainer.requeue()  # gives back and asks again, as after any drop
        wait_for_status(interactive.socket, lambda doc: doc["gpus"][0]["queue"] == [trainer.id],
                        what="the trainer to wait")
        assert not trainer.holding
        assert trainer.status()["gpus"][0]["holders"] == [person.id]
        result = kiwictl_status(interactive)
        assert result.returncode == 0, result.stderr
        assert ("  next, because: held back while a light request beside it has its turn: "
                in result.stdout), result.stdout
        person.release()
        assert trainer.wait_for_grant(timeout=10)


def test_the_metrics_count_the_step_aside(interactive):
    trainer = held_a_while(interactive)
    assert steps_aside_total(interactive) == 0
    with trainer, fresh(interactive) as person:
        person.acquire(timeout=10)
        wait_event(trainer.drop_requested, what="the trainer's drop")
        trainer.requeue()
        wait_for_status(interactive.socket, lambda doc: doc["gpus"][0]["queue"] == [trainer.id],
                        what="the trainer to wait")
        person.release()
        assert trainer.wait_for_grant(timeout=10)
        assert steps_aside_total(interactive) == 1


def test_under_round_robin_the_holders_share_and_nobody_steps_aside(start_daemon, scratch):
    daemon = auto_daemon(start_daemon, scratch, "round-robin")
    trainer = held_a_while(daemon)
    with trainer, fresh(daemon) as person:
        person.acquire(timeout=10)
        # Anything the daemon sent the trainer for the grant came before this reply.
        holders = trainer.status()["gpus"][0]["holders"]
        assert sorted(holders) == sorted([trainer.id, person.id])
        assert not trainer.drop_requested.is_set()
        assert trainer.holding
        assert steps_aside_total(daemon) == 0
