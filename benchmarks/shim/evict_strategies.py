"""The eviction-strategy benchmark's strategies, arithmetic, sizing and table: what
``evict_variants`` (the command) and ``evict_measure`` (its GPU half) share."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

GiB = 1 << 30
#: Chunks are cut on 2 MiB boundaries: the GPU side of managed memory comes in 2 MiB chunks.
CHUNK_ALIGN = 2 << 20
#: Left free on the card beside the buffer (the context, the driver's own needs).
HEADROOM = 3 * GiB


@dataclass(frozen=True)
class Strategy:
    """One way out and back in. ``how``: ``prefetch`` (migrate to the CPU; back by prefetch),
    ``copy-pinned`` / ``copy-pageable`` (copy the bytes to a host buffer, then drop the GPU
    pages; back by repopulating on the GPU and copying in)."""

    how: str
    parts: int = 1
    threads: bool = False  # each part issued from a thread of its own, not all from one
    advise: bool = False  # preferred location CPU before the eviction, unset before restore
    drop: str = "discard"  # copy-*: "discard", or "discard+prefetch" (to the host)

    @property
    def name(self) -> str:
        if self.how == "prefetch":
            split = "" if self.parts == 1 else (
                f", {self.parts} parts on {self.parts} " + ("threads" if self.threads
                                                            else "streams"))
            return f"prefetch{split}" + (", advise CPU" if self.advise else "")
        return f"{self.how} + {self.drop}"

    @property
    def needs_discard(self) -> bool:
        return self.how != "prefetch"


STRATEGIES: tuple[Strategy, ...] = (
    *(Strategy("prefetch", parts, advise=advise) for advise in (False, True)
      for parts in (1, 2, 4, 8)),
    *(Strategy("prefetch", parts, threads=True) for parts in (2, 4, 8)),
    Strategy("copy-pinned", drop="discard"),
    Strategy("copy-pinned", drop="discard+prefetch"),
    Strategy("copy-pageable", drop="discard"),
)


def chunks(ptr: int, nbytes: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` (start, size) pieces covering [ptr, ptr + nbytes), cut on CHUNK_ALIGN."""
    step = -(-nbytes // parts)  # ceiling
    step = -(-step // CHUNK_ALIGN) * CHUNK_ALIGN
    return [(ptr + start, min(step, nbytes - start)) for start in range(0, nbytes, step)]


def working_set(want: int, free: int, host_available: int, host_copies: int = 3) -> int:
    """The buffer to measure: ``want``, or less when the card's free memory (less HEADROOM) or
    the host (a pinned copy, a pageable copy and the migrated pages) cannot take it; never more
    than is free. Rounded down to CHUNK_ALIGN; 0 when nothing fits."""
    size = min(want, free - HEADROOM, (host_available - HEADROOM) // host_copies)
    return max(0, size // CHUNK_ALIGN * CHUNK_ALIGN)


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else float("inf")


HEADER = ("strategy", "round", "evict GB/s", "vs memcpy D->H", "evict call s", "GPU freed GiB",
          "restore GB/s", "vs memcpy H->D", "intact")


@dataclass
class Round:
    """One eviction and restore of ``nbytes``, timed (the call: how long the issuing thread
    was held; the eviction: until the bytes were out), and what it did."""

    strategy: str
    round: int
    nbytes: int
    evict_s: float
    evict_call_s: float
    freed: int
    restore_s: float
    intact: bool


def table_row(cells: tuple[object, ...]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def header() -> list[str]:
    return [table_row(HEADER), table_row(tuple("---" for _ in HEADER))]


def row(measured: Round, floor_to_host: float, floor_to_device: float) -> str:
    """One table row; ``floor_*`` are the pinned memcpy's bytes/s in the same run."""
    evict_bw = measured.nbytes / measured.evict_s
    restore_bw = measured.nbytes / measured.restore_s
    return table_row((measured.strategy, measured.round, f"{evict_bw / 1e9:.1f}",
                      f"{evict_bw / floor_to_host:.2f}", f"{measured.evict_call_s:.3f}",
                      f"{measured.freed / GiB:.2f}", f"{restore_bw / 1e9:.1f}",
                      f"{restore_bw / floor_to_device:.2f}",
                      "yes" if measured.intact else "**NO**"))


def floor_row(nbytes: int, to_host: float, to_device: float) -> str:
    return table_row(("floor: pinned cuMemcpy (device memory)", "best of 3",
                      f"{to_host / 1e9:.1f}", "1.00", "", "", f"{to_device / 1e9:.1f}", "1.00",
                      ""))


def emit(line: str) -> None:
    print(line, flush=True)


def host_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def transparent_huge_pages() -> str:
    """What the kernel does with huge pages (host page allocation is one suspect)."""
    found = []
    for knob in ("enabled", "defrag"):
        path = Path("/sys/kernel/mm/transparent_hugepage") / knob
        found.append(f"{knob} {path.read_text().strip() if path.exists() else 'unknown'}")
    return "; ".join(found)
