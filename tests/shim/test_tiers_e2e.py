"""The memory tiers end to end: the real daemon on a real Unix socket with a card that has room
for one working set, and real shimmed processes under the vmm evictor on the fake driver's card
(the helpers of test_memory_e2e.py).

- A host budget: kernels take turns, their memory evicted to host memory and spilled to disk
  (``KIWI_SPILL_DIR``) as the budget runs short; every turn finds its bytes intact, and the
  node's host use, as the daemon counts it in its status document, never exceeds the budget.
- Restore on intent: a kernel's memory brought back to the card by a hint (``intent``, then the
  daemon's ``fetch`` to the GPU) takes its room back at once: the next kernel that needs the
  card waits for it to be evicted again, never granted beside it.

Each kernel's own pin budget (``KIWI_VMM_PIN_BUDGET``) is a quarter of its working set, too
small for a staging ring: at tens of MiB the shim's ring (a quarter of the pin budget, up to
64 MiB, kept while evicted and on disk) and shadows pinned ahead would take more of a budget of
two working sets than the host copies do, and the daemon does not yet plan them against the
evictions a waiter needs.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from fake_device import FakeCard
from support import DaemonProcess, StatusEvents, wait_for
from test_memory_e2e import RESERVE, ROOM_FOR_ONE, WORKING_SET, Kernel

from nodeside import protocol as p
from nodeside.client import ControlClient

MiB = 1 << 20
KERNELS = 4
ROUNDS = 2
HOST_BUDGET = 2 * WORKING_SET
PIN_BUDGET = WORKING_SET // 4


def host_use(document: dict[str, Any]) -> int:
    """The node's host use as the daemon counts it (nodeside/scheduler/tiers.py): each client's
    host copy, or its pinned memory where that is more."""
    return sum(max(c["host_bytes"], c["pinned_bytes"]) for c in document["clients"])


class HostSampler:
    """Reads the status document after each change the daemon tells of, on a thread of its
    own: the peak host use, whether any memory went to disk, and the failed moves."""

    def __init__(self, socket: str) -> None:
        self.peak = 0
        self.spilled = False
        self.failed: list[str] = []
        self._watch = StatusEvents(socket)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self, document: dict[str, Any]) -> bool:
        self.peak = max(self.peak, host_use(document))
        self.spilled = self.spilled or any(c["disk_bytes"] for c in document["clients"])
        self.failed += [c["tier_failed"] for c in document["clients"] if c["tier_failed"]]
        return self._stop.is_set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:  # the timeout only looks at the stop flag again: samples come on changes
                self._watch.wait_for(self._sample, timeout=1.0, what="the end of the test")
            except AssertionError:
                continue

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._watch.close()


@pytest.fixture
def budgeted(start_daemon, tmp_path: Path) -> DaemonProcess:
    """Room on the card for one working set; a host budget of two; spills only for the budget."""
    config = tmp_path / "kiwi.yaml"
    config.write_text(f"host_budget: {HOST_BUDGET}\nspill_after: 0\n")
    return start_daemon("--tq", "60", "--grace", "30", "--gpus", "1", "--gpu-memory",
                        f"{(RESERVE + ROOM_FOR_ONE) // MiB}MiB", "--config", str(config))


def kernel(workload, card: FakeCard, daemon: DaemonProcess, name: str, tmp_path: Path,
           **sizes: Any) -> Kernel:
    return Kernel(workload, card, daemon, name, **sizes, KIWI_CLIENT_NAME=name,
                  KIWI_SPILL_DIR=str(tmp_path / "spill"), KIWI_VMM_PIN_BUDGET=str(PIN_BUDGET))


def test_kernels_take_turns_within_the_host_budget_with_their_bytes_intact(
        workload, card, budgeted, tmp_path) -> None:
    sampler = HostSampler(budgeted.socket)
    try:
        kernels = [kernel(workload, card, budgeted, f"nb{i}", tmp_path) for i in range(KERNELS)]
        for _ in range(ROUNDS + 1):  # the first round writes, the others check and write
            for k in kernels:
                k.turn()  # asserts the bytes it wrote last came back intact
                k.release()
    finally:
        sampler.stop()
    assert sampler.failed == []
    assert sampler.spilled  # four working sets, host room for two: some went to disk
    assert 0 < sampler.peak <= HOST_BUDGET


def test_memory_brought_back_by_an_intent_takes_its_room_back_at_once(
        workload, card, budgeted, tmp_path) -> None:
    nb = kernel(workload, card, budgeted, "nbA", tmp_path)
    nb.turn()
    nb.release()
    passer = kernel(workload, card, budgeted, "nbB", tmp_path, sizes=(8 * MiB,))
    passer.turn()  # nbA is evicted for it
    passer.release()
    passer.w.close()  # it leaves: the card has room for nbA again
    assert nb.on_card() == 0
    with ControlClient(budgeted.socket) as control:
        control.request(p.INTENT, name="nbA", reason="execute")
    wait_for(lambda: (s := nb.w.stats())["resident"] == WORKING_SET and s["host"] == 0,
             what="nbA's memory back on the card by the intent's fetch")
    # The card has room for one: the next kernel's first turn waits for nbA to leave again.
    # (Its daemon heard the fetch's end late and granted it beside nbA, for good.)
    second = kernel(workload, card, budgeted, "nbC", tmp_path, sizes=(8 * MiB,))
    second.turn()
    assert nb.on_card() == 0 and nb.w.stats()["evicted"]
    second.release()
    nb.turn()
    nb.release()
