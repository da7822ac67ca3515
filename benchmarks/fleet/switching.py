"""What a handoff costs when memory must move: the simulator's model of the shim's paging.

A GPU keeps the working sets of the clients that used it last for as long as they fit, as the
shim does: a holder leaves its memory in place unless the next holder needs the room (the drop's
``evict``). A grant therefore costs nothing when the new holder's working set is still resident
and fits beside the others. Otherwise the least recently granted working sets are moved to host
until it fits (eviction), and the new holder's own is moved back in (restore) if it had been
moved out; a client's first grant has nothing on host, its memory is allocated by its own work.
Both cross the host link at ``bandwidth`` bytes per second, one after the other, and while they
do the GPU does nobody's work. For one holder handing over to the next this is the rule the
fleet benchmark states: the handoff costs evict(old) + restore(new) exactly when the two
working sets do not fit together.

The model is for ``Replay`` (simulated time); the daemon never uses it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass, field

GB = 10**9
#: Host-link bandwidths the benchmarks compare: a PCIe Gen4 x16 link and a Gen5 one, at what
#: pinned copies reach in practice rather than the links' raw rates.
PCIE_GEN4 = 25 * GB
PCIE_GEN5 = 55 * GB


@dataclass
class Residency:
    """One GPU's memory: whose working sets are on it, least recently granted first."""

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
        self.on_host.discard(client)
        self.resident.pop(client, None)
        evicted = 0
        used = sum(self.resident.values())
        for other in list(self.resident):
            if used + working_set <= self.capacity:
                break
            if other in keep:
                continue
            moved = self.resident.pop(other)
            self.on_host.add(other)
            evicted += moved
            used -= moved
        self.resident[client] = working_set
        return evicted, restored

    def forget(self, client: str) -> None:
        """The client is gone: its memory is freed, nothing moves."""
        self.resident.pop(client, None)
        self.on_host.discard(client)


@dataclass
class SwitchingModel:
    """Per GPU residency and the host link's bandwidth (bytes per second)."""

    capacity: int
    bandwidth: float = PCIE_GEN4
    gpus: dict[int, Residency] = field(default_factory=dict)
    moved_bytes: int = 0

    def grant_cost(self, gpu: int, client: str, working_set: int,
                   keep: Collection[str] = ()) -> float:
        """Seconds the GPU spends moving memory before ``client`` can work."""
        residency = self.gpus.setdefault(gpu, Residency(self.capacity))
        evicted, restored = residency.admit(client, working_set, keep)
        self.moved_bytes += evicted + restored
        return (evicted + restored) / self.bandwidth

    def forget(self, client: str) -> None:
        for residency in self.gpus.values():
            residency.forget(client)
