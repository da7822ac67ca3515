"""One GPU's memory ledger: what each client counts for on it, the totals, and the one fit.

After kube-scheduler's ``NodeInfo``: every rule that asks "does it fit" (room.py's grants beside
holders and evictions on leaving, residency.py's shortfall and the room on its way out, turns.py's
grants beside a wait for room, the status report's notes, the switch pricing of light_first)
asks this object, and the arithmetic is one function, ``excess``: the bytes by which what is
wanted together exceeds the GPU's capacity less the node's reserve.

The figures of one client (feature ``memory``), on the best evidence (``occupies``: NVML's
per-process figure where the daemon reads one, else the client's report):

* a holder needs its working set, or what it has where that is more (``need``);
* an idle client counts against others' room (``counted``) what it has, but nothing once only
  its claim says so and it could not evict (until its next grant), nor once it has evicted;
* of that, the bytes of a client on its way out (evicting, not failed) are room on its way back.

The idle clients' figures are booked here as they change (``book``, by the residency component
and the moves, after each change of a memory client), so the totals a grant asks for cost no
walk over the clients; a property test recomputes them from the clients after every step. A
plain client (no ``memory`` feature) is never booked: a handoff between plain clients reads the
holders' working sets only, as before.
"""

from __future__ import annotations

from typing import final

from nodeside.model import EVICTED, EVICTING
from nodeside.scheduler.clients import ClientRecord, HoldState


def occupies(client: ClientRecord) -> int:
    """Bytes ``client`` keeps on its GPU now, on the best evidence: NVML's figure for its
    process where the daemon reads one, else its own report."""
    nvml = client.nvml_bytes
    return client.resident_bytes if nvml is None else nvml


def counted(client: ClientRecord) -> int:
    """Bytes of an idle ``client`` that count against others' room: its evidence; but a claim
    NVML does not vouch for counts nothing once the client could not evict (until its next
    grant), nor once it has evicted (what it says is left, no eviction frees)."""
    nvml = client.nvml_bytes
    if nvml is not None:
        return nvml
    if client.eviction.failed is not None or client.residency is EVICTED:
        return 0
    return client.resident_bytes


def holding(client: ClientRecord) -> bool:
    state = client.hold_state
    return state is HoldState.HOLDING or state is HoldState.DROPPING


def need(client: ClientRecord) -> int:
    """What a client needs on the GPU to work: its working set, or its resident bytes where
    larger (an unknown working set counts as what it has)."""
    working_set = client.working_set
    resident = occupies(client)
    return resident if working_set is None or resident > working_set else working_set


def idle_bytes(client: ClientRecord) -> int:
    """What ``client`` counts for in the idle clients' total: ``counted`` while idle, nothing
    while it holds (a holder counts its ``need``, asked of the holders themselves)."""
    return 0 if holding(client) else counted(client)


def outgoing_bytes(client: ClientRecord) -> int:
    """Of ``idle_bytes``, the bytes on their way out: it evicts, and has not failed."""
    if client.residency is not EVICTING or client.eviction.failed is not None:
        return 0
    return idle_bytes(client)


@final
class Ledger:
    """One GPU's memory: capacity less reserve, the idle memory clients' booked bytes and
    those on their way out, and the fit function every rule asks."""

    def __init__(self, capacity: int | None, holders: dict[str, ClientRecord]) -> None:
        #: The GPU's memory in bytes; None while unknown (then only one client fits at a time).
        self.capacity = capacity
        #: Bytes the node keeps free on every GPU (``memory_reserve``; NodeState sets it).
        self.reserve = 0
        #: The GPU's holders, in grant order (the same dict as ``GpuState.holders``).
        self.holders = holders
        #: Each memory client's ``idle_bytes`` and ``outgoing_bytes`` as last booked.
        self.idle: dict[str, int] = {}
        self.outgoing: dict[str, int] = {}
        #: Their sums.
        self.idle_total = 0
        self.outgoing_total = 0

    # -- the books ------------------------------------------------------------------------

    def book(self, client: ClientRecord) -> None:
        """Record ``client``'s figures as they are now (after any change to its bytes, its
        residency or its hold)."""
        key = client.id
        nbytes = idle_bytes(client)
        self.idle_total += nbytes - self.idle.get(key, 0)
        self.idle[key] = nbytes
        out = outgoing_bytes(client)
        self.outgoing_total += out - self.outgoing.get(key, 0)
        self.outgoing[key] = out

    def forget(self, client: ClientRecord) -> None:
        """``client`` left the GPU: none of its bytes count any more."""
        key = client.id
        self.idle_total -= self.idle.pop(key, 0)
        self.outgoing_total -= self.outgoing.pop(key, 0)

    def idle_except(self, one: ClientRecord | None, other: ClientRecord | None = None) -> int:
        """The idle clients' counted bytes, leaving out ``one`` and ``other``."""
        total = self.idle_total
        if one is not None:
            total -= self.idle.get(one.id, 0)
        if other is not None and other is not one:
            total -= self.idle.get(other.id, 0)
        return total

    def outgoing_except(self, one: ClientRecord | None) -> int:
        """Bytes on their way out, leaving out ``one``'s."""
        total = self.outgoing_total
        if one is not None:
            total -= self.outgoing.get(one.id, 0)
        return total

    # -- the one fit ----------------------------------------------------------------------

    @property
    def room(self) -> int | None:
        """What clients may use together: capacity less reserve (None: unknown)."""
        capacity = self.capacity
        return None if capacity is None else capacity - self.reserve

    def excess(self, wanted: int) -> int:
        """Bytes by which ``wanted`` together exceed the room; 0 when they fit (and always
        while the capacity is unknown: callers ask ``fits`` for that case)."""
        room = self.room
        return 0 if room is None or wanted <= room else wanted - room

    def fits(self, clients: list[ClientRecord], beside: int = 0) -> bool:
        """Do these clients' working sets fit at once, ``beside`` bytes others keep? A client
        whose working set is unknown, or a GPU whose capacity is, needs the whole GPU."""
        if self.capacity is None:
            return len(clients) <= 1
        # A plain loop, not any() and sum() over generators: asked on every handoff.
        wanted = beside
        for client in clients:
            if client.working_set is None:
                return len(clients) <= 1
            wanted += client.working_set
        return self.excess(wanted) == 0

    def holders_need(self, but: ClientRecord | None) -> int:
        """What the holders other than ``but`` need on the GPU (a holder without the memory
        feature: its working set, 0 while unknown)."""
        total = 0
        for holder in self.holders.values():
            if holder is not but:
                total += need(holder) if holder.memory else (holder.working_set or 0)
        return total

    def shortfall(self, candidate: ClientRecord, reserved: int = 0) -> int:
        """Bytes missing for ``candidate`` to work beside every holder and every idle client's
        counted memory (and ``reserved`` bytes kept for someone else); 0 when it fits or when
        the GPU's capacity or the candidate's working set is unknown."""
        if self.capacity is None or candidate.working_set is None:
            return 0
        others = reserved + self.holders_need(candidate) + self.idle_except(candidate)
        # Capped by what the others have there: a working set larger than the card on its own
        # is granted once nobody else's memory is left (as before the memory feature), rather
        # than waiting for room that no eviction can make.
        return min(others, self.excess(need(candidate) + others))
