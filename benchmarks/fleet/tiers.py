"""The host budget and the disk tier in the fleet's memory model (``HostTiers``): evicted working
sets take host memory until they spill to local NVMe, as the daemon plans them.

The rules are the daemon's (``nodeside/scheduler/tiers.py`` and ``residency.py``'s host room),
applied to the replay's model of who is resident (``switching.Residency``):

* **The host budget** is the node's, shared by every GPU replayed: by default what the daemon
  takes from a host of ``host`` bytes (``nodeside.daemon.hostmem``: MemAvailable less the larger
  of 4 GiB and a tenth). Each evicted working set takes its bytes of it from its eviction until
  it is restored or has spilled.
* **An eviction the budget cannot hold waits for spills**: the idle evicted working sets in
  host memory spill to disk, longest idle first, until the evictions fit; the grant goes on
  when they are written. With nothing (or not enough) to spill, or without the disk tier, the
  waiter is **refused** with the reason (``refusals``), as the daemon does (error ``room``);
  the replay plays the shim's answer (ask again after 1 s, doubling to 16 s; after 300 s the
  cell's GPU calls fail: ``Replay``).
* **Idle spills**: a working set evicted ``spill_after`` seconds ago (600 s, the config's
  default) and not asked for since spills.
* **A restore from disk** streams disk -> GPU at the slower of the drive's read and the link.
* **Restore on intent**: each cell's execute request (every cell's: the server cannot tell a
  GPU cell from a CPU one) starts bringing a working set on disk back to host memory at once,
  within the budget; the grant then restores from host memory, or streams what is still on disk.
  An evicted kernel with an intent standing is not spilled until its next grant (the daemon's
  ``_spillable`` leaves out ``tiering.intent``, which only a grant clears), even when the cell
  was a CPU one.
* One NVMe drive serves the node's spills and reads, one at a time, in the order asked.

Where the model simplifies (the product does more):

* Pinned shadows made ahead for resident kernels (pin budgets) are not modelled: in the
  product they come out of what host copies leave, so they never push use over the budget,
  and evicting a kernel with its shadows pinned ahead needs no new host memory. But the
  daemon today counts the others' pins ahead against an eviction's headroom and never lowers
  them for it: an eviction can be refused while the host budget is held by shadows of memory
  that is on the card. The model's figures are the product's once pins yield to evictions.
* The product fetches on intent at once and then spills others for the excess; the model
  spills first and fetches when they are written, so host use never passes the budget.
* An intent never fetches host -> GPU ahead of the grant (the product does when the GPU has
  room): the runs compared lose that alike.
* The waits for spills, and a restore from disk, are in the grant's hold (the GPU does
  nobody's work meanwhile), as the replay already counts moves over the link; in the product
  the waiter waits unheld and others that need no room go on.
* A spill crossed by a grant or an intent is given up at once (the product's rule); the drive
  time it took is not given back.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from benchmarks.fleet.switching import GB, Residency, SwitchingModel, switch_seconds
from nodeside.daemon.hostmem import MARGIN_FLOOR, MARGIN_SHARE

GiB = 2**30
#: A datacenter NVMe drive's published sequential rates: Samsung's PM9A3 (U.2, PCIe 4.0 x4),
#: 6,500 MB/s read and 3,500 MB/s write (Samsung's announcement, 2020, as reported by heise
#: and ComputerBase). The spill files are written and read with large direct I/O, what the
#: sequential figures measure.
NVME_READ = 6.5 * GB
NVME_WRITE = 3.5 * GB
#: The config's ``spill_after`` default (nodeside/config/settings.py).
SPILL_AFTER = 600.0


def default_budget(host: int) -> int:
    """The daemon's default host budget on a host of ``host`` bytes, all of it available."""
    return max(0, host - max(MARGIN_FLOOR, int(host * MARGIN_SHARE)))


@dataclass(frozen=True)
class TierSetting:
    """A node's host memory and disk, for ``HostTiers``. ``budget`` None: host memory without
    limit (the fleet's earlier model); ``disk`` False: host RAM only."""

    budget: int | None
    disk: bool = True
    nvme_read: float = NVME_READ
    nvme_write: float = NVME_WRITE
    spill_after: float = SPILL_AFTER

    def __post_init__(self) -> None:
        if self.nvme_read <= 0 or self.nvme_write <= 0 or self.spill_after < 0 \
                or (self.budget is not None and self.budget < 0):
            raise ValueError(f"no such node: {self}")

    @property
    def name(self) -> str:
        if self.budget is None:
            return "host without limit"
        return "host + disk" if self.disk else "host RAM only"


@dataclass
class HostTiers(SwitchingModel):
    """``SwitchingModel`` with the node's host budget and disk tier (the module's rules).
    ``clock`` is the replay's time (``build_fleet`` sets it)."""

    tiers: TierSetting = field(default_factory=lambda: TierSetting(None))
    clock: Callable[[], float] = lambda: 0.0
    #: Evicted working sets in host memory: client -> bytes (a spill under way included).
    host: dict[str, int] = field(default_factory=dict)
    #: When each of them came to host memory (its eviction ended, or its fetch began).
    since: dict[str, float] = field(default_factory=dict)
    #: Spills under way: client -> when written (its host memory is free from then).
    spilling: dict[str, float] = field(default_factory=dict)
    #: Working sets on disk: client -> bytes.
    disk: dict[str, int] = field(default_factory=dict)
    #: Fetches from disk to host memory on intent: client -> (start, end).
    fetching: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: Evicted clients with an intent standing (never spilled until granted).
    intents: set[str] = field(default_factory=set)
    #: When the drive is next free.
    drive_free: float = 0.0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("refusals", "spills_idle", "spills_budget", "fetches", "restores_from_disk",
         "spills_given_up"), 0))
    spilled_bytes: int = 0
    peak_host: int = 0
    #: The reason of each refusal, as the daemon words it (the first few).
    reasons: list[str] = field(default_factory=list)

    # -- what the replay asks ------------------------------------------------------------

    def grant_cost(self, gpu: int, client: str, working_set: int,
                   keep: Collection[str] = ()) -> float | None:
        now = self.clock()
        self._advance(now)
        residency = self.gpus.setdefault(gpu, Residency(self.capacity))
        working_set = min(working_set, self.capacity)
        victims = residency.victims(client, working_set, keep)
        needed = sum(victims.values())
        ready = self._make_host_room(needed, now, exclude={client})
        if ready is None:
            self.counts["refusals"] += 1
            if len(self.reasons) < 3:
                self.reasons.append(self._refusal(client, needed, now))
            return None
        self._written(ready)
        free = residency.free_for(client)
        from_disk = self._on_disk_at(client, now)
        evicted, restored = residency.admit(client, working_set, keep)
        out_end = ready + evicted / self.bandwidth
        for victim, size in victims.items():
            self.host[victim] = size
            self.since[victim] = out_end
        self.peak_host = max(self.peak_host, self.host_use())
        if from_disk:
            # Streamed disk -> GPU once the way out is done: the slower of drive and link.
            self.counts["restores_from_disk"] += 1
            start = max(out_end, self.drive_free)
            end = start + max(restored / self.bandwidth, from_disk / self.tiers.nvme_read)
            self.drive_free = start + from_disk / self.tiers.nvme_read
            seconds = end - now
        else:
            seconds = (ready - now) + switch_seconds(evicted, restored, self.bandwidth,
                                                     free=free, overlap=self.overlap,
                                                     chunk=self.chunk)
        self._forget_host(client)
        if seconds > 0:
            self.moved_bytes += evicted + restored
            self.evicted_bytes += evicted
            self.restored_bytes += restored
            self.switches.append(seconds)
        return seconds

    def intent(self, client: str) -> None:
        """The client's notebook sent an execute request: memory on disk starts back to host
        memory, within the budget (spilling others first, longest idle first)."""
        now = self.clock()
        self._advance(now)
        if client not in self.host and client not in self.disk:
            return  # on the GPU (or never evicted): nothing to bring
        self.intents.add(client)
        if client in self.spilling:  # given up: its memory is still in host memory
            del self.spilling[client]
            self.counts["spills_given_up"] += 1
            return
        size = self.disk.get(client)
        if size is None or client in self.fetching:
            return
        ready = self._make_host_room(size, now, exclude={client})
        if ready is None:
            return  # no room for it: the grant streams it from disk
        self._written(ready)
        start = max(ready, self.drive_free)
        end = self.drive_free = start + size / self.tiers.nvme_read
        self.fetching[client] = (start, end)  # its host memory is taken from now
        self.counts["fetches"] += 1
        self.peak_host = max(self.peak_host, self.host_use())

    def forget(self, client: str) -> None:
        super().forget(client)
        self._forget_host(client)

    # -- the node's host memory ----------------------------------------------------------

    def host_use(self) -> int:
        """Host memory the evicted working sets take now: host copies (spills under way
        included) and fetches on their way back."""
        fetching = sum(self.disk[c] for c in self.fetching)
        return sum(self.host.values()) + fetching

    def headroom(self) -> float:
        budget = self.tiers.budget
        return float("inf") if budget is None else budget - self.host_use()

    def _make_host_room(self, needed: int, now: float, exclude: Collection[str]
                        ) -> float | None:
        """When ``needed`` bytes of host memory are free, spilling idle evicted working sets
        to disk for them if it must (the daemon's ``host_wanted``); None: they cannot be
        (without the disk tier, or with too little to spill: the waiter is refused)."""
        short = needed - self.headroom()
        if short <= 0:
            return now
        if not self.tiers.disk:
            return None
        ready = now
        for client, end in sorted(self.spilling.items(), key=lambda item: item[1]):
            if short <= 0:
                break
            short -= self.host[client]
            ready = max(ready, end)
        for client in self._spillable(exclude):
            if short <= 0:
                break
            short -= self.host[client]
            ready = max(ready, self._spill(client, now, "spills_budget"))
        return ready if short <= 0 else None

    def _spillable(self, exclude: Collection[str]) -> list[str]:
        """Evicted working sets in host memory, nothing under way, longest idle first."""
        found = [c for c in self.host if c not in self.spilling and c not in exclude
                 and c not in self.intents]
        return sorted(found, key=lambda c: self.since[c])

    def _spill(self, client: str, now: float, why: str) -> float:
        """Start ``client``'s spill at ``now`` (on the drive's turn): when it is written."""
        start = max(now, self.drive_free)
        end = self.drive_free = start + self.host[client] / self.tiers.nvme_write
        self.spilling[client] = end
        self.counts[why] += 1
        return end

    def _advance(self, now: float) -> None:
        """Bring the tiers up to ``now``: idle spills that fell due started (in the order
        they fell due), spills and fetches that ended done."""
        if self.tiers.disk and self.tiers.spill_after > 0:
            for client in self._spillable(()):
                due = self.since[client] + self.tiers.spill_after
                if due > now:
                    break
                self._spill(client, due, "spills_idle")
        self._written(now)
        for client, (_, end) in list(self.fetching.items()):
            if end <= now:
                del self.fetching[client]
                self.host[client] = self.disk.pop(client)
                self.since[client] = end

    def _written(self, until: float) -> None:
        """Spills written by ``until`` are on disk, their host memory free. A grant or a fetch
        that waits for spills takes them as written at once: what they free is its own from
        then on (nobody else's), so the books are the same for everyone else."""
        for client, end in list(self.spilling.items()):
            if end <= until:
                del self.spilling[client]
                self.disk[client] = self.host.pop(client)
                self.spilled_bytes += self.disk[client]
                del self.since[client]

    def _on_disk_at(self, client: str, now: float) -> int:
        """Bytes of ``client``'s working set still on disk at ``now`` (a fetch under way has
        brought back its share)."""
        size = self.disk.get(client, 0)
        fetch = self.fetching.get(client)
        if fetch is None or not size:
            return size
        start, end = fetch
        done = size * min(1.0, max(0.0, now - start) / (end - start)) if end > start else size
        return int(size - done)

    def _forget_host(self, client: str) -> None:
        if client in self.spilling:
            self.counts["spills_given_up"] += 1
        for tier in (self.host, self.since, self.spilling, self.disk, self.fetching):
            tier.pop(client, None)
        self.intents.discard(client)

    def _refusal(self, client: str, needed: int, now: float) -> str:
        """The daemon's reason (residency.py ``_host_room``), at ``now``."""
        budget = self.tiers.budget or 0
        left = max(0.0, self.headroom())
        return (f"{client} needs {needed / GiB:.1f} GiB of host memory moved out of its way, "
                f"and the node's host budget ({budget / GiB:.0f} GiB) has {left / GiB:.1f} GiB "
                f"left, with nothing more to spill to disk (at {now:.0f} s)")

