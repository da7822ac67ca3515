"""What a handoff costs when memory must move: the simulator's model of the shim's paging.

A GPU keeps the working sets of the clients that used it last for as long as they fit, as the
shim does: a holder leaves its memory in place unless the next holder needs the room (the drop's
``evict``). A grant therefore costs nothing when the new holder's working set is still resident
and fits beside the others. Otherwise the least recently used working sets are moved to host
until it fits (eviction), and the new holder's own is moved back in (restore) if it had been
moved out; a client's first grant has nothing on host, its memory is allocated by its own work.
Both cross the host link at ``bandwidth`` bytes per second each way, and while they do the
GPU does nobody's work. For one holder handing over to the next this is the rule the fleet
benchmark states: the handoff costs evict(old) + restore(new) exactly when the two working sets
do not fit together.

"Least recently" means used: the replay tells the model when each hold ends (``used``), so a
kernel that held the GPU for an hour beside others is not the first to go the moment it stops.

**This is issue 31's rule, not the scheduler core's today.** The core decides an eviction only
when a holder leaves while someone waits (``nodeside/scheduler/room.py``, ``evict_needed``) and
counts holders only; issue 31 asks it to keep resident memory as state and to make room for a
grant from idle resident clients, least recently used first, never a holder. Until the core
does, the replay models that rule here, in ``Residency.admit``.

How the two moves add up is ``switch_seconds``. Today's evictors move the leaver out, then the
newcomer in: out + in. A chunked evictor (``KIWI_EVICT=vmm``, docs/shim.md "Evictors"; the
design note ``shared/design/gpu-memory-swap.md``, section 8) frees each chunk as its copy
completes, so the newcomer's restore can start as soon as the chunks released make room for it,
host to device while the leaver's copies go device to host: the switch is then max(out, in)
plus the wait for one chunk (``overlap``). The link's two directions are assumed to reach the
one-way rate at once: the design's inference from PCIe being full duplex, not measured yet
(item (f) of the design's device probe, ``benchmarks/shim/vmm_probe.py``).

The model is for ``Replay`` (simulated time); the daemon never uses it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass, field

from nodeside.testing import Replay

GB = 10**9
MiB = 2**20
#: Host-link bandwidths the benchmarks compare: a PCIe Gen4 x16 link and a Gen5 one, at what
#: pinned copies reach in practice rather than the links' raw rates. Gen5's is the pinned
#: ``cuMemcpy`` measured each way on an H200 (55.2 GB/s, 2026-11-27) and an H100 (55.0 GB/s,
#: 54.9 GB/s host to device; BENCHMARKS.md "On a GPU"), the floor under any evictor.
PCIE_GEN4 = 25 * GB
PCIE_GEN5 = 55 * GB
#: What a chunked evictor moves and frees at a time: the largest handle the ``vmm`` design
#: keeps (allocations over 256 MiB split into 64-256 MiB handles, gpu-memory-swap.md
#: section 4), so the longest a restore waits for the leaver's first chunk.
CHUNK = 256 * MiB


def switch_seconds(evicted: int, restored: int, bandwidth: float, *, free: int = 0,
                   overlap: bool = False, chunk: int = CHUNK) -> float:
    """Seconds before a newcomer can work when ``evicted`` bytes of others must go to host and
    ``restored`` bytes of its own come back, over a link of ``bandwidth`` bytes per second each
    way; ``free`` bytes of the room it needs were free before anything moved.

    Without ``overlap`` the two moves follow each other: out + in. With it (a chunked evictor)
    they run at once on the link's two directions: the restore fills the free room at once and
    then follows the eviction, each of its chunks waiting for one of the leaver's to be
    released, so it ends at most one chunk after the bytes it waited for. The newcomer starts
    when both are done: max(out, in + that wait). A first grant (nothing to restore) still
    waits for the whole eviction, as its allocations need the room.
    """
    if evicted < 0 or restored < 0 or bandwidth <= 0:
        raise ValueError(f"cannot move {evicted} out and {restored} in at {bandwidth} B/s")
    if not overlap or evicted == 0 or restored == 0:
        return (evicted + restored) / bandwidth
    behind = min(restored - free, evicted)  # bytes of the restore that wait for room
    lag = min(chunk, evicted) if behind > 0 else 0
    restore_done = max(restored, behind + lag)
    return max(evicted, restore_done) / bandwidth


@dataclass
class Residency:
    """One GPU's memory: whose working sets are on it, least recently used first (a grant
    or the end of a hold is a use)."""

    capacity: int
    resident: OrderedDict[str, int] = field(default_factory=OrderedDict)
    #: Clients whose working set was moved to host and is not back yet.
    on_host: set[str] = field(default_factory=set)

    def admit(self, client: str, working_set: int, keep: Collection[str] = ()) -> tuple[int, int]:
        """``client`` is granted the GPU: (bytes evicted, bytes restored) to make it resident.

        ``keep`` are the clients holding the GPU beside it (mode auto): their memory is in use
        and never moved. A working set larger than the GPU is clipped to it (the shim cannot
        restore more than fits; the rest would fault in, which this model leaves out).
        """
        working_set = min(working_set, self.capacity)
        restored = working_set if client in self.on_host else 0
        victims = self.victims(client, working_set, keep)
        self.on_host.discard(client)
        self.resident.pop(client, None)
        for other in victims:
            del self.resident[other]
            self.on_host.add(other)
        self.resident[client] = working_set
        return sum(victims.values()), restored

    def victims(self, client: str, working_set: int, keep: Collection[str] = ()
                ) -> dict[str, int]:
        """Whose working sets ``admit`` would move to host for ``client``, and their bytes,
        moving nothing: the least recently used first, never one in ``keep``."""
        working_set = min(working_set, self.capacity)
        used = sum(v for c, v in self.resident.items() if c != client)
        chosen: dict[str, int] = {}
        for other, size in self.resident.items():
            if used + working_set <= self.capacity:
                break
            if other in keep or other == client:
                continue
            chosen[other] = size
            used -= size
        return chosen

    def free_for(self, client: str) -> int:
        """Bytes free for ``client``'s working set before anything moves."""
        return self.capacity - sum(v for c, v in self.resident.items() if c != client)

    def used(self, client: str) -> None:
        """``client``'s hold ended: it is the most recently used (if its memory is in)."""
        if client in self.resident:
            self.resident.move_to_end(client)

    def forget(self, client: str) -> None:
        """The client is gone: its memory is freed, nothing moves."""
        self.resident.pop(client, None)
        self.on_host.discard(client)


@dataclass
class SwitchingModel:
    """Per GPU residency and the host link's bandwidth (bytes per second each way); with
    ``overlap`` a handoff's way out and way in run at once (``switch_seconds``)."""

    capacity: int
    bandwidth: float = PCIE_GEN4
    overlap: bool = False
    chunk: int = CHUNK
    gpus: dict[int, Residency] = field(default_factory=dict)
    moved_bytes: int = 0
    evicted_bytes: int = 0
    restored_bytes: int = 0
    #: Seconds of each grant that had to move memory (grants that moved none are not here).
    switches: list[float] = field(default_factory=list)

    def grant_cost(self, gpu: int, client: str, working_set: int,
                   keep: Collection[str] = ()) -> float | None:
        """Seconds the GPU spends moving memory before ``client`` can work (never None here:
        host memory without limit makes any room; ``tiers.HostTiers`` may refuse)."""
        residency = self.gpus.setdefault(gpu, Residency(self.capacity))
        free = residency.free_for(client)
        evicted, restored = residency.admit(client, working_set, keep)
        if evicted == restored == 0:
            return 0.0
        self.moved_bytes += evicted + restored
        self.evicted_bytes += evicted
        self.restored_bytes += restored
        seconds = switch_seconds(evicted, restored, self.bandwidth, free=free,
                                 overlap=self.overlap, chunk=self.chunk)
        self.switches.append(seconds)
        return seconds

    def used(self, gpu: int, client: str) -> None:
        """``client``'s hold of ``gpu`` ended: least recently used is counted from here."""
        residency = self.gpus.get(gpu)
        if residency is not None:
            residency.used(client)

    def forget(self, client: str) -> None:
        for residency in self.gpus.values():
            residency.forget(client)


def model_of(replay: Replay) -> SwitchingModel | None:
    """The switching model a replay moves memory with, if it is this one."""
    switching = replay.switching
    return switching if isinstance(switching, SwitchingModel) else None
