"""The status document's ``recent_holders``: each GPU's last holds, whole and named, so every
view draws the same timeline whenever it starts looking."""

from __future__ import annotations

from nodeside.config import from_mapping
from nodeside.model import Registration
from nodeside.scheduler.core import GpuSpec, Scheduler
from nodeside.scheduler.history import KEEP_SECONDS, MAX_SPANS
from nodeside.scheduler.status import build_status


def scheduler(gpus: int = 1) -> Scheduler:
    return Scheduler(from_mapping({"tq": 30.0}), [GpuSpec(i) for i in range(gpus)], 0.0)


def spans(doc: dict, gpu: int = 0) -> list[tuple]:
    return [(s["display_name"], s["started_ago"], s["ended_ago"])
            for s in doc["gpus"][gpu]["recent_holders"]]


def test_holds_that_ended_before_anyone_looked_are_in_the_document_with_their_names():
    s = scheduler()
    a = s.register(0.0, Registration(name="k-a", display_name="kiwi-demo.ipynb", user="alice"))
    b = s.register(0.0, Registration(name="k-b", display_name="kiwi-demo-partner.ipynb"))
    s.acquire(10.0, a.id)
    s.acquire(12.0, b.id)  # waits behind a
    s.release(25.0, a.id)  # b is granted at once
    s.release(40.0, b.id)
    doc = build_status(s, 100.0)
    assert spans(doc) == [("kiwi-demo.ipynb", 90.0, 75.0),
                          ("kiwi-demo-partner.ipynb", 75.0, 60.0)]
    first = doc["gpus"][0]["recent_holders"][0]
    assert (first["client"], first["name"], first["user"]) == (a.id, "k-a", "alice")


def test_a_hold_still_open_has_no_end_and_a_client_that_left_keeps_its_name():
    s = scheduler()
    gone = s.register(0.0, Registration(name="gone", display_name="closed.ipynb"))
    stays = s.register(0.0, Registration(name="stays", display_name="open.ipynb"))
    s.acquire(1.0, gone.id)
    s.unregister(3.0, gone.id)  # its kernel died while holding
    s.acquire(4.0, stays.id)
    assert spans(build_status(s, 5.0)) == [("closed.ipynb", 4.0, 2.0), ("open.ipynb", 1.0, None)]


def test_old_holds_are_forgotten_and_the_history_stays_bounded():
    s = scheduler()
    c = s.register(0.0, Registration(name="busy"))
    for i in range(MAX_SPANS + 10):
        s.acquire(float(i), c.id)
        s.release(i + 0.5, c.id)
    now = MAX_SPANS + 10.0
    kept = build_status(s, now)["gpus"][0]["recent_holders"]
    assert len(kept) == MAX_SPANS
    assert kept[-1]["started_ago"] == 1.0  # the newest kept, the oldest dropped
    assert build_status(s, now + KEEP_SECONDS + 1.0)["gpus"][0]["recent_holders"] == []


def test_each_gpu_has_its_own_history():
    s = scheduler(gpus=2)
    a = s.register(0.0, Registration(name="a", gpu=0))
    b = s.register(0.0, Registration(name="b", gpu=1))
    s.acquire(1.0, a.id)
    s.acquire(2.0, b.id)
    doc = build_status(s, 3.0)
    assert spans(doc, 0) == [("a", 2.0, None)]
    assert spans(doc, 1) == [("b", 1.0, None)]


def test_a_holds_times_say_how_long_ago_and_keep_their_first_names():
    """``started_ago``/``ended_ago`` say what the figures are; ``started``/``ended`` (their first
    names, docs/interfaces.md section 10) carry the same figures for older readers."""
    s = scheduler()
    a = s.register(0.0, Registration(name="k-a"))
    s.acquire(10.0, a.id)
    s.release(20.0, a.id)
    (span,) = build_status(s, 30.0)["gpus"][0]["recent_holders"]
    assert (span["started_ago"], span["ended_ago"]) == (20.0, 10.0)
    assert (span["started"], span["ended"]) == (span["started_ago"], span["ended_ago"])
