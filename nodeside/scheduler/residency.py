"""Residency: where each client's memory is, and the room a grant makes before it goes out.

Kept for clients that speak the ``memory`` feature (``GpuState.memory_clients``); for the others
the rules are those of holders only, as before, and nothing here is asked. A client's memory is
``resident`` (on the GPU), ``evicting`` (asked to move out, or released with ``evicting``),
``evicted`` (in host memory) or ``restoring`` (granted again, moving back in until a report says
nothing is left in host memory), with the bytes it reported on the GPU and in host memory; NVML's
per-process figure counts where it is larger.

A grant whose working set does not fit beside what is resident asks idle clients to evict first
(``make_room``): LOW before NORMAL and HIGH, idle before waiting, least recently used first,
never a holder, and only as much as is missing. The grant goes out when reports and ``evicted``
bring the resident bytes down. A client that does not answer within ``evict_timeout`` is
checkpointed where the daemon's checkpoint evictor reaches it, else it is taken as unable to
evict; when the room cannot be made at all, the waiter is refused, told who holds the memory.
An evicted client idle for ``checkpoint_after`` is checkpointed too (its context is freed).
"""

from __future__ import annotations

from typing import final

from nodeside.formats import size
from nodeside.model import EVICTED, EVICTING, RESIDENT, RESTORING
from nodeside.scheduler.actions import Action, Evict, Suspend
from nodeside.scheduler.clients import WaitingFor
from nodeside.scheduler.node import NodeState
from nodeside.scheduler.state import PRIORITY_RANK, Client, GpuState, HoldState

#: Evictors under which the client moves its own memory out when told ``evict``.
PAGES_ITSELF = ("managed", "vmm")


def occupies(client: Client) -> int:
    """Bytes ``client`` keeps on its GPU now: its report, or NVML's figure where larger."""
    nvml = client.nvml_bytes
    resident = client.resident_bytes
    return nvml if nvml is not None and nvml > resident else resident


def holding(client: Client) -> bool:
    state = client.hold_state
    return state is HoldState.HOLDING or state is HoldState.DROPPING


def need(client: Client) -> int:
    """What a client needs on the GPU to work: its working set, or its resident bytes where
    larger (an unknown working set counts as what it has)."""
    working_set = client.working_set
    resident = occupies(client)
    return resident if working_set is None or resident > working_set else working_set


def granted(client: Client, now: float) -> None:
    """A memory client was granted: what it waited for is over; evicted, it moves back in."""
    client.waiting_for = None
    client.checkpoint_asked = False
    if client.residency == EVICTED or client.residency == EVICTING:
        client.residency = RESTORING
        client.restoring_since = now


@final
class Residency:
    """Each memory client's residency and bytes, and the evictions a grant waits for."""

    def __init__(self, state: NodeState) -> None:
        self.state = state

    # -- what clients say -------------------------------------------------------------------

    def track(self, client: Client, resident: int | None, host: int | None,
              shadow: int | None, checkpointable: bool) -> None:
        """``client`` speaks the ``memory`` feature (its ``register`` may say where its memory
        is already)."""
        client.memory = True
        client.checkpointable = checkpointable
        if resident is not None or host is not None:
            client.memory_source = "shim"
        client.resident_bytes = resident or 0
        client.host_bytes = host or 0
        client.shadow_bytes = shadow or 0
        if client.host_bytes and not client.resident_bytes:
            client.residency = EVICTED
        self.state.gpus[client.gpu].memory_clients[client.id] = client

    def forget(self, client: Client) -> None:
        gpu = self.state.gpus[client.gpu]
        gpu.memory_clients.pop(client.id, None)
        for other in gpu.memory_clients.values():
            if other.waiting_for is not None and other.waiting_for.client == client.id:
                other.waiting_for = None

    def report(self, client: Client, resident: int | None, host: int | None,
               shadow: int | None = None) -> None:
        """A ``working_set`` report with figures: progress of an eviction or of a restore."""
        if shadow is not None:
            client.shadow_bytes = shadow
        if resident is not None:
            client.resident_bytes = resident
            client.memory_source = "shim"
        if host is not None:
            client.host_bytes = host
            client.memory_source = "shim"
        client.evict_failed = None  # asked again only after a report: this is one
        if client.residency == RESTORING and (host == 0 or (
                host is None and resident is not None and client.host_bytes == 0)):
            client.residency = RESIDENT
            client.restoring_since = None
            self.state.counts["restores"] += 1
        elif client.residency == EVICTED and resident:
            client.residency = RESIDENT  # it came back without a grant (mode off)
        self._check_nvml(client)

    def nvml_seen(self, client: Client, nbytes: int | None) -> None:
        """NVML's per-process used memory of ``client``'s process (None: not known)."""
        client.nvml_bytes = nbytes
        self._check_nvml(client)

    def _check_nvml(self, client: Client) -> None:
        nvml = client.nvml_bytes
        if nvml is not None and nvml > client.resident_bytes:
            client.memory_source = "nvml"

    def evicted(self, client: Client, resident: int | None, host: int | None,
                failed: str | None, now: float, shadow: int | None = None) -> None:
        """An eviction ended (``evicted``), asked or of the client's own accord."""
        asked = client.residency
        client.evict_asked_at = None
        if shadow is not None:
            client.shadow_bytes = shadow
        if resident is not None:
            client.resident_bytes = resident
        if host is not None:
            client.host_bytes = host
        if resident is not None or host is not None:
            client.memory_source = "shim"
        if failed is not None:
            client.evict_failed = failed
            # A restore that ran out of memory rolled back: its memory is in host memory.
            client.residency = EVICTED if asked == RESTORING else RESIDENT
            client.restoring_since = None
            return
        client.evict_failed = None
        client.residency = EVICTED
        client.evicted_at = now

    def released_evicting(self, client: Client, now: float) -> None:
        """A holder released with ``evicting``: its memory is on its way out."""
        client.residency = EVICTING
        client.evict_asked_at = now
        self._count(client, "release")

    def _count(self, client: Client, reason: str) -> None:
        books = self.state.gpus[client.gpu].evictions
        books[reason] = books.get(reason, 0) + 1


    def checkpointed(self, client: Client, error: str | None, now: float) -> None:
        """The checkpoint evictor finished a ``Suspend``: the process's memory is in host
        memory, or (``error``) it could not be moved."""
        client.evict_asked_at = None
        if error is not None:
            client.evict_failed = f"checkpoint failed: {error}"
            if client.residency == EVICTING:
                client.residency = RESIDENT
            return
        client.host_bytes += occupies(client)
        client.resident_bytes = 0
        client.nvml_bytes = None
        client.residency = EVICTED
        if client.evicted_at is None:
            client.evicted_at = now

    # -- the room a grant needs ---------------------------------------------------------------

    def shortfall(self, gpu: GpuState, candidate: Client) -> int:
        """Bytes missing on ``gpu`` for ``candidate`` to work beside every resident client;
        0 when it fits or when the GPU's capacity or the candidate's working set is unknown."""
        capacity = gpu.spec.memory_total
        if capacity is None or candidate.working_set is None:
            return 0
        others = 0
        for holder in gpu.holders.values():
            if holder is not candidate:
                others += need(holder) if holder.memory else (holder.working_set or 0)
        for client in gpu.memory_clients.values():
            if client is candidate or holding(client):
                continue
            if client.residency == EVICTED and client.evict_failed is None:
                # It moved out all it could: what it still has here cannot move (a retained or
                # exported handle, memory the evictor cannot reach), and no eviction frees it.
                continue
            others += occupies(client)
        # Capped by what the others have there: a working set larger than the card on its own
        # is granted once nobody else's memory is left (as before the memory feature), rather
        # than waiting for room that no eviction can make.
        return min(others, max(0, need(candidate) + others - (capacity - self.state.reserve)))

    def make_room(self, gpu: GpuState, candidate: Client, short: int,
                  now: float) -> tuple[list[Action], str | None]:
        """Ask idle clients to evict ``short`` bytes for ``candidate``. Returns the actions and,
        when the room cannot be made whatever is asked, why (the waiter is refused)."""
        on_the_way: list[Client] = []
        evictable: list[Client] = []
        stuck: list[Client] = []
        for client in gpu.memory_clients.values():
            if client is candidate or holding(client) or not occupies(client):
                continue
            if client.residency == EVICTING and client.evict_failed is None:
                on_the_way.append(client)
            elif client.evict_failed is None and client.residency != EVICTED and (
                    client.evict in PAGES_ITSELF or client.checkpointable):
                evictable.append(client)
            else:
                stuck.append(client)
        coming = sum(occupies(c) for c in on_the_way)
        if coming + sum(occupies(c) for c in evictable) < short:
            if on_the_way:
                self._wait_for(candidate, on_the_way)
                return [], None  # what is under way may still be enough after a timeout
            return [], self._no_room(gpu, candidate, short, stuck)
        actions: list[Action] = []
        missing = short - coming
        evictable.sort(key=lambda c: (c.hold_state is HoldState.WAITING,
                                      -PRIORITY_RANK[c.priority], c.last_used))
        for client in evictable:
            if missing <= 0:
                break
            nbytes = occupies(client)
            missing -= nbytes
            client.residency = EVICTING
            client.evict_asked_at = now
            on_the_way.append(client)
            self.state.counts["evictions"] += 1
            self._count(client, "room")
            if client.evict in PAGES_ITSELF:
                actions.append(Evict(client.id, gpu.spec.index, nbytes,
                                     candidate.display_name))
            else:
                client.checkpoint_asked = True
                actions.append(Suspend(client.id, gpu.spec.index, "room"))
        self._wait_for(candidate, on_the_way)
        return actions, None

    def _wait_for(self, candidate: Client, on_the_way: list[Client]) -> None:
        first = max(on_the_way, key=occupies)
        candidate.waiting_for = WaitingFor(
            first.id, first.display_name, occupies(first),
            "checkpoint" if first.checkpoint_asked else "evict")

    def _no_room(self, gpu: GpuState, candidate: Client, short: int,
                 stuck: list[Client]) -> str:
        holders = [*gpu.holders.values(), *stuck]
        who = ", ".join(f"{c.display_name} ({size(need(c) if holding(c) else occupies(c))}"
                        f"{', ' + c.evict_failed if c.evict_failed else ''})" for c in holders)
        return (f"{candidate.display_name} needs {size(need(candidate))} on GPU "
                f"{gpu.spec.index}, {size(short)} more than is free, and that room cannot be "
                f"made: the memory is held by {who or 'nobody the scheduler knows'}")

    # -- time passing -------------------------------------------------------------------------

    def due(self, gpu: GpuState, now: float) -> list[Action]:
        """Evictions past ``evict_timeout`` and evicted clients past ``checkpoint_after``."""
        config = self.state.config
        actions: list[Action] = []
        for client in gpu.memory_clients.values():
            asked = client.evict_asked_at
            if client.residency == EVICTING and asked is not None and \
                    not client.checkpoint_asked and now >= asked + config.evict_timeout:
                if client.checkpointable:
                    client.checkpoint_asked = True
                    self._count(client, "timeout")
                    actions.append(Suspend(client.id, gpu.spec.index, "timeout"))
                    for waiter in gpu.waiters.values():
                        if waiter.waiting_for is not None and \
                                waiter.waiting_for.client == client.id:
                            waiter.waiting_for = WaitingFor(
                                client.id, client.display_name, occupies(client), "checkpoint")
                else:
                    client.evict_asked_at = None
                    client.evict_failed = (f"did not answer evict within "
                                           f"{config.evict_timeout:g} s")
                    client.residency = RESIDENT
                continue
            at = self._second_stage_at(client)
            if at is not None and now >= at:
                client.checkpoint_asked = True
                self._count(client, "idle")
                actions.append(Suspend(client.id, gpu.spec.index, "idle"))
        return actions

    def deadline(self, gpu: GpuState) -> float | None:
        """When ``due`` next has something to do on ``gpu``."""
        config = self.state.config
        best: float | None = None
        for client in gpu.memory_clients.values():
            asked = client.evict_asked_at
            at = asked + config.evict_timeout if client.residency == EVICTING and \
                asked is not None and not client.checkpoint_asked else \
                self._second_stage_at(client)
            if at is not None and (best is None or at < best):
                best = at
        return best

    def _second_stage_at(self, client: Client) -> float | None:
        after = self.state.config.checkpoint_after
        if after <= 0 or not client.checkpointable or client.checkpoint_asked or \
                client.residency != EVICTED or client.evicted_at is None or \
                client.hold_state is not HoldState.IDLE:
            return None
        return client.evicted_at + after
