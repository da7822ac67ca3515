"""The vmm evictor's allocations under many threads at once: they live in the shim's one table
of allocations (mechanisms/memory.c), found there under kiwi_vmm_lock with kiwi_table_lock
inside it. Threads allocating and freeing of every size, plainly and in stream order, while the
daemon evicts and restores the process, keep every byte and every figure exact; under
KIWI_TEST_SANITIZE=thread a race or a lock taken in the wrong order fails the test."""

from __future__ import annotations

from support import scaled
from test_vmm_evictor import evicted_by_next, vmm

CHURN = "__import__('churn_threads')"
THREADS = 4


def test_threads_allocating_and_freeing_through_evictions_keep_the_figures_exact(
        scheduler, workload, card) -> None:
    w = vmm(workload, card, scheduler.socket)
    assert w.call("d.launch()") == 0  # holds
    assert w.stats()["allocations"] == 0
    churns = []
    for round_ in range(3):
        # Each round's threads start while the process is evicted: their allocations reserve
        # addresses only, their writes wait for the GPU, and the restore runs beside them; the
        # next round's eviction comes while they may still churn.
        churn = f"{CHURN}.churn_on_threads(d, {THREADS}, 40, first_seed={round_ * THREADS})"
        evicted_by_next(scheduler, w, lambda churn=churn: churns.append(w.start(churn)))
    for churning in churns:
        assert churning.result(timeout=scaled(60)) == []
    assert w.call(f"{CHURN}.unchanged(d)", timeout=scaled(60)) == []
    stats = w.stats()
    assert stats["allocations"] == w.call(f"{CHURN}.live()")
    assert stats["evictable"] == stats["working_set"] > 0  # nothing pinned, all counted
    assert w.call(f"{CHURN}.free_all(d)", timeout=scaled(60)) == []
    evicted_by_next(scheduler, w)  # what was kept for reuse and stream-ordered frees go too
    stats = w.stats()
    assert (stats["working_set"], stats["evictable"], stats["allocations"]) == (0, 0, 0)
    assert card.used_by(w.process.pid) == 0
