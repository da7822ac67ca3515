"""Memory tiers (feature ``tiers``): the node's host budget, each client's pin budget, spills
to disk and fetches back on intent.

The host budget is the node's, one figure shared by every GPU (``NodeState.host_budget``: the
config's ``host_budget``, else measured: Kiwi's own counted host use plus what the shell last
read of MemAvailable less a margin, read every ``HOST_READ_EVERY`` seconds and before an
acquire when older than ``HOST_READ_FRESH``). Host use is counted over
every ``memory`` client of the node (``host_use``): the host copies of evicted memory (pinned
or pageable alike: ``host_bytes``) and the pinned shadows made ahead beyond them (``pinned``
over ``host_bytes``, for clients that speak ``tiers``; ``shadow`` for those that do not).

Pin budgets (``plan_pins``): what the budget leaves beside the host copies already there is
shared out among the ``tiers`` clients whose memory is on the GPU, most recently used first
(least recently used last), each up to what it has on the GPU (and its staging ring) and the
config's ``pin_budget``; an evicted client keeps what its host copy pins, and its ring. A budget
is told only when it changes (``PinBudget``), so the sum told never exceeds the budget.

Spills (``due``): an idle evicted client whose host copy has sat ``spill_after`` since its
eviction ended is asked to ``spill`` ("idle"), and while host use exceeds the budget the idle
evicted clients are asked too, longest idle first, until what they free covers the excess
("budget"). A move that failed (``tier_failed``) is not asked again until a report changes the
client's figures.

Intents (``intent``): memory on disk is fetched to host memory at once; memory in host memory
is fetched on to the GPU when the GPU's ledger says it fits beside the holders and what idle
clients keep there, else the intent waits and is acted on when room appears (``due``). A hint
never takes the GPU from a holder and never asks anyone to evict.

Where a client's memory is (``tier``) follows from its residency and its figures; the move
between host and disk under way is the client's ``Tiering.moving``, written only by ``_move``.
"""

from __future__ import annotations

from typing import Final, final

from nodeside import protocol as p
from nodeside.model import EVICTED, EVICTING, RESIDENT, RESTORING
from nodeside.scheduler.actions import Action, Fetch, PinBudget, SchedulerError, Spill, TierMoved
from nodeside.scheduler.clients import Tiering
from nodeside.scheduler.gpu_state import ClientRecord, HoldState
from nodeside.scheduler.ledger import need
from nodeside.scheduler.node import NodeState

#: The tiers a ``tier_moved`` may end in, and the moves a client may be asked for.
MOVED_TO: Final = ("host", "disk")
SPILL: Final = "spill"
FETCH: Final = "fetch"
#: Why an intent came: a cell is about to run, or its notebook came to the front (which only
#: brings memory from disk to host memory: the kernel may not run anything yet).
INTENT_REASONS: Final = ("execute", "front")
#: What a kernel pins besides its shadows: the vmm evictor's staging ring (vmm_builder.c: two
#: 16 MiB slots per copier thread, at most 8 copiers), counted in the pin budget it is told.
#: A budget of just the working set would leave the last chunk's shadow unpinned.
STAGING_RING: Final = 16 * 2 * 8 * 2**20
#: A measured host budget older than this is read again before a decision that plans with it
#: (an acquire); the shell reads it every ``HOST_READ_EVERY`` seconds besides.
HOST_READ_FRESH: Final = 5.0
HOST_READ_EVERY: Final = 30.0
#: Bytes a move's disk figure must change by to count as progress (the shim reports after each
#: batch): a client cannot hold a waiter by moving a byte at a time.
TIER_PROGRESS_BYTES: Final = 64 << 20
#: A move given up waits ``tier_timeout`` before the next is asked, twice that after the next
#: give-up, and so on up to this many times ``tier_timeout``.
BACKOFF_MOST: Final = 8


def tier(client: ClientRecord) -> str:
    """Where ``client``'s memory is: "gpu", "host", "disk" or "moving" (the status)."""
    tiering = client.tiering
    residency = client.residency
    if (tiering is not None and tiering.moving is not None) or residency is EVICTING \
            or residency is RESTORING:
        return "moving"
    if residency is EVICTED:
        return "disk" if tiering is not None and tiering.disk and not client.host_bytes \
            else "host"
    return "gpu"


def host_use(client: ClientRecord) -> int:
    """Host memory ``client`` takes: its host copy, and pinned shadows made beyond it."""
    tiering = client.tiering
    ahead = client.shadow_bytes if tiering is None else tiering.pinned
    return max(client.host_bytes, ahead)


def host_used(state: NodeState) -> int:
    """Host memory the node's memory clients take, as they count it (``host_use``)."""
    used = 0
    for client in state.clients.values():
        if client.memory:
            used += host_use(client)
    return used


def host_headroom(state: NodeState) -> int | None:
    """Bytes of the host budget no client takes (negative: over it; None: no budget)."""
    budget = state.host_budget
    return None if budget is None else budget - host_used(state)


def host_needed(client: ClientRecord, nbytes: int) -> int:
    """New host memory an eviction of ``nbytes`` of ``client`` takes: what its pinned memory
    made ahead (beyond its host copy) does not hold already."""
    return max(0, nbytes - max(0, host_use(client) - client.host_bytes))


def spill_source(state: NodeState, now: float) -> ClientRecord | None:
    """The ``tiers`` client whose spill makes host room: one spilling now, else the one to be
    asked next (idle, evicted, in host memory, nothing under way, no failure standing, not
    backing off; the longest idle first). None: nobody can spill."""
    askable: list[ClientRecord] = []
    for client in state.tiered.values():
        tiering = client.tiering
        if tiering is None:
            continue
        if tiering.moving == SPILL:
            return client
        if client.hold_state is HoldState.IDLE and client.residency is EVICTED \
                and client.host_bytes > 0 and tiering.moving is None \
                and tiering.failed_at is None and not _backing_off(tiering, now):
            askable.append(client)
    return min(askable, key=lambda c: (c.eviction.since or 0.0, c.last_used), default=None)


@final
class TierRules:
    """Every ``tiers`` client's host memory and disk, against the node's host budget."""

    def __init__(self, state: NodeState) -> None:
        self.state = state
        #: The clients that speak ``tiers``, by id: nothing here is asked while it is empty.
        self.clients: dict[str, ClientRecord] = state.tiered

    # -- what clients say -----------------------------------------------------------------

    def track(self, client: ClientRecord, disk: int | None) -> None:
        """``client`` speaks ``tiers`` (its ``register`` may say it has spill files)."""
        tiering = client.tiering = Tiering()
        tiering.disk = disk or 0
        self.clients[client.id] = client
        if tiering.disk and client.residency is RESIDENT and not client.resident_bytes:
            client.settle(EVICTED, None)  # registered with its memory on disk

    def report(self, client: ClientRecord, disk: int | None, pinned: int | None,
               host: int | None = None, now: float | None = None) -> None:
        """A report's ``disk`` and ``pinned`` (and ``host``, which the residency rules book):
        progress of a move (its ``tier_timeout`` runs again from ``now`` once the disk figure
        moved by ``TIER_PROGRESS_BYTES``). Figures that changed make a client whose move failed
        askable again."""
        tiering = client.tiering
        if tiering is None:
            return
        if disk is not None:
            tiering.disk = disk
        if pinned is not None:
            tiering.pinned = pinned
        if now is not None and tiering.moving is not None and \
                abs(tiering.disk - tiering.progress_disk) >= TIER_PROGRESS_BYTES:
            tiering.progress_at, tiering.progress_disk = now, tiering.disk
        now_at = (client.host_bytes if host is None else host, tiering.disk)
        if tiering.failed_at is not None and tiering.failed_at != now_at:
            tiering.failed_at = None

    def moved(self, client: ClientRecord, to: str, host: int | None, disk: int | None,
              moved: int | None, seconds: float | None, failed: str | None,
              now: float) -> list[Action]:
        """A ``tier_moved``: the move ended (``failed``: the memory stayed where it was)."""
        tiering = _tiering(client)
        if to not in MOVED_TO:
            raise SchedulerError(p.E_INVALID, f"tier must be one of {', '.join(MOVED_TO)}")
        if host is not None:
            client.host_bytes = host
        if disk is not None:
            tiering.disk = disk
        self._move(tiering, None, now)
        if failed is None:
            tiering.backoff, tiering.retry_at = 0.0, None
        tiering.failed = failed
        tiering.failed_at = None if failed is None else (client.host_bytes, tiering.disk)
        actions: list[Action] = [TierMoved(client.id, client.gpu, to, moved or 0, seconds,
                                           failed)]
        if failed is None and to == "host" and tiering.intent and client.residency is EVICTED:
            tiering.intent = not self._fetch_gpu(client, actions)  # else when room appears
        return actions

    def intent(self, client: ClientRecord, reason: str, now: float) -> list[Action]:
        """A hint that ``client`` is about to work: bring its memory a tier closer."""
        tiering = _tiering(client)
        if reason not in INTENT_REASONS:
            raise SchedulerError(p.E_INVALID, f"reason must be one of "
                                 f"{', '.join(INTENT_REASONS)}")
        if client.residency is not EVICTED or tiering.moving == FETCH:
            return []  # on the GPU or on its way: nothing to bring
        actions: list[Action] = []
        where = tier(client)
        if where == "disk" or (where == "moving" and tiering.moving == SPILL):
            self._move(tiering, FETCH, now)
            actions.append(Fetch(client.id, client.gpu, "host"))
            tiering.intent = reason == "execute"  # on to the GPU once in host memory
        elif reason == "execute":
            tiering.intent = not self._fetch_gpu(client, actions)
        return actions

    def forget(self, client: ClientRecord) -> None:
        self.clients.pop(client.id, None)

    # -- the daemon's decisions -----------------------------------------------------------

    def stalled(self, now: float) -> list[Action]:
        """Moves without progress for ``tier_timeout``, given up: the client's ``tier_failed``
        says so, nothing counts on the move any more (a waiter's evictions no longer wait for
        it), and it is asked no spill before its backoff ends."""
        timeout = self.state.config.tier_timeout
        actions: list[Action] = []
        if timeout <= 0:
            return actions
        for client in self.clients.values():
            tiering = client.tiering
            if tiering is None or tiering.moving is None or tiering.progress_at is None or \
                    now < tiering.progress_at + timeout:
                continue
            what = tiering.moving
            self._move(tiering, None, now)
            tiering.backoff = timeout if tiering.backoff <= 0 \
                else min(2 * tiering.backoff, BACKOFF_MOST * timeout)
            tiering.retry_at = now + tiering.backoff
            tiering.failed = (f"the {what} made no progress for {timeout:g} s and was given up; "
                              f"none is asked for {tiering.backoff:g} s")
            tiering.failed_at = None
            actions.append(TierMoved(client.id, client.gpu, "disk" if what == FETCH else "host",
                                     0, None, tiering.failed))
        return actions

    def due(self, now: float) -> list[Action]:
        """Spills due (``spill_after``, a host budget short), fetches whose room appeared and
        pin budgets that changed."""
        actions: list[Action] = []
        if not self.clients:
            return actions
        for client in self.clients.values():
            tiering = client.tiering
            if tiering is None:
                continue
            if tiering.moving is not None and client.hold_state is not HoldState.IDLE:
                self._move(tiering, None, now)  # granted: its restore brings everything back
            if not tiering.intent:
                continue
            if client.residency is not EVICTED:
                tiering.intent = False  # it came back, by a grant or a fetch
            elif tiering.moving is None and client.host_bytes:
                tiering.intent = not self._fetch_gpu(client, actions)
        spill_after = self.state.config.spill_after
        excess = self.excess() + self.state.host_wanted - self._spilling()
        self.state.host_wanted = 0  # the grant waiting says it again on its next pass
        for client in self._spillable(now):
            since = client.eviction.since
            idle_long = spill_after > 0 and since is not None and since + spill_after <= now
            if not idle_long and excess <= 0:
                break  # longest idle first: the rest are idle for less
            assert client.tiering is not None
            self._move(client.tiering, SPILL, now)
            actions.append(Spill(client.id, client.gpu, None, "idle" if idle_long
                                 else "budget"))
            excess -= client.host_bytes
        actions.extend(self.plan_pins())
        return actions

    def deadline(self, now: float) -> float | None:
        """When the next spill for being idle is due, a move runs out of ``tier_timeout`` or
        a backoff ends (None: none of them)."""
        if not self.clients:
            return None
        config = self.state.config
        due: float | None = None
        for client in self.clients.values():
            tiering = client.tiering
            if tiering is None:
                continue
            if config.tier_timeout > 0 and tiering.moving is not None and \
                    tiering.progress_at is not None:
                due = _earlier(due, tiering.progress_at + config.tier_timeout)
            if _backing_off(tiering, now):
                due = _earlier(due, tiering.retry_at)
        if config.spill_after > 0:
            for client in self._spillable(now):
                since = client.eviction.since
                if since is not None:
                    return _earlier(due, since + config.spill_after)  # the longest idle first
        return due

    def excess(self) -> int:
        """Bytes by which the node's host use exceeds its budget (0: within it, or none)."""
        headroom = host_headroom(self.state)
        return 0 if headroom is None else max(0, -headroom)

    def plan_pins(self) -> list[Action]:
        """Each ``tiers`` client's pin budget (see the module's comment), told where changed."""
        budget = self.state.host_budget
        if budget is None:
            return []
        cap = self.state.config.pin_budget
        clients = list(self.clients.values())
        left = budget
        for client in self.state.clients.values():
            if client.memory and client.residency is not RESIDENT:
                left -= client.host_bytes  # host copies already there, pinned or not
        planned: dict[str, int] = {}
        for client in sorted(clients, key=lambda c: -c.last_used):
            if client.residency is not EVICTED:  # on the GPU, or moving: its pins serve the move
                share = max(0, min(left, need(client) + STAGING_RING))
                left -= share
            else:  # its host copy, which it keeps pinned where it is, and its ring
                ring = max(0, min(left, STAGING_RING))
                left -= ring
                share = client.host_bytes + ring
            planned[client.id] = share if cap is None else min(share, cap)
        actions: list[Action] = []
        for client in clients:
            tiering = client.tiering
            assert tiering is not None
            if tiering.pin_budget != planned[client.id]:
                tiering.pin_budget = planned[client.id]
                actions.append(PinBudget(client.id, client.gpu, planned[client.id]))
        return actions

    # -- helpers --------------------------------------------------------------------------

    def _spilling(self) -> int:
        """Host bytes the spills under way are freeing: asked for once, not again."""
        return sum(c.host_bytes for c in self.clients.values()
                   if c.tiering is not None and c.tiering.moving == SPILL)

    def _spillable(self, now: float) -> list[ClientRecord]:
        """Idle evicted ``tiers`` clients with a host copy and nothing under way, longest
        idle first, leaving out those whose move failed until their figures change and those
        backing off from a move given up."""
        found = []
        for client in self.clients.values():
            tiering = client.tiering
            if tiering is not None and client.hold_state is HoldState.IDLE and \
                    client.residency is EVICTED and client.host_bytes > 0 and \
                    tiering.moving is None and tiering.failed_at is None and \
                    not tiering.intent and not _backing_off(tiering, now):
                found.append(client)
        found.sort(key=lambda c: (c.eviction.since or 0.0, c.last_used))
        return found

    def _fits(self, client: ClientRecord) -> bool:
        """Its memory fits on its GPU now beside the holders and idle clients' counted bytes
        (the capacity unknown: never, a hint takes no chances)."""
        ledger = self.state.gpus[client.gpu].ledger
        room = ledger.room
        if room is None:
            return False
        wanted = max(need(client), client.host_bytes)
        return ledger.holders_need(client) + ledger.idle_except(client) + wanted <= room

    def _fetch_gpu(self, client: ClientRecord, actions: list[Action]) -> bool:
        """Ask for its memory on the GPU where it fits now; False: not yet."""
        if not self._fits(client):
            return False
        actions.append(Fetch(client.id, client.gpu, "gpu"))
        return True

    @staticmethod
    def _move(tiering: Tiering, to: str | None, now: float) -> None:
        """The one place a move between host and disk starts or ends."""
        tiering.moving = to
        tiering.progress_at = None if to is None else now
        tiering.progress_disk = tiering.disk


def _backing_off(tiering: Tiering, now: float) -> bool:
    return tiering.retry_at is not None and tiering.retry_at > now


def _earlier(at: float | None, other: float | None) -> float | None:
    if at is None:
        return other
    return at if other is None or at <= other else other


def _tiering(client: ClientRecord) -> Tiering:
    tiering = client.tiering
    if tiering is None:
        raise SchedulerError(p.E_STATE, "this needs the tiers feature (hello)")
    return tiering
