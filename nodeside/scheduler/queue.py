"""One GPU's waiters, in the order each pool serves them, with positions kept incrementally.

Clients sit in request order in one lane per (pool, priority): the head of a pool is the first
client of its highest non-empty priority, so choosing the next holder costs O(pools), not
O(waiters). Each lane also numbers its clients as they arrive (tickets), so that a client's
place in its pool is its ticket less the lane's first ticket, less the few clients that left
from the middle: O(1) while clients leave from the head (a grant), O(log n) otherwise. A
``waiting`` reply then costs no rebuild of the queue.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left, insort
from collections.abc import Iterator, ValuesView
from typing import Final, final

from nodeside.scheduler.clients import ClientRecord

PRIORITY_RANK: Final = {"HIGH": 0, "NORMAL": 1, "LOW": 2}
#: Ids a lane's front may pass before the list is cut down to those still behind it.
_COMPACT_AFTER: Final = 64
#: Pools whose empty lanes a queue keeps for their next waiter.
_SPARE_POOLS: Final = 16


@final
class Lane:
    """One (pool, priority)'s waiters in request order, each with its arrival ticket."""

    __slots__ = ("members", "_ticket", "_arrivals", "_base", "_front", "_next", "_gone")

    def __init__(self) -> None:
        self.members: dict[str, ClientRecord] = {}
        #: Each member's ticket: the number of its arrival in this lane.
        self._ticket: dict[str, int] = {}
        #: Ids in arrival order, the one at place i with ticket ``_base + i``; the members
        #: are those whose ticket is still theirs. One that left (or left and came back, with
        #: a new ticket further on) is passed over when it reaches the front, so the first
        #: member is found in O(1) amortized. A list and the place of its front rather than a
        #: deque: compiled, a list's item is read in place, a deque's through a generic call.
        self._arrivals: list[str] = []
        self._base = 0
        self._front = 0
        self._next = 0
        #: Tickets of members that left from behind the first one, sorted.
        self._gone: list[int] = []

    def add(self, client: ClientRecord) -> None:
        self.members[client.id] = client
        self._ticket[client.id] = self._next
        self._arrivals.append(client.id)
        self._next += 1

    def remove(self, client_id: str) -> None:
        # Looked up and deleted, not pop(): compiled, pop is a generic method call.
        ticket = self._ticket[client_id]
        del self._ticket[client_id]
        del self.members[client_id]
        if ticket != self._base + self._front:
            insort(self._gone, ticket)  # from behind the first one
            return
        self._pass_the_departed(self._front + 1)
        if self._gone:  # none left from the middle (the usual case): nothing to forget
            floor = self._base + self._front if self.members else self._next
            del self._gone[:bisect_left(self._gone, floor)]

    def _pass_the_departed(self, front: int) -> None:
        """Move the front to the first arrival at or after ``front`` still in the lane."""
        arrivals, tickets, base = self._arrivals, self._ticket, self._base
        while front < len(arrivals) and tickets.get(arrivals[front]) != base + front:
            front += 1
        if front == len(arrivals):  # nobody left: start the list afresh
            self._arrivals = []
            self._base += front
            front = 0
        elif front > _COMPACT_AFTER and 2 * front > len(arrivals):
            del arrivals[:front]  # those before the front left: keep the list bounded
            self._base += front
            front = 0
        self._front = front

    def first(self) -> ClientRecord:
        return self.members[self._arrivals[self._front]]

    def index(self, client_id: str) -> int:
        """0-based place in this lane."""
        ahead = self._ticket[client_id] - (self._base + self._front)
        if not self._gone:  # none left from the middle (the usual case): no search
            return ahead
        return ahead - bisect_left(self._gone, self._ticket[client_id])

    def __len__(self) -> int:
        return len(self.members)


@final
class WaitQueue:
    """One GPU's waiters, by pool and priority: a map of waiters by client id, and lanes.

    The map answers the questions every event asks (anyone waiting? is this client? who is
    it?) through the few dict methods below. It is an attribute, not the class's base: a
    subclass of dict is no native class to mypyc, so every call on it went through Python's
    generic method lookup (about a tenth of a handoff's instructions); a final native class
    is called directly. Only ``add`` and ``remove`` change the map: they keep the lanes in step.
    """

    __slots__ = ("_by_id", "_lanes", "_spare")

    def __init__(self) -> None:
        self._by_id: dict[str, ClientRecord] = {}
        #: The lanes of each pool that waits (and of no other).
        self._lanes: dict[str, list[Lane]] = {}
        #: The empty lanes of pools that waited lately, kept for when they wait again: a queue
        #: that empties at every grant (two clients taking turns) makes no lanes each time.
        #: Bounded, so pools of ever new names leave nothing behind.
        self._spare: dict[str, list[Lane]] = {}

    # -- the map of waiters by client id ---------------------------------------------------

    def __len__(self) -> int:
        return len(self._by_id)

    def __bool__(self) -> bool:
        return bool(self._by_id)

    def __contains__(self, client_id: object) -> bool:
        return client_id in self._by_id

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_id)

    def get(self, client_id: str) -> ClientRecord | None:
        return self._by_id.get(client_id)

    def values(self) -> ValuesView[ClientRecord]:
        return self._by_id.values()

    # -- the lanes -------------------------------------------------------------------------

    def add(self, client: ClientRecord) -> None:
        self._by_id[client.id] = client
        lanes = self._lanes.get(client.pool)
        if lanes is None:
            lanes = self._spare.get(client.pool)
            if lanes is None:
                lanes = [Lane() for _ in PRIORITY_RANK]
            else:
                del self._spare[client.pool]
            self._lanes[client.pool] = lanes
        lanes[PRIORITY_RANK[client.priority]].add(client)

    def remove(self, client: ClientRecord) -> None:
        if client.id not in self._by_id:
            return
        del self._by_id[client.id]
        lanes = self._lanes[client.pool]
        lanes[PRIORITY_RANK[client.priority]].remove(client.id)
        for lane in lanes:
            if lane.members:
                return
        del self._lanes[client.pool]
        if len(self._spare) >= _SPARE_POOLS:
            self._spare.clear()
        self._spare[client.pool] = lanes

    def sole_head(self) -> ClientRecord | None:
        """The next waiter when exactly one pool waits (the usual case); None otherwise.
        ``heads`` without the dict: asked on every handoff."""
        if len(self._lanes) != 1:
            return None
        for lanes in self._lanes.values():
            for lane in lanes:
                if lane.members:
                    return lane.first()
        return None

    def heads(self) -> dict[str, ClientRecord]:
        """Each pool's next waiter (asked on every event: plain loops, no generators)."""
        heads = {}
        for pool, lanes in self._lanes.items():
            for lane in lanes:
                if lane.members:
                    heads[pool] = lane.first()
                    break
        return heads

    def pools(self) -> set[str]:
        return set(self._lanes)

    def pool_waits(self, pool: str) -> bool:
        """Does anyone of ``pool`` wait? (``remove`` drops a pool's lanes once they empty.)"""
        return pool in self._lanes

    def pool_count(self) -> int:
        """How many pools wait (no set built: asked for every waiting reply)."""
        return len(self._lanes)

    def in_order(self, pool: str) -> list[ClientRecord]:
        """A pool's waiters in the order it serves them: priority, then request order."""
        return [c for lane in self._lanes.get(pool, ()) for c in lane.members.values()]

    def index_in_pool(self, client: ClientRecord) -> int:
        """0-based place of a waiter in its pool's order: O(1) in the common case."""
        lanes = self._lanes[client.pool]
        rank = PRIORITY_RANK[client.priority]
        ahead = lanes[rank].index(client.id)
        # A loop over places, not sum() over a generator nor a slice: every waiting reply.
        for higher in range(rank):
            ahead += len(lanes[higher].members)
        return ahead

    def pool_size(self, pool: str) -> int:
        return sum(len(lane) for lane in self._lanes.get(pool, ()))

    def nth_in_pool(self, pool: str, index: int) -> ClientRecord:
        """The pool's waiter at a 0-based place (a walk within one lane: rarely needed)."""
        for lane in self._lanes[pool]:
            if index < len(lane):
                return next(itertools.islice(lane.members.values(), index, None))
            index -= len(lane)
        raise IndexError(index)
