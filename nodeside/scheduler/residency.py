"""Residency: where each client's memory is, and the room a grant makes before it goes out.

Kept for clients that speak the ``memory`` feature (``GpuState.memory_clients``); for the others
the rules are those of holders only, as before, and nothing here is asked. A client's memory is
``resident`` (on the GPU), ``evicting`` (asked to move out, or released with ``evicting``),
``evicted`` (in host memory) or ``restoring`` (granted again, moving back in until a report says
nothing is left in host memory), with the bytes it reported on the GPU and in host memory.

What a client says of its memory is a claim; what counts is the evidence (``occupies``): NVML's
per-process figure wherever the daemon reads one for the client's process (over- and
under-claims alike), else the claim. A claim of more than the GPU has is refused
(``check_claim``). An idle client's bytes count against others' room (``counted``) unless only
its claim says so and it could not evict: once it fails, or makes no progress for
``evict_timeout``, and nobody can checkpoint it, its claim no longer counts (``Uncounted``) until
its next grant; its own next GPU work then waits for room like anyone's.

A grant whose working set does not fit beside what is resident asks idle clients to evict first
(``make_room``): LOW before NORMAL and HIGH, idle before waiting, least recently used first,
never a holder, and only as much as is missing, as often as fair_eviction.py allows. The grant
goes out when reports and ``evicted`` bring the counted bytes down; meanwhile grants that need no
room go on (turns.py). The ``evict_timeout`` of a way out runs from the ask, then from each
report of at least PROGRESS_BYTES fewer on the GPU, so one that makes progress is never cut
short and one that moves a byte at a time, or says its figures again, holds nobody. A client
that has not reported since it was asked (its way out never began: it is between two moves), or
whose eviction failed, is checkpointed where the daemon's checkpoint evictor reaches it; one
that stalled in the middle of its own way out is never checkpointed there (the process would
stop inside the driver with half its memory moved): like one the evictor cannot reach, it is
taken as unable to evict. When the room cannot be made at all, the waiter is refused, told who
holds the memory. An evicted client idle for ``checkpoint_after`` is checkpointed too (its
context is freed).

Every move of a residency goes through ``ClientRecord.settle`` (its table is in clients.py), and
what an eviction under way has heard is the client's ``Eviction`` record; each change of a client's
figures is booked in its GPU's ledger (ledger.py), which answers every "does it fit". What ended
is reported to the shell as an action: ``Restored``, ``Evicted``, ``Suspended`` (a checkpoint).
"""

from __future__ import annotations

from typing import final

from nodeside import protocol as p
from nodeside.formats import size
from nodeside.model import EVICTED, EVICTING, RESIDENT, RESTORING
from nodeside.scheduler import fair_eviction
from nodeside.scheduler.actions import (
    Action,
    Evict,
    Evicted,
    Restored,
    SchedulerError,
    Suspend,
    Suspended,
    Uncounted,
)
from nodeside.scheduler.clients import WaitingFor
from nodeside.scheduler.gpu_state import PRIORITY_RANK, ClientRecord, GpuState, HoldState
from nodeside.scheduler.ledger import counted, holding, need, occupies
from nodeside.scheduler.node import NodeState
from nodeside.scheduler.tiers import host_headroom, host_needed, spill_source

#: Evictors under which the client moves its own memory out when told ``evict``.
PAGES_ITSELF = ("managed", "vmm")
#: Bytes an eviction's resident figure must fall by to count as progress (the shim reports
#: every 256 MiB that leaves): a client cannot hold a waiter by moving a byte at a time.
PROGRESS_BYTES = 64 << 20
#: Evictors whose restore maps its memory chunk by chunk as the card frees it: such a client is
#: granted while the room it lacks is still on its way out (its way in overlaps the other's way
#: out, each on its own copy engine), and its restore waits for each chunk's room.
RESTORES_AS_ROOM_COMES = ("vmm",)


def granted(client: ClientRecord, now: float) -> None:
    """A memory client was granted: what it waited for is over; evicted, it moves back in.
    Whatever it could not evict before, its memory counts again from now on."""
    fair_eviction.granted(client, need(client), occupies(client))
    client.waiting_for = None
    eviction = client.eviction
    eviction.checkpoint = False
    eviction.failed = None
    if client.residency is EVICTED or client.residency is EVICTING:
        client.settle(RESTORING, now)


def check_claim(gpu: GpuState, resident: int | None, what: str) -> None:
    """A client may not say it has more on a GPU than the GPU has (SchedulerError)."""
    capacity = gpu.spec.memory_total
    if resident is not None and capacity is not None and resident > capacity:
        raise SchedulerError(p.E_INVALID, f"{what}: {size(resident)} is more than GPU "
                             f"{gpu.spec.index} has ({size(capacity)})")


@final
class ResidencyRules:
    """Each memory client's residency and bytes, and the evictions a grant waits for."""

    def __init__(self, state: NodeState) -> None:
        self.state = state

    # -- what clients say -------------------------------------------------------------------

    def track(self, client: ClientRecord, resident: int | None, host: int | None,
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
            client.settle(EVICTED, None)  # registered there: no second stage counts yet
        gpu = self.state.gpus[client.gpu]
        gpu.memory_clients[client.id] = client
        gpu.ledger.book(client)

    def forget(self, client: ClientRecord) -> None:
        gpu = self.state.gpus[client.gpu]
        gpu.memory_clients.pop(client.id, None)
        gpu.ledger.forget(client)
        for other in gpu.memory_clients.values():
            if other.waiting_for is not None and other.waiting_for.client == client.id:
                other.waiting_for = None

    def report(self, client: ClientRecord, resident: int | None, host: int | None,
               shadow: int | None = None, now: float = 0.0) -> list[Action]:
        """A ``working_set`` report with figures: progress of an eviction or of a restore
        (``Restored`` once nothing is left in host memory). A report never makes a client
        that could not evict evictable again (only its next grant does): saying its figures
        again cannot start another's wait over."""
        actions: list[Action] = []
        eviction = client.eviction
        if client.residency is EVICTING and eviction.asked_at is not None:
            # Its deadline follows its progress, from the ask: each report of PROGRESS_BYTES
            # fewer on the GPU (or none). A report that moves nothing puts nothing off, the
            # first one included (a liar saying its figures once more gains nothing), but it
            # says the way out began: from then on it is never checkpointed.
            if resident is not None and (
                    resident <= client.resident_bytes - PROGRESS_BYTES or not resident):
                eviction.progress_at = now
            eviction.began = True
        if shadow is not None:
            client.shadow_bytes = shadow
        if resident is not None:
            client.resident_bytes = resident
            client.memory_source = "shim"
        if host is not None:
            client.host_bytes = host
            client.memory_source = "shim"
        on_disk = client.tiering is not None and client.tiering.disk > 0
        if client.residency is RESTORING and not on_disk and (host == 0 or (
                host is None and resident is not None and client.host_bytes == 0)):
            began = eviction.since
            client.settle(RESIDENT, now)
            self.state.counts["restores"] += 1
            if began is not None:
                actions.append(Restored(client.id, client.gpu, now - began))
        elif client.residency is EVICTED and resident:
            client.settle(RESIDENT, now)  # it came back without a grant (mode off)
        self._seen(client)
        self._book(client)
        return actions

    def nvml_seen(self, client: ClientRecord, nbytes: int | None) -> None:
        """NVML's per-process used memory of ``client``'s process (None: NVML cannot vouch
        for it)."""
        client.nvml_bytes = nbytes
        self._seen(client)
        self._book(client)

    def _book(self, client: ClientRecord) -> None:
        """Whatever changed of ``client``'s memory, its GPU's ledger books it."""
        self.state.gpus[client.gpu].ledger.book(client)

    def _seen(self, client: ClientRecord) -> None:
        if client.nvml_bytes is not None:
            client.memory_source = "nvml"
        elif client.memory_source == "nvml":
            client.memory_source = "shim"
        if holding(client):
            fair_eviction.seen(client, occupies(client))

    def evicted(self, client: ClientRecord, resident: int | None, host: int | None,
                failed: str | None, now: float, shadow: int | None = None,
                seconds: float | None = None, moved: int | None = None) -> list[Action]:
        """An eviction ended (``evicted``), asked or of the client's own accord: ``Evicted``
        with what it moved (``moved`` bytes in ``seconds``, as it says). One that failed is
        checkpointed where the daemon reaches the process, else given up on."""
        actions = self._evicted(client, resident, host, failed, now, shadow)
        self._book(client)
        if failed is None:
            nbytes = moved or 0
            self.state.counts["evicted_bytes"] += nbytes
            actions.append(Evicted(client.id, client.gpu, seconds, nbytes))
        return actions

    def _evicted(self, client: ClientRecord, resident: int | None, host: int | None,
                 failed: str | None, now: float, shadow: int | None) -> list[Action]:
        check_claim(self.state.gpus[client.gpu], resident, "evicted.resident")
        asked = client.residency
        client.eviction.asked(None)
        if shadow is not None:
            client.shadow_bytes = shadow
        if resident is not None:
            client.resident_bytes = resident
        if host is not None:
            client.host_bytes = host
        if resident is not None or host is not None:
            client.memory_source = "shim"
        self._seen(client)
        if failed is not None:
            if asked is RESTORING:
                # A restore that ran out of memory rolled back: its memory is in host memory,
                # and it asks for the GPU again when it needs it.
                client.settle(EVICTED, now)
                return []
            client.settle(RESIDENT, now)
            return self._could_not_evict(client, failed, "failed", now)
        client.eviction.failed = None
        client.settle(EVICTED, now)
        client.eviction.since = now  # evicted again: the second stage counts from now
        return []

    def _could_not_evict(self, client: ClientRecord, why: str, reason: str,
                         now: float) -> list[Action]:
        """``client`` could not move its memory out (``why``): checkpointed where the daemon's
        evictor reaches it and it is between two moves; else not asked again until its next
        grant, and what only its claim says it holds no longer counts against others' room.
        Never checkpointed in the middle of its own way out (it reported since it was asked):
        the process would stop inside the driver with half its memory moved, and hang."""
        gpu = self.state.gpus[client.gpu]
        eviction = client.eviction
        if client.checkpointable and not eviction.checkpoint and not eviction.began:
            eviction.checkpoint = True
            client.settle(EVICTING, now)
            eviction.asked(None)
            self._count(client, reason)
            for waiter in gpu.waiters.values():
                if waiter.waiting_for is not None and waiter.waiting_for.client == client.id:
                    waiter.waiting_for = WaitingFor(
                        client.id, client.display_name, occupies(client), "checkpoint")
            return [Suspend(client.id, gpu.spec.index, reason)]
        before = counted(client)
        eviction.failed = why
        client.settle(RESIDENT, now)
        eviction.asked(None)
        if before and not counted(client):
            return [Uncounted(client.id, gpu.spec.index, before, why)]
        return []

    def released_evicting(self, client: ClientRecord, now: float) -> None:
        """A holder released with ``evicting``: its memory is on its way out (booked when
        its hold ends)."""
        client.settle(EVICTING, now)
        client.eviction.asked(now)
        self._count(client, "release")

    def _count(self, client: ClientRecord, reason: str) -> None:
        books = self.state.gpus[client.gpu].evictions
        books[reason] = books.get(reason, 0) + 1


    def checkpointed(self, client: ClientRecord, error: str | None, now: float,
                     memory_free: bool = False) -> list[Action]:
        """The checkpoint evictor finished a ``Suspend``: the process's memory is in host
        memory, or (``error``) it could not be moved; ``memory_free``: the process holds no
        GPU memory at all (the driver knows no CUDA process by its pid), whatever it says."""
        actions = self._checkpointed(client, error, now, memory_free)
        self._book(client)
        return actions

    def _checkpointed(self, client: ClientRecord, error: str | None, now: float,
                      memory_free: bool) -> list[Action]:
        eviction = client.eviction
        eviction.asked(None)
        if memory_free:
            # Counted as holding none, whatever it reports, until its next grant.
            client.resident_bytes = 0
            if client.nvml_bytes is not None:
                client.nvml_bytes = 0
            eviction.failed = f"holds no GPU memory ({error})" if error else \
                "holds no GPU memory"
            client.settle(RESIDENT, now)
            return []
        if error is not None:
            return self._could_not_evict(client, f"checkpoint failed: {error}", "checkpoint",
                                         now)
        moved = occupies(client)
        client.host_bytes += moved
        client.resident_bytes = 0
        if client.nvml_bytes is not None:
            client.nvml_bytes = 0
        client.settle(EVICTED, now)  # already there (the second stage): since stays
        return [Suspended(client.id, client.gpu, moved)]

    # -- the room a grant needs ---------------------------------------------------------------

    def coming(self, gpu: GpuState, candidate: ClientRecord) -> int:
        """Bytes on their way out of ``gpu`` (clients told to evict, or released ``evicting``,
        with no failure) that ``candidate`` may count as room already: all of them when its
        restore waits for room chunk by chunk (``handoff_overlap``), else none."""
        if not self.state.config.handoff_overlap or candidate.evict not in RESTORES_AS_ROOM_COMES:
            return 0
        return gpu.ledger.outgoing_except(candidate)

    def make_room(self, gpu: GpuState, candidate: ClientRecord, short: int,
                  now: float) -> tuple[list[Action], str | None]:
        """Ask idle clients to evict ``short`` bytes for ``candidate``. Returns the actions and,
        when the room cannot be made whatever is asked, why (the waiter is refused)."""
        on_the_way: list[ClientRecord] = []
        evictable: list[ClientRecord] = []
        later: list[ClientRecord] = []
        stuck: list[ClientRecord] = []
        config = self.state.config
        tq = self.state.tq_for(gpu.spec.index)
        retry_at: float | None = None
        for client in gpu.memory_clients.values():
            if client is candidate or holding(client) or not counted(client):
                continue
            eviction = client.eviction
            if client.residency is EVICTING and eviction.failed is None:
                on_the_way.append(client)
            elif eviction.failed is None and (
                    (client.residency is RESIDENT and (
                        client.evict in PAGES_ITSELF or client.checkpointable))
                    or (client.residency is EVICTED and client.checkpointable
                        and not eviction.checkpoint)):
                # Evictable; as often as fair_eviction.py allows, for this waiter.
                at = max(fair_eviction.may_ask_at(client, candidate, config.evict_interval,
                                                  tq), candidate.may_ask_from)
                if at > now:
                    later.append(client)
                    retry_at = at if retry_at is None else min(retry_at, at)
                else:
                    evictable.append(client)
            else:
                stuck.append(client)
        gpu.evict_retry_at = None
        coming = sum(counted(c) for c in on_the_way)
        can = sum(counted(c) for c in evictable)
        if coming + can + sum(counted(c) for c in later) < short:
            if on_the_way:
                self._wait_for(candidate, on_the_way)
                return [], None  # what is under way may still be enough after a timeout
            return [], self._no_room(gpu, candidate, short, stuck)
        actions: list[Action] = []
        missing = short - coming
        evictable.sort(key=lambda c: (c.hold_state is HoldState.WAITING,
                                      -PRIORITY_RANK[c.priority], c.last_used))
        chosen: list[ClientRecord] = []
        for client in evictable:
            if missing <= 0:
                break
            missing -= counted(client)
            chosen.append(client)
        going, refused = self._host_room(candidate, chosen, on_the_way, now)
        if refused is not None or not going and chosen:
            return [], refused  # spills make the host room first (tiers.py)
        # Of those chosen, those the host room holds now: the rest on a later pass.
        for client in going:
            on_the_way.append(client)
            actions.append(self._ask(gpu, client, candidate, counted(client), now))
            gpu.ledger.book(client)
        if missing > 0:
            gpu.evict_retry_at = retry_at  # the rest may be asked then
        self._wait_for(candidate, on_the_way or later)
        return actions, None

    def _host_room(self, candidate: ClientRecord, chosen: list[ClientRecord],
                   on_the_way: list[ClientRecord],
                   now: float) -> tuple[list[ClientRecord], str | None]:
        """Where the node plans its host memory (feature ``tiers``): the host memory the
        evictions take (``chosen``, and what those ``on_the_way`` have still to move) must fit
        in the host budget's headroom. Short, spills make it (``host_wanted``), the waiter
        ``waiting_for`` them; with nothing to spill, as many go as the headroom holds (the rest
        once their host copies can spill); with none, the waiter is refused, saying why.
        Returns the evictions to ask now, and the refusal (None: none)."""
        state = self.state
        state.host_wanted = 0
        headroom = host_headroom(state)
        if not chosen or not state.tiered or headroom is None:
            return chosen, None
        headroom -= sum(host_needed(c, counted(c)) for c in on_the_way)
        needs = [host_needed(c, counted(c)) for c in chosen]
        needed = sum(needs)
        if needed <= 0 or needed <= headroom:
            return chosen, None  # into shadows pinned already: nothing more of the budget
        spiller = spill_source(state, now)
        if spiller is not None:
            state.host_wanted = needed - max(0, headroom)
            candidate.waiting_for = WaitingFor(spiller.id, spiller.display_name,
                                               spiller.host_bytes, "spill")
            return [], None
        going: list[ClientRecord] = []
        for client, nbytes in zip(chosen, needs, strict=True):
            if nbytes > headroom:
                break
            going.append(client)
            headroom -= nbytes
        if going:
            return going, None
        return [], (f"{candidate.display_name} needs {size(needed)} of host memory moved out "
                    f"of its way, and the node's host budget ({size(state.host_budget)}) has "
                    f"{size(max(0, headroom))} left, with nothing more to spill to disk")

    def _ask(self, gpu: GpuState, client: ClientRecord, candidate: ClientRecord, nbytes: int,
             now: float) -> Action:
        """Ask ``client`` to evict ``nbytes`` for ``candidate``, and keep the books."""
        client.eviction.asked(now)
        fair_eviction.asked(client, candidate, now)
        self.state.counts["evictions"] += 1
        self._count(client, "room")
        by = gpu.evictions_by
        by[candidate.priority] = by.get(candidate.priority, 0) + 1
        if client.residency is RESIDENT and client.evict in PAGES_ITSELF:
            client.settle(EVICTING, now)
            return Evict(client.id, gpu.spec.index, nbytes, candidate.display_name)
        client.settle(EVICTING, now)
        client.eviction.checkpoint = True
        return Suspend(client.id, gpu.spec.index, "room")

    def _wait_for(self, candidate: ClientRecord, on_the_way: list[ClientRecord]) -> None:
        first = max(on_the_way, key=counted)
        candidate.waiting_for = WaitingFor(
            first.id, first.display_name, counted(first),
            "checkpoint" if first.eviction.checkpoint else "evict")

    def _no_room(self, gpu: GpuState, candidate: ClientRecord, short: int,
                 stuck: list[ClientRecord]) -> str:
        holders = [*gpu.holders.values(), *stuck]
        who = ", ".join(f"{c.display_name} ({size(need(c) if holding(c) else counted(c))}"
                        f"{', ' + c.evict_failed if c.evict_failed else ''})" for c in holders)
        return (f"{candidate.display_name} needs {size(need(candidate))} on GPU "
                f"{gpu.spec.index}, {size(short)} more than is free, and that room cannot be "
                f"made: the memory is held by {who or 'nobody the scheduler knows'}")

    # -- time passing -------------------------------------------------------------------------

    def due(self, gpu: GpuState, now: float) -> list[Action]:
        """Evictions without progress for ``evict_timeout``, and evicted clients past
        ``checkpoint_after``."""
        config = self.state.config
        actions: list[Action] = []
        for client in list(gpu.memory_clients.values()):
            at = self._stalled_at(client)
            if at is not None and now >= at:
                actions.extend(self._could_not_evict(
                    client, _stall(client, config.evict_timeout), "timeout", now))
                gpu.ledger.book(client)
                continue
            at = self._second_stage_at(client)
            if at is not None and now >= at:
                client.eviction.checkpoint = True
                self._count(client, "idle")
                actions.append(Suspend(client.id, gpu.spec.index, "idle"))
        return actions

    def deadline(self, gpu: GpuState) -> float | None:
        """When ``due`` next has something to do on ``gpu``, or a waiter may ask again."""
        best = gpu.evict_retry_at
        for client in gpu.memory_clients.values():
            at = self._stalled_at(client)
            if at is None:
                at = self._second_stage_at(client)
            if at is not None and (best is None or at < best):
                best = at
        return best

    def _stalled_at(self, client: ClientRecord) -> float | None:
        """When an eviction under way has gone ``evict_timeout`` without progress."""
        return _evict_due(client, self.state.config.evict_timeout)

    def _second_stage_at(self, client: ClientRecord) -> float | None:
        after = self.state.config.checkpoint_after
        since = client.eviction.since
        if after <= 0 or not client.checkpointable or client.eviction.checkpoint or \
                client.residency is not EVICTED or since is None or \
                client.hold_state is not HoldState.IDLE:
            return None
        return since + after


def _evict_due(client: ClientRecord, evict_timeout: float) -> float | None:
    """When a client on its way out has made no progress for ``evict_timeout``: counted from
    its last progress since it was asked, or from the ask; None when no deadline runs."""
    eviction = client.eviction
    asked = eviction.asked_at
    if client.residency is not EVICTING or asked is None or eviction.checkpoint:
        return None
    progress = eviction.progress_at
    return (asked if progress is None else progress) + evict_timeout


def _stall(client: ClientRecord, evict_timeout: float) -> str:
    """Why ``client``'s eviction is given up on, as the log and its status say."""
    if client.eviction.began:
        return f"made no progress evicting for {evict_timeout:g} s (evict_timeout)"
    return f"did not begin to evict within {evict_timeout:g} s (evict_timeout)"
