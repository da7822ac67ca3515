"""Every way a process finds driver functions lands on the shim: dlsym, cuGetProcAddress and
cuGetProcAddress_v2, each default-stream flavour. Proven with the fail-closed policy and no
daemon: a gated call that reaches the shim is refused (CUDA_ERROR_SYSTEM_NOT_READY) and never
reaches the driver; one that bypassed the shim would reach the fake driver's log.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from cuda_toolkits import shim_hooks
from shim_harness import CudaLog, build_direct_program, preload

from kiwi_jupyter.shim import build

NOT_READY = 802
NO_DAEMON = {"KIWI_SOCKET": "/nonexistent/kiwi.sock", "KIWI_FAIL_POLICY": "closed",
             "KIWI_FAIL_TIMEOUT": "0"}


def test_dlsym_hands_out_the_hook_for_a_driver_allocation(workload) -> None:
    w = workload()
    w.call("d.alloc(1 << 20)")
    assert w.log.calls("cuMemAllocManaged")
    assert not w.log.calls("cuMemAlloc_v2")


@pytest.mark.parametrize("v2", [False, True], ids=["cuGetProcAddress", "cuGetProcAddress_v2"])
def test_get_proc_address_hands_out_the_hook(workload, v2: bool) -> None:
    w = workload()
    w.call(f"d.alloc(1 << 20, via={'proc_v2' if v2 else 'proc'!r})")
    assert w.log.calls("cuMemAllocManaged")
    assert not w.log.calls("cuMemAlloc_v2")


@pytest.mark.parametrize("v2", [False, True], ids=["cuGetProcAddress", "cuGetProcAddress_v2"])
@pytest.mark.parametrize("version", [11030, 12000])
def test_get_proc_address_fetched_through_itself_is_the_hook(workload, v2: bool,
                                                            version: int) -> None:
    # What a CUDA 12 runtime does: cuGetProcAddress from dlsym, then itself through itself.
    w = workload()
    fetched = f"d.proc('cuGetProcAddress', version={version}, v2={v2})"
    assert w.call(f"mapped_file({fetched})") == "libkiwishim.so"


@pytest.mark.parametrize("via", ["dlsym", "proc", "proc_v2"])
def test_a_launch_found_any_way_passes_the_gate(workload, via: str) -> None:
    w = workload(**NO_DAEMON)
    assert w.call(f"d.launch(via={via!r})") == NOT_READY
    assert not w.log.calls("cuLaunchKernel")


@pytest.mark.parametrize("via", ["dlsym", "proc", "proc_v2"])
def test_the_per_thread_default_stream_launch_passes_the_gate(workload, via: str) -> None:
    w = workload(**NO_DAEMON)
    assert w.call(f"d.launch(via={via!r}, per_thread=True)") == NOT_READY
    assert not w.log.calls("cuLaunchKernel_ptsz")


@pytest.mark.parametrize("call", ["d.launch_ex()", "d.launch_cooperative()", "d.graph_launch()",
                                  "d.memset(d.alloc(64))", "d.copy_to_device(d.alloc(64))"])
def test_every_kind_of_gpu_work_passes_the_gate(workload, call: str) -> None:
    w = workload(**NO_DAEMON)
    assert w.call(call) == NOT_READY
    names = w.log.names()
    assert not {"cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuGraphLaunch",
                "cuMemsetD8_v2", "cuMemcpyHtoD_v2"} & set(names)


@pytest.mark.parametrize("call", ["d.launch_ex()", "d.launch_cooperative()", "d.graph_launch()",
                                  "d.memset(d.alloc(64))", "d.copy_to_device(d.alloc(64))"])
def test_gated_work_reaches_the_driver_once_allowed(workload, call: str) -> None:
    w = workload(KIWI_SOCKET="/nonexistent/kiwi.sock", KIWI_FAIL_TIMEOUT="0")
    assert w.call(call) == 0
    assert {"cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuGraphLaunch",
            "cuMemsetD8_v2", "cuMemcpyHtoD_v2"} & set(w.log.names())


def driver_exports(library: Path) -> set[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(library)], check=True,
                         capture_output=True, text=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def gated_entry_points(fake_cuda: Path) -> list[str]:
    """Every entry point hooks.h gates; the fake driver has each."""
    gated = [h.symbol for h in shim_hooks(build.HERE / "hooks.h", "KIWI_GATED_HOOKS")]
    present = [name for name in gated if name in driver_exports(fake_cuda)]
    assert present == gated, f"the fake driver lacks {sorted(set(gated) - set(present))}"
    return present


def test_every_gated_entry_point_waits_at_the_gate(workload, fake_cuda: Path) -> None:
    names = gated_entry_points(fake_cuda)
    w = workload(**NO_DAEMON)
    results = w.call(f"{{name: d.bare(name) for name in {names!r}}}")
    assert results == dict.fromkeys(names, NOT_READY)
    assert not set(names) & set(w.log.names())


def test_every_gated_entry_point_reaches_the_driver_once_allowed(workload, fake_cuda: Path) -> None:
    names = gated_entry_points(fake_cuda)
    w = workload(KIWI_SOCKET="/nonexistent/kiwi.sock", KIWI_FAIL_TIMEOUT="0")
    results = w.call(f"{{name: d.bare(name) for name in {names!r}}}")
    assert results == dict.fromkeys(names, 0)
    assert set(names) <= set(w.log.names())


STREAM_MEMORY_OPERATIONS = [
    f"cuStream{op}{suffix}"
    for op in ("WriteValue32", "WriteValue64", "WaitValue32", "WaitValue64", "BatchMemOp")
    for suffix in ("", "_ptsz", "_v2", "_v2_ptsz")]


def test_stream_memory_operations_wait_at_the_gate(workload) -> None:
    """A stream write or wait touches device memory from a stream: GPU work like a memset."""
    w = workload(**NO_DAEMON)
    results = w.call(f"{{name: d.bare(name) for name in {STREAM_MEMORY_OPERATIONS!r}}}")
    assert results == dict.fromkeys(STREAM_MEMORY_OPERATIONS, NOT_READY)
    assert not set(STREAM_MEMORY_OPERATIONS) & set(w.log.names())


def test_an_internal_entry_point_is_hooked_by_name(workload) -> None:
    # The fake driver answers "cuMemGetInfo" with a function dlsym cannot see; the shim must
    # still hook it, so the limit shows.
    w = workload(KIWI_GPU_MEMORY_LIMIT="3GiB")
    assert w.call("d.mem_info(via='proc_v2')")[1] == 3 << 30
    # A per-thread-stream runtime asks with that flag even where no _ptds variant exists.
    assert w.call("d.mem_info(via='proc_v2', per_thread=True)")[1] == 3 << 30


def test_dlsym_answers_from_the_shim_for_hooked_symbols_only(workload) -> None:
    w = workload()
    assert w.call("mapped_file(d.lib.cuMemAlloc_v2)") == "libkiwishim.so"
    assert w.call("mapped_file(d.lib.cuLaunchKernel)") == "libkiwishim.so"
    assert w.call("mapped_file(d.lib.cuCtxSynchronize)") == "libcuda.so.1"
    assert w.call("mapped_file(d.lib.cuInit)") == "libcuda.so.1"


def test_shim_disabled_hands_out_the_driver_itself(workload) -> None:
    w = workload(KIWI_SHIM="0")
    assert w.call("shim.active()") is False
    assert w.call("mapped_file(d.lib.cuMemAlloc_v2)") == "libcuda.so.1"
    w.call("d.alloc(1 << 20)")
    assert w.call("d.launch()") == 0
    assert w.log.calls("cuMemAlloc_v2")
    assert not w.log.calls("cuMemAllocManaged")


def test_a_program_linked_against_libcuda_is_interposed(shim_library, fake_cuda,
                                                        tmp_path) -> None:
    program = build_direct_program(tmp_path, fake_cuda)
    log = CudaLog(tmp_path / "cuda.log")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("KIWI_")},
           **preload(shim_library), "FAKE_CUDA_LOG": str(log.path),
           "KIWI_SOCKET": "/nonexistent/kiwi.sock", "KIWI_FAIL_POLICY": "closed",
           "KIWI_FAIL_TIMEOUT": "0",
           "KIWI_EVICT": "managed"}  # as every workload here (shim_harness); vmm has its tests
    out = subprocess.run([str(program)], env=env, check=True, capture_output=True, text=True,
                         timeout=30).stdout.split()
    assert out == ["0", str(NOT_READY)]
    assert log.calls("cuMemAllocManaged") and not log.calls("cuMemAlloc_v2")
    assert not log.calls("cuLaunchKernel")


@pytest.mark.parametrize(("env", "gpu", "uuid"), [
    ({"CUDA_VISIBLE_DEVICES": "GPU-8f3a,GPU-77aa"}, 0, "GPU-8f3a"),
    ({"CUDA_VISIBLE_DEVICES": "MIG-5c1e-0001"}, 0, "MIG-5c1e-0001"),
    ({"NVIDIA_VISIBLE_DEVICES": "2,5", "CUDA_VISIBLE_DEVICES": "1"}, 5, None),
    ({"NVIDIA_VISIBLE_DEVICES": "GPU-aa,GPU-bb", "CUDA_VISIBLE_DEVICES": "1"}, 0, "GPU-bb"),
    ({"NVIDIA_VISIBLE_DEVICES": "3"}, 3, None),
    ({"NVIDIA_VISIBLE_DEVICES": "all", "CUDA_VISIBLE_DEVICES": "2"}, 2, None),
    ({"CUDA_VISIBLE_DEVICES": "2", "KIWI_GPU": "4"}, 4, None),
])
def test_the_gpu_is_read_from_the_visible_devices_by_index_or_uuid(
        workload, env: dict[str, str], gpu: int, uuid: str | None) -> None:
    w = workload(**{"CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "", **NO_DAEMON,
                    **env})
    stats = w.stats()
    assert (stats["gpu"], stats["gpu_uuid"]) == (gpu, uuid)
