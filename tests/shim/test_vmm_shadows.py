"""The vmm evictor's host shadows and its moves against a driver whose streams and pinning take
the time they take (issue 39: defects 2, 2b, 2c, 3, 4, 5b and 12), over the fake driver
(tests/shim/fake_cuda.c, fake_streams.c) and the real daemon, or one scripted on a socket:

- shadows are pinned ahead only within a pin budget (the daemon's, else the shim's own), never
  past the process's own cgroup memory limit, and dropped for memory that is on the card when the
  room runs short;
- a forked child (a DataLoader's worker) gets no copy of them;
- no shadow is pinned while a graph capture begun in the global mode is open, nor while a move
  runs;
- an eviction copies only into pinned memory (a chunk without a pinned shadow goes through the
  staging ring), so the first eviction after the working set grew reaches the link too;
- live pieces side by side go out as one copy.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from scripted_daemon import ScriptedDaemon
from support import wait_for
from test_vmm_evictor import evicted_by_next, field, hold_with, holds, pattern, vmm

MiB = 1 << 20
GiB = 1 << 30


def registered(w) -> list[tuple[int, int]]:
    """(address, size) of each host range the shim pinned with cuMemHostRegister."""
    return [(int(field(line, "host"), 16), int(field(line, "size")))
            for line in w.log.calls("cuMemHostRegister_v2") if field(line, "result") == "0"]


def most_pinned_at_once(w) -> int:
    """The most bytes of host memory the shim had registered at any one time, by the log."""
    sizes: dict[str, int] = {}
    now = most = 0
    for line in w.log.lines():
        name = line.split(" ", 1)[0]
        if name == "cuMemHostRegister_v2" and field(line, "result") == "0":
            sizes[field(line, "host")] = int(field(line, "size"))
            now += sizes[field(line, "host")]
            most = max(most, now)
        elif name == "cuMemHostUnregister" and field(line, "result") == "0":
            now -= sizes.pop(field(line, "host"), 0)
    return most


def between(lines: list[str], first: str, last: str) -> list[str]:
    """The lines from the first whose name is first to the last whose name is last."""
    names = [line.split(" ", 1)[0] for line in lines]
    start = names.index(first)
    end = len(names) - 1 - names[::-1].index(last)
    return lines[start:end + 1]


# ---- fork -----------------------------------------------------------------------------------

def test_a_forked_child_gets_no_copy_of_the_shadows(workload, card) -> None:
    w = vmm(workload, card)
    w.call(f"d.alloc({8 * MiB})")
    wait_for(lambda: w.stats()["host_shadow_pinned"] >= 8 * MiB, what="the shadow to be pinned")
    pinned = [address for address, _ in registered(w)]
    assert pinned
    # Linux copies pinned pages into a child at once; MADV_DONTFORK leaves them out of it.
    assert w.call(f"mapped_in_a_forked_child({pinned})") == []


# ---- graph capture --------------------------------------------------------------------------

def test_no_shadow_is_pinned_while_a_global_capture_is_open(workload, card) -> None:
    w = vmm(workload, card, KIWI_SHIM_LOG="1")
    w.call(f"d.alloc({2 * MiB})")
    wait_for(lambda: w.stats()["host_shadow_pinned"] >= 2 * MiB, what="the first shadow")
    before = len(w.log.calls("cuMemHostRegister_v2"))
    assert w.call("d.begin_capture(0x66, 0)") == 0  # global, PyTorch's default
    w.call(f"d.alloc({8 * MiB})")  # the capture's own allocation wakes the builder
    wait_for(lambda: len(w.log.calls("cuMemHostRegister_v2")) > before
             or any("before pinning" in line for line in w.stderr),
             what="the builder to pin, or to say it waits for the capture")
    assert w.call("d.end_capture(0x66)") == 0  # the capture is intact
    wait_for(lambda: w.stats()["host_shadow_pinned"] >= 10 * MiB,
             what="the shadow, once the capture is over")


# ---- the budget and the cgroup --------------------------------------------------------------

def test_shadows_are_pinned_ahead_only_within_the_budget(scheduler, workload, card) -> None:
    w = vmm(workload, card, scheduler.socket, KIWI_VMM_PIN_BUDGET=str(40 * MiB))
    pointers = hold_with(w, scheduler, [16 * MiB] * 3)
    for i, ptr in enumerate(pointers):
        assert w.call(f"d.write({ptr + 15 * MiB}, {pattern(i, 64)!r})") == 0
    # The staging ring (a quarter of the budget, in whole 2 MiB slots: 8 MiB) and two shadows.
    wait_for(lambda: w.stats()["host_shadow_pinned"] + w.stats()["host_staging"] == 40 * MiB,
             what="40 MiB pinned")
    assert w.stats()["pin_budget"] == 40 * MiB
    evicted_by_next(scheduler, w)
    assert all(holds(w, ptr + 15 * MiB, pattern(i, 64)) for i, ptr in enumerate(pointers))
    assert most_pinned_at_once(w) == 40 * MiB


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[ScriptedDaemon]:
    scripted = ScriptedDaemon(tmp_path / "memory.sock")
    yield scripted
    scripted.close()


def test_the_daemon_sets_the_pin_budget(daemon, workload, card) -> None:
    daemon.registered_extra = {"pin_budget": 40 * MiB}
    w = vmm(workload, card, str(daemon.path))
    for _ in range(3):
        w.call(f"d.alloc({16 * MiB})")
    wait_for(lambda: w.stats()["pin_budget"] == 40 * MiB, what="the daemon's budget")
    wait_for(lambda: w.stats()["host_shadow_pinned"] + w.stats()["host_staging"] == 40 * MiB,
             what="40 MiB pinned")
    assert most_pinned_at_once(w) == 40 * MiB


def cgroup(tmp_path: Path, limit: int, used: int, version: int = 2) -> Path:
    directory = tmp_path / "cgroup"
    directory.mkdir(exist_ok=True)
    names = ("memory.max", "memory.current") if version == 2 else (
        "memory.limit_in_bytes", "memory.usage_in_bytes")
    (directory / names[0]).write_text(f"{limit}\n")
    (directory / names[1]).write_text(f"{used}\n")
    return directory


@pytest.mark.parametrize("version", [2, 1])
def test_pinning_never_takes_the_process_past_its_cgroups_memory_limit(
        workload, card, tmp_path: Path, version: int) -> None:
    directory = cgroup(tmp_path, GiB, GiB - 100 * MiB, version)
    w = vmm(workload, card, KIWI_CGROUP_DIR=str(directory))
    w.call(f"d.alloc({16 * MiB})")
    wait_for(lambda: any("memory limit" in line for line in w.stderr),
             what="the builder to say why it pins nothing")
    assert not w.log.calls("cuMemHostRegister_v2")
    cgroup(tmp_path, GiB, 100 * MiB, version)  # room now
    w.call(f"d.alloc({16 * MiB})")  # a change: the builder looks again
    wait_for(lambda: w.stats()["host_shadow_pinned"] == 32 * MiB, what="both shadows")


def test_shadows_of_memory_on_the_card_are_dropped_when_the_room_runs_short(
        workload, card, tmp_path: Path) -> None:
    directory = cgroup(tmp_path, GiB, 100 * MiB)
    w = vmm(workload, card, KIWI_CGROUP_DIR=str(directory))
    w.call(f"d.alloc({16 * MiB})")
    wait_for(lambda: w.stats()["host_shadow_pinned"] == 16 * MiB, what="the shadow")
    cgroup(tmp_path, GiB, GiB - 10 * MiB)  # the program's own memory grew
    wait_for(lambda: w.stats()["host_shadow"] == 0 and w.stats()["host_staging"] == 0,
             what="the shadows to be dropped")
    assert w.log.calls("cuMemHostUnregister")


# ---- the way out ------------------------------------------------------------------------------

def test_the_first_eviction_after_the_working_set_grew_copies_only_to_pinned_memory(
        scheduler, workload, card) -> None:
    # Pinning is slow here (0.8 s per 16 MiB): the eviction comes while the builder is still at
    # its first pinning, with three chunks to go.
    w = vmm(workload, card, scheduler.socket, KIWI_VMM_PIN_BUDGET=str(80 * MiB),
            FAKE_CUDA_PIN_GBPS="0.02")
    pointers = hold_with(w, scheduler, [16 * MiB] * 4)
    for i, ptr in enumerate(pointers):
        assert w.call(f"d.write({ptr + 15 * MiB}, {pattern(i, 64)!r})") == 0
    wait_for(lambda: w.log.calls("pinned"), what="the first pinning")
    w.log.clear()
    evicted_by_next(scheduler, w)
    assert w.stats()["evicted"] is True
    out = w.log.calls("cuMemcpyDtoHAsync_v2")
    assert out and not [line for line in out if "pageable=1" in line]
    assert all(holds(w, ptr + 15 * MiB, pattern(i, 64)) for i, ptr in enumerate(pointers))
    back = w.log.calls("cuMemcpyHtoDAsync_v2")
    assert back and not [line for line in back if "pageable=1" in line]


def test_nothing_is_pinned_while_a_move_runs(scheduler, workload, card) -> None:
    w = vmm(workload, card, scheduler.socket, FAKE_CUDA_PIN_GBPS="0.05")
    hold_with(w, scheduler, [16 * MiB] * 6)
    wait_for(lambda: w.log.calls("pinned"), what="pinning to be under way")
    w.log.clear()
    evicted_by_next(scheduler, w)
    w.call("d.launch()")  # and back
    lines = w.log.lines()
    for first, last in (("cuDeviceGraphMemTrim", "cuMemUnmap"),
                        ("cuMemCreate", "cuMemcpyHtoDAsync_v2")):
        move = between(lines, first, last)
        assert not [line for line in move if line.startswith(("pinning ", "pinned "))], move


def test_live_pieces_side_by_side_go_out_as_one_copy(scheduler, workload, card) -> None:
    w = vmm(workload, card, scheduler.socket)
    pointers = hold_with(w, scheduler, [4096] * 64)  # one slab, side by side
    assert max(pointers) - min(pointers) == 63 * 4096
    wait_for(lambda: w.stats()["host_shadow_pinned"] >= 2 * MiB, what="the slab's shadow")
    w.log.clear()
    evicted_by_next(scheduler, w)
    copy, = w.log.calls("cuMemcpyDtoHAsync_v2")
    assert int(field(copy, "n")) == 64 * 4096
    restored = [w.call("d.launch()")]
    assert restored == [0] and len(w.log.calls("cuMemcpyHtoDAsync_v2")) == 1
