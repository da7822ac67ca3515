"""The daemon unreachable: the fail policy decides, and the process never exits."""

from __future__ import annotations

NOT_READY = 802
NOWHERE = "/nonexistent/kiwi.sock"


def test_fail_open_lets_gpu_work_run_unscheduled(workload) -> None:
    w = workload(KIWI_SOCKET=NOWHERE, KIWI_FAIL_POLICY="open", KIWI_FAIL_TIMEOUT="0.1")
    assert w.call("d.launch()") == 0
    assert w.log.calls("cuLaunchKernel")
    stats = w.stats()
    assert stats["failed_open"] and not stats["connected"]


def test_fail_closed_refuses_gpu_work_and_keeps_the_process_alive(workload) -> None:
    w = workload(KIWI_SOCKET=NOWHERE, KIWI_FAIL_POLICY="closed", KIWI_FAIL_TIMEOUT="0.1")
    assert w.call("d.launch()") == NOT_READY
    assert w.call("d.launch()") == NOT_READY
    assert not w.log.calls("cuLaunchKernel")
    assert w.stats()["failed_closed"]
    assert w.process.poll() is None


def test_the_kernel_can_set_the_policy_through_the_api(workload) -> None:
    w = workload(KIWI_SOCKET=NOWHERE, KIWI_FAIL_POLICY="closed", KIWI_FAIL_TIMEOUT="0")
    assert w.call("d.launch()") == NOT_READY
    w.call("shim.set_policy(fail_closed=False, timeout=0)")
    assert w.call("d.launch()") == 0


def test_eager_acquire_reports_an_unreachable_daemon_under_fail_closed(workload) -> None:
    w = workload(KIWI_SOCKET=NOWHERE, KIWI_FAIL_POLICY="closed", KIWI_FAIL_TIMEOUT="0")
    assert "ConnectionError" in w.call("str(type(_err(lambda: shim.acquire(2))))")


def test_allocation_without_a_daemon_still_works(workload) -> None:
    w = workload(KIWI_SOCKET=NOWHERE, KIWI_FAIL_POLICY="closed", KIWI_FAIL_TIMEOUT="0")
    assert w.call("d.alloc_result(1024)") == 0
