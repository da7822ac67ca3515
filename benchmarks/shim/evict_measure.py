"""The GPU half of ``evict_variants``: the floor, then each strategy's rounds, each printed as
soon as it is measured. Needs a GPU; the arithmetic and the table are in ``evict_strategies``."""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import threading
import time
from collections.abc import Callable, Sequence

from benchmarks.shim.evict_driver import (
    CU_DEVICE_CPU,
    CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
    CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION,
    Driver,
    DriverError,
)
from benchmarks.shim.evict_strategies import (
    CHUNK_ALIGN,
    GiB,
    Round,
    Strategy,
    chunks,
    emit,
    floor_row,
    header,
    host_available,
    row,
    table_row,
    transparent_huge_pages,
    working_set,
)

Stream = ctypes.c_void_p


def pattern(block: int) -> int:
    """A word that differs per 2 MiB block, so a block lost, zeroed or misplaced shows."""
    return ((block * 2654435761) ^ 0x5A5A5A5A) & 0xFFFFFFFF | 1


class Bench:
    def __init__(self, driver: Driver, nbytes: int) -> None:
        self.driver, self.nbytes = driver, nbytes
        self.stream = driver.stream()
        self.streams: list[Stream] = []
        started = time.perf_counter()
        self.pinned = driver.alloc_pinned(nbytes)
        # A copying evictor needs such a buffer: what it costs to get one decides whether the
        # shim may allocate it per eviction or must keep it.
        self.pinning_s = time.perf_counter() - started
        self.pageable: mmap.mmap | None = None
        self.pageable_address = 0
        self.managed = 0

    # --- the floor ---------------------------------------------------------------------
    def floor(self) -> tuple[float, float]:
        """Bytes/s of a pinned cuMemcpy each way, from plain device memory (best of 3)."""
        device = self.driver.alloc_device(self.nbytes)
        try:
            out = self._best(lambda: self.driver.to_host(self.pinned, device, self.nbytes,
                                                         self.stream))
            back = self._best(lambda: self.driver.to_device(device, self.pinned, self.nbytes,
                                                            self.stream))
        finally:
            self.driver.free(device)
        return self.nbytes / out, self.nbytes / back

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

    # --- the buffer --------------------------------------------------------------------
    def fill(self) -> None:
        """Allocate (once) and write the pattern on the GPU, where the pages then live."""
        if not self.managed:
            self.managed = self.driver.alloc_managed(self.nbytes)
        for block, (ptr, size) in enumerate(chunks(self.managed, self.nbytes,
                                                   self.nbytes // CHUNK_ALIGN)):
            self.driver.memset32(ptr, pattern(block), size // 4, self.stream)
        self.driver.sync(self.stream)

    def intact(self) -> bool:
        """Copy the buffer out and look at the first and last word of every block."""
        self.driver.to_host(self.pinned, self.managed, self.nbytes, self.stream)
        self.driver.sync(self.stream)
        words = (ctypes.c_uint32 * (self.nbytes // 4)).from_address(self.pinned)
        per_block = CHUNK_ALIGN // 4
        for block in range(self.nbytes // CHUNK_ALIGN):
            expected = pattern(block)
            if words[block * per_block] != expected or \
                    words[(block + 1) * per_block - 1] != expected:
                return False
        return True

    def host_buffer(self, how: str) -> int:
        if how == "copy-pinned":
            return self.pinned
        if self.pageable is None:
            self.pageable = mmap.mmap(-1, self.nbytes)
            self.pageable_address = ctypes.addressof(ctypes.c_char.from_buffer(self.pageable))
        return self.pageable_address

    def streams_for(self, parts: int) -> list[Stream]:
        while len(self.streams) < parts:
            self.streams.append(self.driver.stream())
        return self.streams[:parts]

    # --- one round ---------------------------------------------------------------------
    def round(self, strategy: Strategy, number: int) -> Round:
        driver = self.driver
        driver.prefetch(self.managed, self.nbytes, driver.device, self.stream)  # all on the GPU
        driver.sync(self.stream)
        free_before, _ = driver.mem_info()
        started = time.perf_counter()
        call_s = self._evict(strategy)
        evict_s = time.perf_counter() - started
        free_after, _ = driver.mem_info()
        started = time.perf_counter()
        self._restore(strategy)
        restore_s = time.perf_counter() - started
        return Round(strategy.name, number, self.nbytes, evict_s, call_s,
                     free_after - free_before, restore_s, self.intact())

    def _evict(self, strategy: Strategy) -> float:
        """Returns how long the issuing calls held this thread."""
        driver, whole = self.driver, [(self.managed, self.nbytes)]
        if strategy.how == "prefetch":
            if strategy.advise:
                driver.advise(self.managed, self.nbytes, CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
                              CU_DEVICE_CPU)
            return self._prefetch(strategy, CU_DEVICE_CPU)
        host = self.host_buffer(strategy.how)
        started = time.perf_counter()
        driver.to_host(host, self.managed, self.nbytes, self.stream)
        if strategy.drop == "discard":
            driver.discard(whole, self.stream)
        else:
            driver.discard_and_prefetch(whole, CU_DEVICE_CPU, self.stream)
        call_s = time.perf_counter() - started
        driver.sync(self.stream)
        return call_s

    def _restore(self, strategy: Strategy) -> None:
        driver, whole = self.driver, [(self.managed, self.nbytes)]
        if strategy.how == "prefetch":
            if strategy.advise:
                driver.advise(self.managed, self.nbytes, CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION,
                              driver.device)
            self._prefetch(strategy, driver.device)
            return
        # The old contents are junk: new pages on the GPU without migrating them, then the copy.
        if driver.discard_and_prefetch_batch is not None:
            driver.discard_and_prefetch(whole, driver.device, self.stream)
        else:
            driver.prefetch(self.managed, self.nbytes, driver.device, self.stream)
        driver.to_device(self.managed, self.host_buffer(strategy.how), self.nbytes, self.stream)
        driver.sync(self.stream)

    def _prefetch(self, strategy: Strategy, to: int) -> float:
        pieces = chunks(self.managed, self.nbytes, strategy.parts)
        streams = self.streams_for(len(pieces))
        if strategy.threads:
            return self._prefetch_from_threads(pieces, streams, to)
        started = time.perf_counter()
        for (ptr, size), stream in zip(pieces, streams, strict=True):
            self.driver.prefetch(ptr, size, to, stream)
        call_s = time.perf_counter() - started
        for stream in streams:
            self.driver.sync(stream)
        return call_s

    def _prefetch_from_threads(self, pieces: Sequence[tuple[int, int]],
                               streams: Sequence[Stream], to: int) -> float:
        errors: list[BaseException] = []
        calls: list[float] = []

        def one(ptr: int, size: int, stream: Stream) -> None:
            try:
                self.driver.bind()
                started = time.perf_counter()
                self.driver.prefetch(ptr, size, to, stream)
                calls.append(time.perf_counter() - started)
                self.driver.sync(stream)
            except BaseException as exc:  # handed to the caller below
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(ptr, size, stream))
                   for (ptr, size), stream in zip(pieces, streams, strict=True)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        return max(calls)

    def close(self) -> None:
        if self.managed:
            self.driver.free(self.managed)
        self.driver.free_pinned(self.pinned)
        if self.pageable is not None:
            self.pageable_address = 0
            with contextlib.suppress(BufferError):  # a view still points at it: exit frees it
                self.pageable.close()


def run(driver: Driver, strategies: Sequence[Strategy], want: int, rounds: int) -> int:
    free, total = driver.mem_info()
    nbytes = working_set(want, free, host_available())
    if nbytes == 0:
        emit(f"Skipped: {free / GiB:.1f} GiB free on the card and {host_available() / GiB:.1f} "
             "GiB available on the host leave no room for a buffer.")
        return 0
    emit(f"Managed buffer {nbytes / GiB:.2f} GiB ({free / GiB:.1f} of {total / GiB:.1f} GiB "
         f"free); driver API {driver.version}; discard API "
         f"{'yes' if driver.discard_batch else 'no'}; transparent huge pages: "
         f"{transparent_huge_pages()}.")
    try:
        bench = Bench(driver, nbytes)
    except DriverError as exc:  # the pinned buffer: the host may not pin that much
        emit(f"Stopped: {exc} allocating {nbytes / GiB:.2f} GiB of pinned host memory.")
        return 1
    try:
        measure(bench, strategies, rounds)
    except DriverError as exc:  # the floor or the buffer itself: nothing else can be measured
        emit(f"Stopped: {exc}.")
        return 1
    finally:
        bench.close()
    return 0


def measure(bench: Bench, strategies: Sequence[Strategy], rounds: int) -> None:
    driver, nbytes = bench.driver, bench.nbytes
    emit(f"Allocating the pinned host buffer (cuMemAllocHost, {nbytes / GiB:.2f} GiB) took "
         f"{bench.pinning_s:.2f} s.")
    emit("")
    to_host, to_device = bench.floor()
    bench.fill()
    for line in header():
        emit(line)
    emit(floor_row(nbytes, to_host, to_device))
    for strategy in strategies:
        if strategy.needs_discard and (driver.discard_batch is None or (
                strategy.drop != "discard" and driver.discard_and_prefetch_batch is None)):
            emit(table_row((strategy.name, "skipped: this driver has no discard API",
                            *("" for _ in range(7)))))
            continue
        for number in range(1, rounds + 1):
            try:
                measured = bench.round(strategy, number)
                emit(row(measured, to_host, to_device))
                if not measured.intact:
                    bench.fill()
            except DriverError as exc:
                emit(table_row((strategy.name, number, f"failed: {exc}",
                                *("" for _ in range(6)))))
                bench.fill()  # whatever it left, the next strategy starts from the pattern
                break
