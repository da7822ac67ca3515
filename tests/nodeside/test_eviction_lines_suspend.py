"""The core's ``Suspend`` (feature ``memory``) through the checkpoint evictor's lines, sans I/O:
a checkpoint job where a record reaches the client, its result handed back for the core as a
``Checkpointed`` item, and a failure at once where none does. A client that pages itself
(``vmm``) is recorded on demand: only a ``Suspend`` checkpoints it."""

from __future__ import annotations

from nodeside.config import SchedulerConfig
from nodeside.evict.lines import CHECKPOINTED, Checkpoint, Checkpointed, EvictionLines
from nodeside.model import Registration
from nodeside.scheduler.core import GpuSpec, Grant, Released, Scheduler, Suspend

GiB = 1 << 30


def lines_with_a_vmm_client() -> EvictionLines:
    scheduler = Scheduler(SchedulerConfig(), [GpuSpec(0, memory_total=8 * GiB)], 0.0)
    scheduler.register(0.0, Registration(name="vmm", working_set=6 * GiB, evict="vmm"))  # c1
    lines = EvictionLines(scheduler)
    lines.register("c1", 101, 0, "vmm", on_demand=True)
    return lines


def test_a_suspend_becomes_a_checkpoint_whose_result_goes_back_to_the_core() -> None:
    lines = lines_with_a_vmm_client()
    (job,) = lines.take([Suspend("c1", 0, "timeout")])
    assert job == Checkpoint("c1", 0, 101)
    # What waited behind it on the GPU's line goes after the core hears the result.
    assert lines.take([Grant("c2", 0, 30.0)]) == []
    assert lines.checkpoint_done(job) == [Checkpointed("c1", None), Grant("c2", 0, 30.0)]
    assert lines.checkpoint("c1") == (CHECKPOINTED, None)


def test_a_failed_checkpoint_is_told_to_the_core() -> None:
    lines = lines_with_a_vmm_client()
    (job,) = lines.take([Suspend("c1", 0, "idle")])
    assert lines.checkpoint_failed(job, "lock timed out", now=0.0)[0] == \
        Checkpointed("c1", "lock timed out")


def test_a_client_no_record_reaches_is_answered_at_once() -> None:
    lines = lines_with_a_vmm_client()
    (told,) = lines.take([Suspend("c7", 0, "timeout")])
    assert isinstance(told, Checkpointed) and told.client == "c7" and told.error


def test_a_client_that_pages_itself_is_not_checkpointed_when_it_releases_evicting() -> None:
    lines = lines_with_a_vmm_client()
    assert lines.take([Released("c1", evict=True)]) == [Released("c1", evict=True)]
