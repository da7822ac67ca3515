"""The status document, ``kiwictl status`` and a running daemon say which policy runs and why
the next holder is next."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading

from policy_helpers import make_scheduler
from support import client_state, wait_for_status

from nodeside.client import Client
from nodeside.model import Registration
from nodeside.scheduler.status import build_status


def test_the_status_document_says_which_policy_runs_and_why_the_next_holder_is_next():
    sched = make_scheduler({"tq": 30.0, "policy": "interactive"})
    trainer = sched.register(0.0, Registration(name="trainer"))
    newcomer = sched.register(0.0, Registration(name="newcomer", priority="LOW"))
    sched.acquire(0.0, trainer.id)
    doc = build_status(sched, 1.0)
    assert doc["policy"] == "interactive"
    assert doc["gpus"][0]["policy"] == "interactive"
    assert doc["gpus"][0]["next_reason"] is None  # nobody waits
    sched.acquire(2.0, newcomer.id)
    reason = build_status(sched, 3.0)["gpus"][0]["next_reason"]
    assert reason.startswith("the only request waiting")


def test_the_status_document_says_why_a_short_request_goes_first():
    sched = make_scheduler({"tq": 30.0, "policy": "interactive"})
    trainer, heavy, light = (sched.register(0.0, Registration(name=n))
                             for n in ("trainer", "heavy", "light"))
    sched.acquire(0.0, heavy.id)
    sched.release(20.0, heavy.id)  # heavy used 20 s
    sched.acquire(20.0, trainer.id)
    sched.acquire(20.0, heavy.id)
    sched.acquire(20.0, light.id)
    doc = build_status(sched, 20.0)
    assert doc["gpus"][0]["queue"][0] == light.id
    assert doc["gpus"][0]["next_reason"].startswith("least GPU time recently: 0 s, others "
                                                    "waiting 20 s or more")


def test_round_robin_is_named_in_the_status_document():
    sched = make_scheduler({"tq": 30.0})
    a, b = sched.register(0.0, Registration(name="a")), sched.register(0.0, Registration(name="b"))
    sched.acquire(0.0, a.id)
    sched.acquire(0.0, b.id)
    doc = build_status(sched, 1.0)
    assert doc["policy"] == "round-robin"
    assert doc["gpus"][0]["next_reason"] == "round robin: first in request order"


def test_kiwictl_status_prints_the_policy_and_why_the_next_holder_is_next(start_daemon,
                                                                          scratch):
    config = scratch / "kiwi.yaml"
    config.write_text("policy: interactive\n")
    daemon = start_daemon("--tq", "30", "--config", str(config))
    with Client(daemon.socket, name="trainer") as trainer, \
            Client(daemon.socket, name="explorer", priority="LOW") as explorer:
        trainer.acquire(timeout=5)

        def wait() -> None:
            with contextlib.suppress(ConnectionError):
                explorer.acquire(timeout=20)

        threading.Thread(target=wait, daemon=True).start()
        wait_for_status(daemon.socket, lambda doc: client_state(doc, "explorer") == "waiting",
                        what="the explorer to queue")
        result = subprocess.run([sys.executable, "-m", "nodeside.ctl", "--socket",
                                 daemon.socket, "status"], capture_output=True, text=True,
                                timeout=30)
    assert result.returncode == 0, result.stderr
    assert "policy interactive" in result.stdout.splitlines()[0]
    assert "  next, because: the only request waiting" in result.stdout


def test_the_status_document_says_when_a_light_request_goes_ahead_of_a_pools_rule():
    """a1 is owed pool a's guarantee but used 20 s not long ago; b3's fresh request used less
    than half that: it is next, first in the queue, and the status says why."""
    pools = {"a": {"guarantee": 0.5, "weight": 1, "maximum": -1},
             "b": {"guarantee": 0.0, "weight": 1, "maximum": -1}}
    sched = make_scheduler({"tq": 30.0, "window": 300.0, "pools": pools,
                            "policy": "interactive"})
    a1 = sched.register(0.0, Registration(name="a1", pool="a"))
    b1, b2, b3 = (sched.register(0.0, Registration(name=f"b{i}", pool="b")) for i in (1, 2, 3))
    for client, start, end in ((a1, 0.0, 20.0), (b3, 20.0, 22.0), (b1, 22.0, 60.0)):
        sched.acquire(start, client.id)
        sched.release(end, client.id)
    sched.acquire(60.0, b2.id)
    sched.acquire(60.5, a1.id)
    sched.acquire(61.0, b3.id)  # not lighter than half of b2: b2's quantum runs on
    doc = build_status(sched, 61.5)
    assert doc["gpus"][0]["queue"][0] == b3.id
    assert doc["gpus"][0]["next_reason"] == (
        "a light request: goes once ahead of pool a's turn, for at most 5 s")
