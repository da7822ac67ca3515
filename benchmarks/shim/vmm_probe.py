"""The device probe for the vmm evictor (issue 30; ../shared/design/gpu-memory-swap.md, section
8, "Build and proof order", step 1): ``python -m benchmarks.shim.vmm_probe [--gib 16]``.

One process, the CUDA driver alone (ctypes, no PyTorch, no shim), NVML's used memory read before
and after each step:

- (a) the floor: pinned ``cuMemcpy`` device to host and back, best of 3;
- (b) ``cuMemCreate`` + ``cuMemMap`` + ``cuMemSetAccess`` of the working set as 2 MiB, 20 MiB,
  256 MiB and whole handles, then ``cuMemUnmap`` + ``cuMemRelease``, each timed;
- (c) after each release: what NVML and ``cuMemGetInfo`` say came free;
- (d) VMM memory evicted to a registered shadow on 1, 2 and 4 streams (each chunk unmapped and
  released as its copy completes), then restored, pipelined per chunk (create, map, access,
  copy), the card's memory freed per NVML;
- (e) pinning: ``cuMemAllocHost`` against ``mmap`` + ``MADV_HUGEPAGE`` + a parallel fault +
  ``cuMemHostRegister``;
- (f) device to host and host to device at once, on two streams;
- (g) after every restore, the first and last word of each 2 MiB checked;
- (i) in a second process: ``cuMemGetInfo`` here after it prefetched managed memory to the CPU
  (does the card count the chunks UVM keeps?).

Every figure is set against the floor of the same run. It prints one Markdown table, row by row
as measured (a run cut off keeps its rows), and the verdicts of section 8 at the end. It never
allocates more than the card has free, nor pins more than the host has available: the working
set shrinks to fit (``--gib`` is the most). Without a CUDA driver or a GPU it says so and exits
0. Against the tests' fake driver (``LD_LIBRARY_PATH`` naming it) it runs whole, so its logic is
tested without a GPU; the fake's timings mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import mmap
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.shim.cuda import CU_DEVICE_CPU, Driver, DriverError, Nvml, Stream

GiB = 1 << 30
MiB = 1 << 20
BLOCK = 2 * MiB  # the unit the contents are checked in
HANDLE_SIZES = (("2 MiB", 2 * MiB), ("20 MiB", 20 * MiB), ("256 MiB", 256 * MiB), ("whole", 0))
#: Left free on the card and in host memory beside the working set.
HEADROOM = 2 * GiB
FAULT_THREADS = 8


@dataclass
class Floor:
    to_host: float  # bytes/s
    to_device: float


def pattern(block: int, round_: int) -> int:
    """A word that differs per 2 MiB block and per round, so a block lost, zeroed, misplaced
    or left over from an earlier round shows."""
    return ((block * 2654435761) ^ (round_ * 0x9E3779B9) ^ 0x5A5A5A5A) & 0xFFFFFFFF | 1


def working_set(wanted: int, card_free: int, host_available: int, unit: int) -> int:
    """The bytes the probe uses: at most wanted, leaving HEADROOM on the card and in host
    memory (which holds one copy: the shadow), in whole units; 0 when nothing fits."""
    room = min(wanted, card_free - HEADROOM, host_available - HEADROOM)
    return max(0, room // unit * unit)


def host_available() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def transparent_huge_pages() -> str:
    try:
        return Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()
    except OSError:
        return "unknown"


def gib(nbytes: float | None) -> str:
    return "n/a" if nbytes is None else f"{nbytes / GiB:.2f}"


class Table:
    """The report: printed line by line as measured (flushed), and kept."""

    HEADER = ("step", "GiB", "s", "GB/s", "vs floor", "NVML used before -> after (GiB)",
              "cuMemGetInfo free after (GiB)", "note")

    def __init__(self) -> None:
        self.lines: list[str] = []

    def say(self, *lines: str) -> None:
        for line in lines:
            self.lines.append(line)
            print(line, flush=True)

    def header(self) -> None:
        self.say("| " + " | ".join(self.HEADER) + " |", "|" + " --- |" * len(self.HEADER))

    def row(self, step: str, nbytes: int, seconds: float | None, floor: float | None,
            nvml: tuple[int | None, int | None], free: int | None, note: str = "") -> None:
        rate = nbytes / seconds if seconds else None
        cells = [step, f"{nbytes / GiB:.2f}", "" if seconds is None else f"{seconds:.3f}",
                 "" if rate is None else f"{rate / 1e9:.1f}",
                 "" if rate is None or not floor else f"{rate / floor:.2f}",
                 f"{gib(nvml[0])} -> {gib(nvml[1])}", gib(free), note]
        self.say("| " + " | ".join(cells) + " |")


class Probe:
    def __init__(self, driver: Driver, nvml: Nvml, nbytes: int, table: Table) -> None:
        self.driver, self.nvml, self.nbytes, self.table = driver, nvml, nbytes, table
        self.stream = driver.stream()
        self.floor = Floor(0.0, 0.0)
        self.shadow: mmap.mmap | None = None
        self._shadow_view: ctypes.c_char | None = None  # holds the map's buffer for ctypes
        self.shadow_address = 0
        self.pinning_s = 0.0
        self.verdicts: dict[str, str] = {}

    def free_now(self) -> int:
        return self.driver.mem_info()[0]

    @contextlib.contextmanager
    def nvml_around(self) -> Iterator[list[int | None]]:
        """[before, after] NVML used, filled around the block."""
        reading = [self.nvml.used(), None]
        yield reading
        reading[1] = self.nvml.used()

    def _best(self, copy: Callable[[], None]) -> float:
        copy()
        self.driver.sync(self.stream)
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            copy()
            self.driver.sync(self.stream)
            best = min(best, time.perf_counter() - started)
        return best

    # (a), and (e)'s first half
    def measure_floor(self) -> None:
        n, d = self.nbytes, self.driver
        with self.nvml_around() as used:
            started = time.perf_counter()
            pinned = d.alloc_pinned(n)
            self.pinning_s = time.perf_counter() - started
        self.table.row("(e) cuMemAllocHost", n, self.pinning_s, None, (used[0], used[1]),
                       None, "pinned by the driver (what a swap-time pin costs)")
        try:
            device = d.alloc_device(n)
            try:
                with self.nvml_around() as used:
                    out = self._best(lambda: d.to_host(pinned, device, n, self.stream))
                    back = self._best(lambda: d.to_device(device, pinned, n, self.stream))
            finally:
                d.free(device)
        finally:
            d.free_pinned(pinned)
        self.floor = Floor(n / out, n / back)
        free = self.free_now()
        self.table.row("(a) pinned cuMemcpy D->H, best of 3", n, out, self.floor.to_host,
                       (used[0], used[1]), free, "the floor")
        self.table.row("(a) pinned cuMemcpy H->D, best of 3", n, back, self.floor.to_device,
                       (used[0], used[1]), free, "the floor")

    # (e)'s second half: the shadow the eviction rows copy into
    def build_shadow(self) -> None:
        n = self.nbytes
        started = time.perf_counter()
        shadow = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        advised = hasattr(mmap, "MADV_HUGEPAGE")
        if advised:
            shadow.madvise(mmap.MADV_HUGEPAGE)
        view = ctypes.c_char.from_buffer(shadow)
        address = ctypes.addressof(view)
        mapped = time.perf_counter()
        threads = min(FAULT_THREADS, os.cpu_count() or 1)
        part = -(-n // threads) // BLOCK * BLOCK or n
        workers = [threading.Thread(target=ctypes.memset,
                                    args=(address + start, 0, min(part, n - start)))
                   for start in range(0, n, part)]
        for worker in workers:  # ctypes lets go of the GIL: the pages fault in parallel
            worker.start()
        for worker in workers:
            worker.join()
        faulted = time.perf_counter()
        with self.nvml_around() as used:
            self.driver.register(address, n)
        registered = time.perf_counter()
        self.shadow, self._shadow_view, self.shadow_address = shadow, view, address
        total = registered - started
        self.table.row(
            "(e) mmap + MADV_HUGEPAGE + parallel fault + cuMemHostRegister", n, total, None,
            (used[0], used[1]), None,
            f"fault {faulted - mapped:.3f} s on {len(workers)} threads, register "
            f"{registered - faulted:.3f} s{'' if advised else ', no MADV_HUGEPAGE here'}; "
            f"{total / self.pinning_s:.2f}x cuMemAllocHost's time")
        self.verdicts["(e) the shadow"] = (
            "mmap + cuMemHostRegister" if total < self.pinning_s else "cuMemAllocHost")

    def drop_shadow(self) -> None:
        if self.shadow is not None:
            self.driver.unregister(self.shadow_address)
            self.shadow_address = 0
            self._shadow_view = None  # the buffer exported to ctypes goes before the map
            self.shadow.close()
            self.shadow = None

    # (b) and (c)
    def map_and_release(self, label: str, handle_size: int) -> None:
        d, size = self.driver, handle_size or self.nbytes
        count = self.nbytes // size
        if count == 0:
            self.table.row(f"(b) create+map+access, {label} handles", 0, None, None,
                           (None, None), None, "larger than the working set: skipped")
            return
        nbytes = count * size
        va = d.reserve(nbytes)
        handles = []
        try:
            with self.nvml_around() as mapped_used:
                started = time.perf_counter()
                for i in range(count):
                    handle = d.create(size)
                    handles.append(handle)
                    d.map(va + i * size, size, handle)
                    d.set_access(va + i * size, size)
                map_s = time.perf_counter() - started
            self.table.row(f"(b) create+map+access, {count} x {label}", nbytes, map_s, None,
                           (mapped_used[0], mapped_used[1]), self.free_now(),
                           f"{map_s / count * 1e6:.0f} us a handle")
            free_mapped = self.free_now()
            with self.nvml_around() as released_used:
                started = time.perf_counter()
                for i, handle in enumerate(handles):
                    d.unmap(va + i * size, size)
                    d.release(handle)
                release_s = time.perf_counter() - started
            handles = []
            free_after = self.free_now()
            came_free = free_after - free_mapped
            nvml_freed = (None if released_used[0] is None or released_used[1] is None
                          else released_used[0] - released_used[1])
            self.table.row(
                f"(b, c) unmap+release, {count} x {label}", nbytes, release_s, None,
                (released_used[0], released_used[1]), free_after,
                f"{release_s / count * 1e6:.0f} us a handle; freed: cuMemGetInfo "
                f"{came_free / nbytes:.0%}" + ("" if nvml_freed is None
                                                else f", NVML {nvml_freed / nbytes:.0%}"))
            freed = min(came_free, nvml_freed if nvml_freed is not None else came_free)
            if "(c) freed after release" not in self.verdicts or freed < nbytes * 0.95:
                self.verdicts["(c) freed after release"] = (
                    "pass" if freed >= nbytes * 0.95 else f"FAIL ({freed / nbytes:.0%})")
        finally:
            for i, handle in enumerate(handles):  # a failure half way: give it all back
                with contextlib.suppress(DriverError):
                    d.unmap(va + i * size, size)
                    d.release(handle)
            d.free_reservation(va, nbytes)

    # (d), (f) and (g)
    def evict_and_restore(self, stream_counts: Sequence[int], chunk: int) -> None:
        d, n = self.driver, self.nbytes
        chunks = [(offset, min(chunk, n - offset)) for offset in range(0, n, chunk)]
        va = d.reserve(n)
        resident = set()
        streams = [d.stream() for _ in range(max(stream_counts))]
        events = [d.event() for _ in chunks]
        try:
            for offset, size in chunks:
                d.back(va + offset, size)
                resident.add(offset)
            best = {"out": 0.0, "in": 0.0}
            for round_, count in enumerate(stream_counts, start=1):
                self.fill(va, round_)
                free_before = self.free_now()
                with self.nvml_around() as used:
                    started = time.perf_counter()
                    for i, (offset, size) in enumerate(chunks):
                        stream = streams[i % count]
                        d.to_host(self.shadow_address + offset, va + offset, size, stream)
                        d.record(events[i], stream)
                    for i, (offset, size) in enumerate(chunks):
                        d.wait_event(events[i])  # this chunk is out: free its memory
                        d.unmap(va + offset, size)
                        resident.discard(offset)
                    evict_s = time.perf_counter() - started
                free_after = self.free_now()
                freed = None if used[0] is None or used[1] is None else used[0] - used[1]
                self.table.row(
                    f"(d) evict to the registered shadow, {count} stream(s)", n, evict_s,
                    self.floor.to_host, (used[0], used[1]), free_after,
                    f"{len(chunks)} chunks of {chunk // MiB} MiB, each unmapped and released "
                    f"as its copy completes; freed: cuMemGetInfo "
                    f"{(free_after - free_before) / n:.0%}"
                    + ("" if freed is None else f", NVML {freed / n:.0%}"))
                came_free = min(free_after - free_before, n if freed is None else freed)
                if came_free < 0.95 * n:
                    self.verdicts["(d) freed by the eviction"] = f"FAIL ({came_free / n:.0%})"

                started = time.perf_counter()
                for i, (offset, size) in enumerate(chunks):
                    d.back(va + offset, size)  # while the chunks before it are copied in
                    resident.add(offset)
                    d.to_device(va + offset, self.shadow_address + offset, size,
                                streams[i % count])
                for stream in streams[:count]:
                    d.sync(stream)
                restore_s = time.perf_counter() - started
                bad = self.check(va, round_)
                self.table.row(
                    f"(d, g) restore, pipelined per chunk, {count} stream(s)", n, restore_s,
                    self.floor.to_device, (used[1], self.nvml.used()), self.free_now(),
                    f"contents: {'intact' if not bad else f'**{bad} blocks WRONG**'} "
                    f"({n // BLOCK} blocks, first and last word)")
                best["out"] = max(best["out"], n / evict_s / self.floor.to_host)
                best["in"] = max(best["in"], n / restore_s / self.floor.to_device)
                if bad:
                    self.verdicts["(g) contents"] = f"FAIL ({bad} blocks wrong)"
            self.verdicts.setdefault("(g) contents", "pass")
            self.verdicts.setdefault("(d) freed by the eviction", "pass (>= 95% each round)")
            verdict = "pass" if min(best.values()) >= 0.8 else "FAIL"
            self.verdicts["(d) >= 0.8 of (a) both ways"] = (
                f"{verdict} (best: out {best['out']:.2f}, in {best['in']:.2f})")
            self.both_ways(va, streams[:2])
        finally:
            for offset, size in chunks:
                if offset in resident:
                    with contextlib.suppress(DriverError):
                        d.unmap(va + offset, size)
            for event in events:
                d.destroy_event(event)
            d.free_reservation(va, n)

    def fill(self, va: int, round_: int) -> None:
        for block in range(self.nbytes // BLOCK):
            self.driver.memset32(va + block * BLOCK, pattern(block, round_), BLOCK // 4,
                                 self.stream)
        self.driver.sync(self.stream)

    def check(self, va: int, round_: int) -> int:
        """Blocks whose first or last word is not the round's pattern."""
        bad = 0
        for block in range(self.nbytes // BLOCK):
            expected = pattern(block, round_)
            start = va + block * BLOCK
            if (self.driver.read_word(start) != expected
                    or self.driver.read_word(start + BLOCK - 4) != expected):
                bad += 1
        return bad

    def both_ways(self, va: int, streams: list[Stream]) -> None:
        """(f): the first half out while the second comes in, on two streams."""
        d, half = self.driver, self.nbytes // 2 // BLOCK * BLOCK
        if half == 0 or len(streams) < 2:
            return
        with self.nvml_around() as used:
            started = time.perf_counter()
            d.to_host(self.shadow_address, va, half, streams[0])
            d.to_device(va + half, self.shadow_address + half, half, streams[1])
            d.sync(streams[0])
            d.sync(streams[1])
            both_s = time.perf_counter() - started
        one_way = (self.floor.to_host + self.floor.to_device) / 2
        self.table.row("(f) D->H and H->D at once, two streams", 2 * half, both_s, one_way,
                       (used[0], used[1]), self.free_now(),
                       "vs floor: against one direction alone (2.00 = both at full speed)")

    # (i)
    def managed_elsewhere(self, nbytes: int) -> None:
        """Another process holds managed memory on the GPU, then prefetches it to the CPU:
        does this process's cuMemGetInfo see the card free again?"""
        child = subprocess.Popen([sys.executable, "-m", "benchmarks.shim.vmm_probe",
                                  "--managed-child", str(nbytes)], text=True,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert child.stdin and child.stdout
        try:
            before, nvml_before = self.free_now(), self.nvml.used()
            if child.stdout.readline().strip() != "resident":
                raise RuntimeError("the managed-memory process did not start")
            resident, nvml_resident = self.free_now(), self.nvml.used()
            child.stdin.write("prefetch\n")
            child.stdin.flush()
            if child.stdout.readline().strip() != "prefetched":
                raise RuntimeError("the managed-memory process did not prefetch")
            prefetched, nvml_prefetched = self.free_now(), self.nvml.used()
        finally:
            child.stdin.close()
            child.wait(60)
        taken, back = before - resident, prefetched - resident
        self.table.row(
            "(i) cuMemGetInfo here while another process's managed memory is on the GPU, "
            "then prefetched to the CPU", nbytes, None, None, (nvml_resident, nvml_prefetched),
            prefetched,
            f"free fell by {taken / GiB:.2f} GiB, then came back by {back / GiB:.2f} GiB "
            f"(NVML before it all: {gib(nvml_before)})")
        counted = ("unclear (the managed memory never showed as used)" if taken < nbytes // 2
                   else "yes" if back < 0.05 * taken else "no")
        self.verdicts["(i) managed memory prefetched out still counts as used"] = counted


def managed_child(nbytes: int) -> int:
    """(i)'s other process: managed memory made resident on the GPU, then prefetched out."""
    driver = Driver()
    stream = driver.stream()
    ptr = driver.alloc_managed(nbytes)
    driver.memset32(ptr, 0x1234, nbytes // 4, stream)  # its pages now on the GPU
    driver.sync(stream)
    print("resident", flush=True)
    if sys.stdin.readline().strip() != "prefetch":
        return 1
    driver.prefetch(ptr, nbytes, CU_DEVICE_CPU, stream)
    driver.sync(stream)
    print("prefetched", flush=True)
    sys.stdin.readline()  # until the probe has read the card
    driver.free(ptr)
    return 0


def parse_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"stream counts are whole numbers: {text!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"stream counts are 1 or more: {text!r}")
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shim.vmm_probe",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=16.0,
                        help="the working set at most, in GiB (default 16; less where the card "
                        "or the host has less free)")
    parser.add_argument("--streams", type=parse_counts, default=(1, 2, 4),
                        help="the eviction rounds' stream counts (default 1,2,4)")
    parser.add_argument("--chunk-mib", type=int, default=256,
                        help="the eviction's chunk (one handle each), MiB (default 256)")
    parser.add_argument("--no-managed", action="store_true", help="leave out (i)")
    parser.add_argument("--out", type=Path, help="also write the report here")
    parser.add_argument("--managed-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.managed_child:
        return managed_child(args.managed_child)
    table = Table()
    table.say("## VMM device probe (design step 1)", "")
    try:
        driver = Driver()
    except (OSError, DriverError) as exc:
        table.say(f"Skipped: no usable CUDA driver or GPU ({exc}).")
        return finish(table, args.out)
    nvml = Nvml()
    card_free, card_total = driver.mem_info()
    table.say(f"{driver.name()}, driver API {driver.version}, {time.strftime('%Y-%m-%d')}; "
              f"{card_free / GiB:.1f} of {card_total / GiB:.1f} GiB free; transparent huge "
              f"pages: {transparent_huge_pages()}; NVML: "
              f"{'yes' if nvml.present else 'not here (its columns say n/a)'}.", "")
    if not driver.vmm_supported():
        table.say("Skipped: the device says it does not support virtual memory management "
                  "(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is 0).")
        return finish(table, args.out)
    granularity = driver.granularity()
    chunk = max(granularity, args.chunk_mib * MiB // granularity * granularity)
    nbytes = working_set(int(args.gib * GiB), card_free, host_available(), BLOCK)
    if nbytes < BLOCK:
        table.say(f"Skipped: the card ({card_free / GiB:.1f} GiB free) or the host "
                  f"({host_available() / GiB:.1f} GiB available) has no room beside "
                  f"{HEADROOM / GiB:.0f} GiB of headroom.")
        return finish(table, args.out)
    table.say(f"Working set {nbytes / GiB:.2f} GiB; granularity {granularity // MiB} MiB; "
              f"eviction chunks of {chunk // MiB} MiB.", "")
    table.header()
    probe = Probe(driver, nvml, nbytes, table)
    try:
        probe.measure_floor()
        probe.build_shadow()
        for label, size in HANDLE_SIZES:
            probe.map_and_release(label, size)
        probe.evict_and_restore(args.streams, min(chunk, nbytes))
        probe.drop_shadow()
        if not args.no_managed:
            probe.managed_elsewhere(min(4 * GiB, nbytes // 4) // BLOCK * BLOCK or BLOCK)
    except DriverError as exc:
        table.say("", f"**Stopped: {exc}.**")
    finally:
        probe.drop_shadow()
    table.say("", "Verdicts (design section 8, step 1):", "")
    for what, verdict in probe.verdicts.items():
        table.say(f"- {what}: {verdict}")
    return finish(table, args.out)


def finish(table: Table, out: Path | None) -> int:
    if out:
        out.write_text("\n".join(table.lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
