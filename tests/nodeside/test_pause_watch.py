"""The pause watch's rule (pause_watch.py, issue 34.12): which paused holder NVML's samples show
working. The real scheduler core with an injected clock takes turns; the samples are what NVML
would give. The daemon reading them from NVML is tested in tests/shim/test_pause_ignored.py."""

from __future__ import annotations

from nodeside.config import from_mapping
from nodeside.daemon.pause_watch import GRACE, THRESHOLD, PauseWatch, Sample
from nodeside.model import Registration
from nodeside.scheduler.core import GpuSpec, Scheduler

GiB = 1 << 30
TURNS = {"mode": "auto", "policy": "interactive", "tq": 30.0,
         "interactive": {"turns": 1.0, "first_quantum": 30.0}}


def turns() -> Scheduler:
    return Scheduler(from_mapping(TURNS), [GpuSpec(0, memory_total=40 * GiB)], 0.0)


def holding(sched: Scheduler, name: str, pid: int, now: float):
    client = sched.register(now, Registration(name=name, pid=pid, working_set=GiB, pausable=True))
    sched.acquire(now, client.id)
    return client


def trainer_paused_at_10() -> tuple[Scheduler, object, object]:
    """A trainer (pid 100) that worked ten seconds, paused at 10.0 for a person (pid 200)."""
    sched = turns()
    trainer = holding(sched, "trainer", 100, 0.0)
    person = holding(sched, "person", 200, 10.0)
    assert trainer.paused and not person.paused
    return sched, trainer, person


def test_a_paused_holder_seen_working_after_the_grace_is_noted_once_per_pause() -> None:
    sched, trainer, _ = trainer_paused_at_10()
    watch = PauseWatch()
    after = 10.0 + GRACE + 0.5
    notes = watch.seen(sched, [Sample(0, 100, after, 80)])
    assert [(n.client, n.pid, n.gpu, n.sm, n.count) for n in notes] == \
        [(trainer.id, 100, 0, 80, 1)]
    assert notes[0].into_pause == GRACE + 0.5
    # The same pause, read again: no second note, the count stands.
    assert watch.seen(sched, [Sample(0, 100, after + 2, 90)]) == []
    assert watch.counts == {trainer.id: 1}


def test_work_within_the_grace_or_below_the_threshold_is_not_noted() -> None:
    sched, _, _ = trainer_paused_at_10()
    watch = PauseWatch()
    assert watch.seen(sched, [Sample(0, 100, 10.0 + GRACE / 2, 100),  # launched before it
                              Sample(0, 100, 10.0 + GRACE + 1, THRESHOLD - 1)]) == []
    assert watch.counts == {}


def test_the_holder_at_work_is_never_noted_nor_a_paused_one_sharing_its_pid() -> None:
    sched = turns()
    trainer = holding(sched, "trainer", 100, 0.0)
    person = holding(sched, "person", 100, 10.0)  # one process, two clients
    assert trainer.paused and not person.paused
    assert PauseWatch().seen(sched, [Sample(0, 100, 15.0, 90)]) == []


def test_each_pause_worked_through_counts_and_a_client_gone_is_forgotten() -> None:
    sched, trainer, person = trainer_paused_at_10()
    watch = PauseWatch()
    assert len(watch.seen(sched, [Sample(0, 100, 12.0, 80)])) == 1
    # The person's cell ends: the trainer works; the next cell pauses it again.
    sched.release(15.0, person.id)
    assert not trainer.paused
    sched.acquire(20.0, person.id)
    assert trainer.paused
    notes = watch.seen(sched, [Sample(0, 100, 22.0, 80)])
    assert [(n.client, n.count) for n in notes] == [(trainer.id, 2)]
    sched.unregister(25.0, trainer.id)
    assert watch.seen(sched, []) == [] and watch.counts == {}


def test_samples_of_another_gpu_or_process_are_not_the_paused_holders() -> None:
    sched, _, _ = trainer_paused_at_10()
    assert PauseWatch().seen(sched, [Sample(1, 100, 15.0, 90), Sample(0, 300, 15.0, 90)]) == []
