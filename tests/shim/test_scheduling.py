"""The shim against the real daemon: the gate, lazy acquisition, the release and re-grant
sequences, eviction only when the next holder needs the room, fork, many threads, restarts."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import pytest
from support import client_state, wait_for, wait_for_status, wait_on_client

from nodeside.client import Client

GiB = 1 << 30


def row_in(document: dict[str, Any], w) -> dict[str, Any] | None:
    """The workload's client in a status document."""
    return next((c for c in document["clients"] if c["pid"] == w.process.pid), None)


def state_in(document: dict[str, Any], w) -> str | None:
    client = row_in(document, w)
    return client["state"] if client else None


def working_set_in(document: dict[str, Any], w) -> int | None:
    client = row_in(document, w)
    return client["working_set"] if client else None


def client_of(scheduler, w) -> dict[str, Any] | None:
    with Client(scheduler.socket, register=False) as admin:
        return row_in(admin.status(), w)


def state_of(scheduler, w) -> str | None:
    client = client_of(scheduler, w)
    return client["state"] if client else None


def after(names: list[str], marker: str, nth: int = -1) -> list[str]:
    """The calls after the nth occurrence of marker."""
    positions = [i for i, name in enumerate(names) if name == marker]
    return names[positions[nth] + 1:]


def prefetch_devices(lines: list[str]) -> list[int]:
    return [int(re.search(r"device=(-?\d+)", line).group(1)) for line in lines]


def other_client(scheduler, name: str, working_set: int | None = None) -> Client:
    """A plain client, connected, with its working set known to the daemon."""
    client = Client(scheduler.socket, name=name)
    if working_set is not None:
        client.report_working_set(working_set)
    return client


@pytest.fixture
def holder(scheduler):
    with Client(scheduler.socket, name="holder") as client:
        yield client


def test_a_launch_waits_at_the_gate_until_the_grant(scheduler, workload, holder) -> None:
    w = workload(KIWI_SOCKET=scheduler.socket)
    holder.acquire(timeout=5)
    launch = w.start("d.launch()")
    wait_for_status(scheduler.socket, lambda doc: state_in(doc, w) == "waiting",
                    what="the shim to queue")
    assert not launch.done()
    assert not w.log.calls("cuLaunchKernel")
    holder.release()
    assert launch.result() == 0
    assert w.log.calls("cuLaunchKernel")
    assert state_of(scheduler, w) == "holding"


def test_the_first_gpu_call_acquires_lazily(scheduler, workload) -> None:
    w = workload(KIWI_SOCKET=scheduler.socket, KIWI_CLIENT_NAME="lazy-one")
    w.call("d.alloc(1024)")  # an allocation registers, but asks for nothing
    wait_for_status(scheduler.socket, lambda doc: state_in(doc, w) == "idle",
                    what="the shim to register")
    assert client_of(scheduler, w)["name"] == "lazy-one"
    assert w.call("d.launch()") == 0
    assert state_of(scheduler, w) == "holding"


def test_the_shim_reports_its_working_set(scheduler, workload) -> None:
    w = workload(KIWI_SOCKET=scheduler.socket)
    w.call("d.alloc(3 * 1024 ** 3)")
    w.call("d.alloc_vmm(1024 ** 3)")
    wait_for_status(scheduler.socket, lambda doc: working_set_in(doc, w) == 4 * GiB,
                    what="the working set report")


def hold_with(w, scheduler, nbytes: int) -> str | None:
    """Make w allocate nbytes, report them, and hold the GPU; the log starts afresh. Returns
    the pager's own stream, created for the restore that every grant makes (none with
    KIWI_RESTORE=fault)."""
    w.call(f"[d.alloc({nbytes // 2}), d.alloc({nbytes - nbytes // 2})]")
    assert w.call("d.launch()") == 0
    wait_for_status(scheduler.socket, lambda doc: working_set_in(doc, w) == nbytes,
                    what="the working set report")
    created = w.log.calls("cuStreamCreate")
    w.log.clear()
    if not created:
        return None
    assert len(created) == 1 and "flags=1" in created[0]  # non-blocking: never waits on stream 0
    return re.search(r"stream=(\S+)", created[0]).group(1)


def test_a_drop_that_needs_the_room_syncs_evicts_then_releases(scheduler, workload) -> None:
    w = workload(KIWI_SOCKET=scheduler.socket)
    own_stream = hold_with(w, scheduler, 6 * GiB)
    with other_client(scheduler, "next", 6 * GiB) as next_holder:
        next_holder.acquire(timeout=10)
        # The grant to the next holder came after the shim's release: the log must already
        # show the whole sequence.
        names = w.log.names()
    assert names[0] == "cuCtxSynchronize"
    evicting = after(names, "cuCtxSynchronize")
    assert evicting[0:2] == ["cuMemPrefetchAsync", "cuMemPrefetchAsync"]
    assert evicting[2] == "cuStreamSynchronize"
    prefetches = w.log.calls("cuMemPrefetchAsync")
    assert prefetch_devices(prefetches) == [-1, -1]
    assert all(line.endswith(f"stream={own_stream}") for line in prefetches)
    stats = w.stats()
    assert (stats["drops"], stats["evictions"], stats["bytes_evicted"]) == (1, 1, 6 * GiB)
    assert stats["evicted"] and stats["state"] == "idle"


def test_a_regrant_restores_the_working_set_before_work_resumes(scheduler, workload) -> None:
    w = workload(KIWI_SOCKET=scheduler.socket)
    hold_with(w, scheduler, 6 * GiB)
    with other_client(scheduler, "next", 6 * GiB) as next_holder:
        next_holder.acquire(timeout=10)
        w.log.clear()
        launch = w.start("d.launch()")
        wait_for_status(scheduler.socket, lambda doc: state_in(doc, w) == "waiting",
                        what="the shim to queue again")
        assert not w.log.calls("cuMemPrefetchAsync")
        next_holder.release()
        assert launch.result() == 0
    names = w.log.names()
    restore = names[:names.index("cuLaunchKernel")]
    assert restore.count("cuMemPrefetchAsync") == 2
    assert "cuStreamSynchronize" in restore[restore.index("cuMemPrefetchAsync"):]
    assert prefetch_devices(w.log.calls("cuMemPrefetchAsync")) == [0, 0]
    stats = w.stats()  # the first grant restored too: the driver may have moved pages
    assert (stats["restores"], stats["bytes_restored"], stats["evicted"]) == (2, 12 * GiB, False)


def test_the_stats_say_when_the_last_grant_arrived_on_the_monotonic_clock(scheduler,
                                                                           workload) -> None:
    """Benchmarks time the way back to full speed from the grant, not from the request (which
    includes the other holder's eviction)."""
    w = workload(KIWI_SOCKET=scheduler.socket)
    assert w.stats()["last_grant_at"] == 0  # no grant yet
    hold_with(w, scheduler, 1 * GiB)
    with other_client(scheduler, "next", 8 * GiB) as next_holder:
        next_holder.acquire(timeout=10)
        launch = w.start("d.launch()")
        wait_for_status(scheduler.socket, lambda doc: state_in(doc, w) == "waiting",
                        what="the shim to queue again")
        handed_over = time.monotonic()  # the same clock as the shim's, across processes
        next_holder.release()
        assert launch.result() == 0
        resumed = time.monotonic()
    granted = w.stats()["last_grant_at"]
    assert handed_over <= granted <= resumed


def test_a_drop_that_fits_beside_moves_nothing(scheduler, workload) -> None:
    w = workload(KIWI_SOCKET=scheduler.socket)
    hold_with(w, scheduler, 1 * GiB)
    with other_client(scheduler, "small", 1 * GiB) as small:
        small.acquire(timeout=10)
        assert small.holding
    assert "cuCtxSynchronize" in w.log.names()
    assert not w.log.calls("cuMemPrefetchAsync")
    stats = w.stats()
    assert (stats["drops"], stats["evictions"], stats["state"]) == (1, 0, "idle")


def test_a_cell_end_synchronizes_and_releases(scheduler, workload) -> None:
    w = workload(KIWI_SOCKET=scheduler.socket)
    w.call("shim.cell_begin()")
    assert w.call("d.launch()") == 0
    assert w.call("shim.holding") is True
    w.call("shim.release()")
    assert w.call("shim.holding") is False
    assert after(w.log.names(), "cuLaunchKernel") == ["cuCtxSynchronize"]
    wait_for_status(scheduler.socket, lambda doc: state_in(doc, w) == "idle",
                    what="the daemon to see the release")


def test_a_cell_end_waits_for_work_still_inside_the_gate(scheduler, workload) -> None:
    w = workload(KIWI_SOCKET=scheduler.socket, FAKE_CUDA_LAUNCH_SECONDS="0.3")
    assert w.call("d.launch()") == 0
    slow = w.start("d.launch(grid=7)")
    wait_for(lambda: w.stats()["in_flight"] == 1, what="the slow launch to be inside the gate")
    w.call("shim.release()")
    assert slow.result() == 0
    names = w.log.names()
    assert names.index("cuCtxSynchronize") > max(
        i for i, line in enumerate(w.log.lines()) if "grid=7" in line)


@pytest.fixture
def long_quantum(start_daemon):
    """As ``scheduler``, but no quantum ends during a test: only the shim's own releases (cell
    end, idle) give the GPU back, never a drop."""
    return start_daemon("--tq", "60", "--gpus", "1", "--gpu-memory", "8GiB", "--grace", "30")


def waiting_for(scheduler, name: str, working_set: int) -> tuple[Client, threading.Thread]:
    """Another client, queued behind the shim for working_set bytes; the thread acquires."""
    client = other_client(scheduler, name, working_set)
    acquiring = threading.Thread(target=client.acquire, kwargs={"timeout": 20})
    acquiring.start()
    wait_for_status(scheduler.socket, lambda doc: client_state(doc, name) == "waiting",
                    what=f"{name} to queue")
    return client, acquiring


def test_a_cell_end_evicts_before_the_next_holder_that_needs_room_is_granted(
        long_quantum, workload, tmp_path) -> None:
    transfer_done = tmp_path / "transfer-done"
    scheduler = long_quantum
    w = workload(KIWI_SOCKET=scheduler.socket, FAKE_CUDA_STREAM_SYNC_GATE=str(transfer_done))
    w.call("shim.cell_begin()")
    own_stream = hold_with(w, scheduler, 6 * GiB)
    next_holder, acquiring = waiting_for(scheduler, "next", 6 * GiB)
    with next_holder:
        w.call("shim.release()")  # returns once the question is asked; the thread evicts
        # The eviction is held in its last step, waiting for the prefetches: the hold has
        # ended (the memory feature: its compute is quiesced), but its memory is still on its
        # way out, so the daemon has not handed the GPU over, and the shim's gate is closed.
        wait_for(lambda: w.log.calls("cuStreamSynchronize"), what="the eviction to start")
        row = client_of(scheduler, w)
        assert row is not None and (row["state"], row["residency"]) == ("idle", "evicting")
        assert state_of_name(scheduler, "next") == "waiting"
        assert acquiring.is_alive() and not next_holder.holding
        assert w.call("shim.holding") is False
        transfer_done.touch()
        acquiring.join(timeout=20)
        assert next_holder.holding
        names = w.log.names()  # what the shim had done by the time the grant was sent
    assert names[0] == "cuCtxSynchronize"
    assert after(names, "cuCtxSynchronize") == [
        "cuMemPrefetchAsync", "cuMemPrefetchAsync", "cuStreamSynchronize"]
    prefetches = w.log.calls("cuMemPrefetchAsync")
    assert prefetch_devices(prefetches) == [-1, -1]
    assert all(line.endswith(f"stream={own_stream}") for line in prefetches)
    stats = w.stats()
    assert (stats["releases"], stats["evictions"], stats["bytes_evicted"]) == (1, 1, 6 * GiB)
    assert (stats["drops"], stats["state"], stats["evicted"]) == (0, "idle", True)


def test_a_cell_end_whose_next_holder_fits_beside_moves_nothing(long_quantum, workload) -> None:
    scheduler = long_quantum
    w = workload(KIWI_SOCKET=scheduler.socket)
    w.call("shim.cell_begin()")
    hold_with(w, scheduler, 1 * GiB)
    next_holder, acquiring = waiting_for(scheduler, "small", 1 * GiB)
    with next_holder:
        w.call("shim.release()")
        acquiring.join(timeout=20)
        assert next_holder.holding
    wait_for(lambda: w.stats()["state"] == "idle", what="the released reply")
    assert w.log.names() == ["cuCtxSynchronize"]
    assert w.stats()["evictions"] == 0


def test_a_cell_end_with_nobody_waiting_keeps_the_working_set(long_quantum, workload) -> None:
    scheduler = long_quantum
    w = workload(KIWI_SOCKET=scheduler.socket)
    w.call("shim.cell_begin()")
    hold_with(w, scheduler, 6 * GiB)
    w.call("shim.release()")
    wait_for_status(scheduler.socket, lambda doc: state_in(doc, w) == "idle",
                    what="the daemon to see the release")
    wait_for(lambda: w.stats()["state"] == "idle", what="the released reply")
    assert not w.log.calls("cuMemPrefetchAsync")
    assert w.stats()["evicted"] is False


def test_an_idle_release_evicts_before_the_next_holder_is_granted(
        long_quantum, workload, tmp_path) -> None:
    transfer_done = tmp_path / "transfer-done"
    scheduler = long_quantum
    w = workload(KIWI_SOCKET=scheduler.socket, KIWI_IDLE_RELEASE="0.2",
                 FAKE_CUDA_STREAM_SYNC_GATE=str(transfer_done))
    w.call(f"[d.alloc({3 * GiB}), d.alloc({3 * GiB})]")
    wait_for_status(scheduler.socket, lambda doc: working_set_in(doc, w) == 6 * GiB,
                    what="the working set report")
    # The queue is holder, then the shim, then next: next already waits when the shim's idle
    # time runs out after its launch.
    holder = other_client(scheduler, "holder")
    holder.acquire(timeout=5)
    launch = w.start("d.launch()")
    wait_for_status(scheduler.socket, lambda doc: state_in(doc, w) == "waiting",
                    what="the shim to queue")
    next_holder, acquiring = waiting_for(scheduler, "next", 6 * GiB)
    with next_holder:
        holder.release()
        assert launch.result() == 0
        wait_for(lambda: w.log.calls("cuStreamSynchronize"), what="the idle eviction")
        assert (state_of(scheduler, w), state_of_name(scheduler, "next")) == (
            "holding", "waiting")
        transfer_done.touch()
        acquiring.join(timeout=20)
        assert next_holder.holding
    holder.close()
    assert after(w.log.names(), "cuLaunchKernel") == [
        "cuCtxSynchronize", "cuMemPrefetchAsync", "cuMemPrefetchAsync", "cuStreamSynchronize"]
    stats = w.stats()
    assert (stats["drops"], stats["evictions"], stats["releases"]) == (0, 1, 1)


def state_of_name(scheduler, name: str) -> str | None:
    with Client(scheduler.socket, register=False) as admin:
        status = admin.status()
    return next((c["state"] for c in status["clients"] if c["name"] == name), None)


def test_many_threads_launching_at_once_share_one_grant(scheduler, workload, holder) -> None:
    w = workload(KIWI_SOCKET=scheduler.socket)
    holder.acquire(timeout=5)
    launches = w.start("launch_from_threads(16)")
    wait_for_status(scheduler.socket, lambda doc: state_in(doc, w) == "waiting",
                    what="the shim to queue")
    assert not launches.done()
    holder.release()
    assert launches.result() == [0] * 16
    grids = sorted(int(re.search(r"grid=(\d+)", line).group(1))
                   for line in w.log.calls("cuLaunchKernel"))
    assert grids == list(range(1, 17))
    assert w.stats()["grants"] == 1


def test_a_forked_child_is_a_client_of_its_own(scheduler, workload) -> None:
    w = workload(KIWI_SOCKET=scheduler.socket)
    assert w.call("d.launch()") == 0
    parent = w.stats()
    child = w.call("fork_and_launch()", timeout=20)
    assert child["launch"] == 0 and child["status"] == 0
    assert child["pid"] != w.process.pid
    stats = w.stats()
    assert stats["client"] == parent["client"] and stats["connected"]
    assert stats["drops"] >= 1  # the parent gave the GPU to its child
    assert w.call("d.launch()") == 0


def test_the_shim_registers_again_after_a_daemon_restart(scheduler, workload) -> None:
    w = workload(KIWI_SOCKET=scheduler.socket, KIWI_FAIL_POLICY="closed", KIWI_FAIL_TIMEOUT="30")
    assert w.call("d.launch()") == 0
    first = w.stats()["client"]
    scheduler.restart()
    wait_for_status(scheduler.socket, lambda doc: state_in(doc, w) == "idle", timeout=15,
                    what="the shim to register with the new daemon")
    assert w.call("d.launch()") == 0
    assert state_of(scheduler, w) == "holding"
    assert w.stats()["connected"] and w.stats()["client"] is not None
    assert first is not None


def test_outside_cells_the_gpu_goes_back_after_the_idle_time(scheduler, workload) -> None:
    w = workload(KIWI_SOCKET=scheduler.socket, KIWI_IDLE_RELEASE="0.2")
    assert w.call("d.launch()") == 0
    wait_for_status(scheduler.socket, lambda doc: state_in(doc, w) == "idle",
                    what="the idle release")
    assert w.stats()["releases"] == 1


def test_inside_a_cell_the_idle_time_does_not_release(scheduler, workload) -> None:
    w = workload(KIWI_SOCKET=scheduler.socket, KIWI_IDLE_RELEASE="0.1")
    w.call("shim.cell_begin()")
    assert w.call("d.launch()") == 0
    w.call("__import__('time').sleep(0.5)")
    assert state_of(scheduler, w) == "holding"


def test_eager_acquire_holds_before_any_gpu_call(scheduler, workload) -> None:
    w = workload(KIWI_SOCKET=scheduler.socket)
    assert w.call("shim.acquire(5)") is True
    assert state_of(scheduler, w) == "holding"
    assert not w.log.calls("cuLaunchKernel")


def test_a_free_during_graph_capture_waits_for_the_next_release(scheduler, workload) -> None:
    w = workload(KIWI_SOCKET=scheduler.socket, FAKE_CUDA_CAPTURING_STREAM="0x66")
    w.call("shim.cell_begin()")
    ptr = w.call("d.alloc_async(4096, stream=0x77)")
    assert w.call("d.launch()") == 0
    assert w.call(f"d.free_async({ptr}, 0x66)") == 0
    assert not w.log.calls("cuMemFree_v2")  # a capturing stream cannot be waited for
    w.call("shim.release()")
    assert after(w.log.names(), "cuLaunchKernel") == ["cuCtxSynchronize", "cuMemFree_v2"]


def regrant(scheduler, w) -> None:
    """w is evicted for a next holder that needs the room, asks again and is granted (which
    restores); w's call log starts at its asking again."""
    with other_client(scheduler, "next", 6 * GiB) as next_holder:
        next_holder.acquire(timeout=10)
        w.log.clear()
        launch = w.start("d.launch()")
        wait_for_status(scheduler.socket, lambda doc: state_in(doc, w) == "waiting",
                        what="the shim to queue again")
        next_holder.release()
        assert launch.result() == 0


def test_restore_by_fault_moves_nothing_back_on_a_grant(scheduler, workload) -> None:
    w = workload(KIWI_SOCKET=scheduler.socket, KIWI_RESTORE="fault")
    hold_with(w, scheduler, 6 * GiB)
    regrant(scheduler, w)
    assert not w.log.calls("cuMemPrefetchAsync")
    assert w.stats()["restores"] == 0


def test_the_shim_registers_with_its_name_pool_priority_and_pod(scheduler, workload) -> None:
    w = workload(KIWI_SOCKET=scheduler.socket, KIWI_CLIENT_NAME='kernel "quoted" \\ name',
                 KIWI_POOL="training", KIWI_PRIORITY="LOW", KIWI_POD_NAME="jupyter-ann",
                 KIWI_POD_NAMESPACE="team-a")
    w.call("d.alloc(1024)")
    client = wait_for_status(scheduler.socket, lambda doc: row_in(doc, w),
                             what="the shim to register")
    assert client["name"] == 'kernel "quoted" \\ name'
    assert (client["pool"], client["priority"]) == ("training", "LOW")
    # The pod's labels travel too (the status shows them to the peer's own user and root).
    assert client["labels"] == {"pod": "jupyter-ann", "namespace": "team-a"}


@pytest.mark.slow
def test_launches_from_many_threads_survive_repeated_handoffs(scheduler, workload) -> None:
    w = workload(KIWI_SOCKET=scheduler.socket, FAKE_CUDA_LAUNCH_SECONDS="0.002")
    w.call("d.alloc(6 * 1024 ** 3)")
    storm = w.start("launch_storm(8, 200)")
    with other_client(scheduler, "rival", 6 * GiB) as rival:
        handoffs = 0
        while not storm.done():
            rival.acquire(timeout=20)
            rival.release()
            handoffs += 1
    assert storm.result(timeout=60) == []
    assert handoffs >= 2
    assert len(w.log.calls("cuLaunchKernel")) == 8 * 200
    stats = w.stats()
    assert stats["grants"] >= 2 and stats["drops"] >= 1
    # Every drop evicts; with the memory feature a hold may also end in a release the daemon
    # answers with evict, or in its evict event while idle: more ways out, each followed by a
    # grant that brings the memory back, but the last (the rival's final turn may ask for it).
    assert stats["drops"] <= stats["evictions"] <= stats["grants"] + 1
    assert stats["restores"] == stats["grants"]  # every grant restores


def test_a_mode_change_reaches_the_shim(scheduler, workload) -> None:
    w = workload(KIWI_SOCKET=scheduler.socket)
    w.call("d.alloc(1024)")
    wait_for(lambda: w.stats()["mode"] == "on", what="the shim to register")
    with Client(scheduler.socket, register=False) as admin:
        admin.set_mode("off")
    wait_for(lambda: w.stats()["mode"] == "off", what="the mode event")


def test_a_release_later_than_the_grace_is_revoked_and_the_shim_carries_on(
        start_daemon, workload) -> None:
    scheduler = start_daemon("--tq", "0.05", "--gpus", "1", "--grace", "0.2")
    w = workload(KIWI_SOCKET=scheduler.socket, FAKE_CUDA_LAUNCH_SECONDS="1.0")
    assert w.call("d.launch()") == 0
    slow = w.start("d.launch()")  # in flight for a second: the drain outlasts the grace
    wait_for(lambda: w.stats()["in_flight"] == 1, what="the slow launch to be inside the gate")
    with other_client(scheduler, "impatient") as impatient:
        impatient.acquire(timeout=10)
        impatient.release()
    assert slow.result() == 0
    wait_for(lambda: w.stats()["revokes"] == 1, what="the revoked event")
    assert w.call("d.launch()") == 0
    assert state_of(scheduler, w) == "holding"


def test_a_drop_during_graph_capture_waits_for_the_capture_to_end(scheduler, workload) -> None:
    """Synchronizing while a capture is open would invalidate it (global capture mode): the
    release waits for cuStreamEndCapture, and the capture ends intact."""
    w = workload(KIWI_SOCKET=scheduler.socket)
    assert w.call("d.launch()") == 0
    assert w.call("d.begin_capture(0x66)") == 0
    with other_client(scheduler, "next") as next_holder:
        acquiring = threading.Thread(target=next_holder.acquire, kwargs={"timeout": 20})
        acquiring.start()
        wait_for(lambda: w.stats()["drops"] == 1, what="the drop to reach the shim")
        assert not w.log.calls("cuCtxSynchronize")
        assert state_of(scheduler, w) == "holding" and w.call("shim.holding") is True
        assert w.call("d.end_capture(0x66)") == 0  # not invalidated
        acquiring.join(timeout=20)
        assert next_holder.holding
    names = w.log.names()
    assert names.index("cuStreamEndCapture") < names.index("cuCtxSynchronize")
    assert "invalidated-capture" not in "".join(w.log.calls("cuCtxSynchronize"))


def test_a_cell_end_during_graph_capture_releases_when_the_capture_ends(
        long_quantum, workload) -> None:
    w = workload(KIWI_SOCKET=long_quantum.socket)
    w.call("shim.cell_begin()")
    assert w.call("d.launch()") == 0
    assert w.call("d.begin_capture(0, name='cuStreamBeginCapture_ptsz')") == 0
    w.call("shim.release()")
    assert w.call("shim.holding") is True
    assert not w.log.calls("cuCtxSynchronize")
    assert w.call("d.end_capture(0, name='cuStreamEndCapture_ptsz')") == 0
    wait_for_status(long_quantum.socket, lambda doc: state_in(doc, w) == "idle",
                    what="the deferred release")
    assert w.stats()["releases"] == 1


def test_a_failed_synchronize_is_not_a_release(long_quantum, workload) -> None:
    """Work may still be running when cuCtxSynchronize fails: the GPU is not handed over."""
    w = workload(KIWI_SOCKET=long_quantum.socket, FAKE_CUDA_SYNC_ERROR="700")
    w.call("shim.cell_begin()")
    assert w.call("d.launch()") == 0
    w.call("shim.release()")
    assert w.log.calls("cuCtxSynchronize")
    assert w.call("shim.holding") is True
    assert state_of(long_quantum, w) == "holding"
    assert w.stats()["releases"] == 0
    wait_for(lambda: any("not releasing the GPU" in line for line in w.stderr),
             what="the shim to say why it keeps the GPU")


def test_a_free_waits_while_the_working_set_is_moving(scheduler, workload, tmp_path) -> None:
    """No prefetch may name an address that is freed, or freed and handed out again, while
    the eviction runs: the free waits for it."""
    transfer_done = tmp_path / "transfer-done"
    w = workload(KIWI_SOCKET=scheduler.socket, FAKE_CUDA_STREAM_SYNC_GATE=str(transfer_done))
    first, _ = w.call(f"[d.alloc({3 * GiB}), d.alloc({3 * GiB})]")
    assert w.call("d.launch()") == 0
    wait_for_status(scheduler.socket, lambda doc: working_set_in(doc, w) == 6 * GiB,
                    what="the working set report")
    w.log.clear()  # the grant's restore is over
    with other_client(scheduler, "next", 6 * GiB) as next_holder:
        acquiring = threading.Thread(target=next_holder.acquire, kwargs={"timeout": 20})
        acquiring.start()
        wait_for(lambda: w.log.calls("cuStreamSynchronize"), what="the eviction to start")
        freeing = w.start(f"d.free({first})")
        with pytest.raises(AssertionError):
            wait_for(freeing.done, timeout=0.5, what="the free (it must wait)")
        assert not w.log.calls("cuMemFree_v2")
        transfer_done.touch()
        assert freeing.result() == 0
        acquiring.join(timeout=20)
    names = w.log.names()
    assert names.index("cuMemFree_v2") > names.index("cuStreamSynchronize")
    assert w.stats()["working_set"] == 3 * GiB


def test_a_release_leaves_a_destroyed_context_alone(scheduler, workload) -> None:
    w = workload(KIWI_SOCKET=scheduler.socket)
    w.call("shim.cell_begin()")
    w.call("d.set_context(0xABC)")
    w.call("d.alloc(1024)")
    assert w.call("d.launch()") == 0
    assert w.call("d.destroy_context(0xABC)") == 0
    w.call("d.alloc(1024)")  # in the primary context, current again
    w.call("shim.release()")
    synchronized = w.log.calls("cuCtxSynchronize")
    assert synchronized and not any("ctx=0xabc" in line for line in synchronized)


def test_ctrl_c_ends_a_wait_for_the_gpu(scheduler, workload, holder) -> None:
    """A cell waiting for the GPU waits in C; Ctrl-C must end that wait, not only be noted for
    when the call returns. (The issue's bound is 100 ms; measured, not asserted, here.)"""
    w = workload(KIWI_SOCKET=scheduler.socket)
    holder.acquire(timeout=5)
    result = w.call("interrupted_launch()", timeout=5)
    assert result["interrupted"]  # the launch's own error is superseded by the interrupt
    assert not w.log.calls("cuLaunchKernel")
    assert holder.holding


def test_an_interrupt_ends_an_eager_acquire(scheduler, workload, holder) -> None:
    w = workload(KIWI_SOCKET=scheduler.socket)
    holder.acquire(timeout=5)
    waiting = w.start("shim.acquire(30)")
    wait_for_status(scheduler.socket, lambda doc: state_in(doc, w) == "waiting",
                    what="the shim to queue")
    w.call("shim.interrupt()")
    assert waiting.result(timeout=5) is False


def test_the_shim_registers_the_uuid_of_its_gpu(scheduler, workload) -> None:
    """The daemon matches the GPU by UUID where it knows UUIDs: indices differ between the node
    and a container, UUIDs do not."""
    w = workload(KIWI_SOCKET=scheduler.socket, KIWI_SHIM_LOG="1", CUDA_VISIBLE_DEVICES="",
                 NVIDIA_VISIBLE_DEVICES="")
    w.call("d.alloc(1024)")
    wait_for_status(scheduler.socket, lambda doc: row_in(doc, w), what="the shim to register")
    register = w.said('"op":"register"')[0]  # stderr is read on a thread of its own
    assert '"gpu_uuid":"GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"' in register
    assert w.stats()["gpu_uuid"] == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"


def test_every_grant_restores_the_working_set(scheduler, workload) -> None:
    """The driver may push pages out by itself while others hold the GPU, so a grant restores
    whether or not the shim evicted."""
    w = workload(KIWI_SOCKET=scheduler.socket)
    hold_with(w, scheduler, 1 * GiB)
    with other_client(scheduler, "small", 1 * GiB) as small:
        small.acquire(timeout=10)  # fits beside: nothing evicted
        launch = w.start("d.launch()")
        wait_for_status(scheduler.socket, lambda doc: state_in(doc, w) == "waiting",
                        what="the shim to queue again")
        small.release()
        assert launch.result() == 0
    names = w.log.names()
    assert "cuMemPrefetchAsync" in names[:names.index("cuLaunchKernel")]
    assert prefetch_devices(w.log.calls("cuMemPrefetchAsync")) == [0, 0]
    assert w.stats()["evictions"] == 0


def test_an_eviction_trims_the_managed_pools_then_moves_their_allocations(
        scheduler, workload) -> None:
    """What a pool keeps for reuse goes back to the driver rather than to host memory."""
    w = workload(KIWI_SOCKET=scheduler.socket, FAKE_CUDA_MANAGED_POOLS="1")
    w.call(f"[d.alloc_async({3 * GiB}), d.alloc_async({3 * GiB})]")
    assert w.call("d.launch()") == 0
    wait_for_status(scheduler.socket, lambda doc: working_set_in(doc, w) == 6 * GiB,
                    what="the working set report")
    w.log.clear()
    with other_client(scheduler, "next", 6 * GiB) as next_holder:
        next_holder.acquire(timeout=10)
        names = w.log.names()
    evicting = after(names, "cuCtxSynchronize")
    assert evicting[:3] == ["cuMemPoolTrimTo", "cuMemPrefetchAsync", "cuMemPrefetchAsync"]
    assert prefetch_devices(w.log.calls("cuMemPrefetchAsync")) == [-1, -1]
    assert w.stats()["bytes_evicted"] == 6 * GiB


def test_where_the_driver_batches_an_eviction_is_one_prefetch_per_context(
        scheduler, workload) -> None:
    w = workload(KIWI_SOCKET=scheduler.socket, FAKE_CUDA_PREFETCH_BATCH="1")
    own_stream = hold_with(w, scheduler, 6 * GiB)
    with other_client(scheduler, "next", 6 * GiB) as next_holder:
        next_holder.acquire(timeout=10)
        names = w.log.names()
    assert after(names, "cuCtxSynchronize") == ["cuMemPrefetchBatchAsync", "cuStreamSynchronize"]
    batch = w.log.calls("cuMemPrefetchBatchAsync")[0]
    assert f"count=2 bytes={6 * GiB} locations=1 device=-1 flags=0 stream={own_stream}" in batch
    assert not w.log.calls("cuMemPrefetchAsync")
    assert w.stats()["bytes_evicted"] == 6 * GiB


def test_a_context_the_driver_says_is_gone_does_not_hold_a_release_up(long_quantum,
                                                                      workload) -> None:
    """Ended by a path the shim does not see (CUDA_ERROR_INVALID_CONTEXT): no work of it can
    still run, so it is no reason to keep the GPU."""
    w = workload(KIWI_SOCKET=long_quantum.socket, FAKE_CUDA_SYNC_ERROR="201")
    w.call("shim.cell_begin()")
    assert w.call("d.launch()") == 0
    w.call("shim.release()")
    wait_for_status(long_quantum.socket, lambda doc: state_in(doc, w) == "idle", what="the release")
    assert w.stats()["releases"] == 1


def test_a_waiting_shim_follows_its_queue_position_from_the_daemons_events(
        long_quantum, workload) -> None:
    w = workload(KIWI_SOCKET=long_quantum.socket)
    with Client(long_quantum.socket, name="holder") as holder, \
            Client(long_quantum.socket, name="first") as first:
        holder.acquire(timeout=5)
        wait_on_client(first, lambda: first.connected, what="the first waiter's connection")
        first.request()
        wait_on_client(first, lambda: first.position == 1, what="the first waiter in the queue")
        launch = w.start("d.launch()")
        wait_for(lambda: w.stats()["queue_position"] == 2, what="the shim's place in the queue")
        assert w.stats()["position_live"] is True  # its hello asked for position events
        first.release()  # withdraws: the shim moves up without asking anything
        wait_for(lambda: w.stats()["queue_position"] == 1, what="the position event")
        holder.release()
        assert launch.result() == 0
        assert w.stats()["queue_position"] == 0  # a holder has no place in the queue
