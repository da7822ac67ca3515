"""The scheduler's rules, sans I/O: events and the current time in, actions out.

One ``Scheduler`` arbitrates every GPU of a node. The asyncio shell (nodeside.daemon) calls a
method for each thing that happens (a client registers, asks for its GPU, gives it back, goes
away; an admin changes the mode or the TQ; time passes) and carries out the actions returned:
grant, ask to drop, revoke, pause, resume. There are no sockets, clocks or threads here, so
every rule can be tested to the millisecond with a fake clock.

The rules, per GPU:

* mode ``off``: every request is granted at once;
* mode ``on``: one holder at a time, for a time quantum (TQ). When the quantum ends and someone
  eligible waits, the holder is asked to drop the GPU; a holder that still wants it asks again and
  joins the tail. When nobody waits it keeps the GPU for another quantum and hears nothing;
* mode ``auto``: holders run side by side while their working sets fit in the GPU's memory; a
  request that does not fit waits, and contenders are served by quanta as in mode ``on``;
* who is next: the pool furthest below its entitlement (guarantee first, then weight, never
  past a maximum), HIGH before NORMAL before LOW, then request order (``policy: round-robin``),
  or least GPU time used recently (``policy: interactive``); a request owed its pool's
  guarantee has a LOW holder give the GPU back at once (preemption);
* a holder that must leave (a drop) is told whether the next holder needs its room (``evict``).
  One that leaves of its own accord can ask first (``release(..., evict_first=True)``): when the
  room is needed it is kept as a drop until it has moved its memory out, so the GPU never has
  two working sets paging through it at once.

Where each rule lives. ``Scheduler`` is a facade: it makes the node's state and the components
that change it, and hands each event to the one that takes it.

* ``node.NodeState``: the config, mode and TQ, the GPUs (gpu_state.py) and clients with their hold
  state (clients.py), the policy, the counters;
* ``membership.Membership``: clients registering (claims judged by access.py) and leaving;
* ``controls.Controls``: the admin's mode and TQ, a reloaded config;
* ``turns.Turns``: every change of a hold (through ``moves.Moves``, its own) and what follows
  each event on a GPU: grants, quanta ending, preemption, revocation;
* ``taking_turns.TakingTurns``: mode auto, which holder side by side works now;
* ``room.Room``: what fits in a GPU's memory, and who must evict;
* ``queries.Queries``: the next deadline, the queue and positions, for the shell and the status;
* the policy (``choosing.PoolsPolicy``, ``interactive.InteractivePolicy``, by name in
  ``policies.POLICIES``), which sees the node only through ``view.PolicyView``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final, final

from nodeside.config import SchedulerConfig
from nodeside.model import MemoryFigures, Pool, Registration
from nodeside.scheduler.actions import (
    Action,
    Drop,
    Evict,
    Evicted,
    Fetch,
    Grant,
    Pause,
    PinBudget,
    Refuse,
    Released,
    Restored,
    Resume,
    Revoke,
    SchedulerError,
    Spill,
    Suspend,
    Suspended,
    TierMoved,
    Uncounted,
)
from nodeside.scheduler.choosing import PoolsPolicy
from nodeside.scheduler.clients import WaitingFor
from nodeside.scheduler.controls import Controls
from nodeside.scheduler.gpu_state import (
    PRIORITY_RANK,
    ClientRecord,
    GpuSpec,
    GpuState,
    Hold,
    HoldState,
    IllegalTransition,
)
from nodeside.scheduler.membership import Membership
from nodeside.scheduler.node import NodeState
from nodeside.scheduler.pools import preemption_off_reason
from nodeside.scheduler.queries import Queries
from nodeside.scheduler.residency import ResidencyRules
from nodeside.scheduler.room import Room
from nodeside.scheduler.taking_turns import TakingTurns
from nodeside.scheduler.tiers import HOST_READ_FRESH, TierRules, host_used
from nodeside.scheduler.turns import Turns
from nodeside.scheduler.view import PolicyView

# The actions and the state types are part of this module's interface: the daemon and the tests
# import them from here, the one place that says what the scheduler does.
__all__ = ["PRIORITY_RANK", "Action", "ClientRecord", "Drop", "Evict", "Evicted", "Fetch",
           "GpuSpec", "GpuState", "Grant", "Hold", "HoldState", "IllegalTransition", "Pause",
           "PinBudget", "Refuse", "Released", "Restored", "Resume", "Revoke", "Scheduler",
           "SchedulerError", "Spill", "Suspend", "Suspended", "TierMoved", "Uncounted",
           "WaitingFor"]


#: A report that says nothing of where the memory is.
NOTHING_SAID: Final = MemoryFigures()


@final
class Scheduler:
    """Every GPU of one node: its clients, pools, policy and clock-free rules, behind one
    object the shell holds. Each method hands its event to the component that takes it."""

    def __init__(self, config: SchedulerConfig, gpus: Iterable[GpuSpec], now: float) -> None:
        self._state = state = NodeState(config, gpus, now)
        room = Room(state)
        taking = TakingTurns(state)
        self._residency = residency = ResidencyRules(state)
        self._turns = turns = Turns(state, room, taking, residency)
        self._membership = Membership(state, turns)
        self._controls = Controls(state, turns)
        self._queries = Queries(state, room, turns, taking, residency)
        self._taking = taking
        self._tiers = TierRules(state)
        # The same dicts as the state's, for ever: read here without a call.
        self.gpus: dict[int, GpuState] = state.gpus
        self.clients: dict[str, ClientRecord] = state.clients
        self.counts: dict[str, int] = state.counts

    # -- the node's state, as the shell and the status read it ----------------------------

    @property
    def config(self) -> SchedulerConfig:
        return self._state.config

    @property
    def mode(self) -> str:
        return self._state.mode

    @property
    def tq(self) -> float:
        return self._state.tq

    @property
    def preemption(self) -> bool:
        return self._state.preemption

    @property
    def capped(self) -> bool:
        return self._state.capped

    @property
    def choice(self) -> PoolsPolicy:
        """The policy choosing the next holder (``policy:`` in the config)."""
        return self._state.choice

    @choice.setter
    def choice(self, policy: PoolsPolicy) -> None:
        self._state.choice = policy

    @property
    def view(self) -> PolicyView:
        """What a policy made for this scheduler is given to read."""
        return self._state

    @property
    def preemption_off_reason(self) -> str | None:
        """Why preemption is off (for the start-up log, status and ``kiwictl pools``)."""
        return preemption_off_reason(self._state.config.pools)

    def pool(self, name: str) -> Pool:
        return self._state.pool(name)

    def tq_for(self, gpu: int) -> float:
        return self._state.tq_for(gpu)

    # -- clients joining and leaving (membership.py) --------------------------------------

    def register(self, now: float, registration: Registration) -> ClientRecord:
        """A new client (``Membership.register`` says how its claims are judged)."""
        return self._membership.register(now, registration)

    def track_memory(self, client_id: str, figures: MemoryFigures | None = None, *,
                     checkpointable: bool = False) -> None:
        """The client speaks the ``memory`` feature (residency.py): its resident memory counts
        from now on, and while idle it may be asked to evict. ``figures``: where its memory
        already is; ``checkpointable``: the daemon's checkpoint evictor reaches its process
        (the daemon refuses a ``resident`` larger than the GPU before it registers the
        client)."""
        said = figures or NOTHING_SAID
        self._residency.track(self._state.client(client_id), said.resident, said.host,
                              said.shadow, checkpointable)

    def unregister(self, now: float, client_id: str) -> list[Action]:
        """The client's connection is gone: free whatever it held or waited for, at once."""
        client = self._state.clients.get(client_id)
        if client is not None:
            self._tiers.forget(client)
        return self._tiers_due(self._membership.unregister(now, client_id), now)

    # -- a client's requests, and time passing (turns.py) ---------------------------------

    def acquire(self, now: float, client_id: str) -> list[Action]:
        actions = self._turns.acquire(self._state.client(client_id), now)
        return self._tiers_due(actions, now) if self._tiers.clients else actions

    def release(self, now: float, client_id: str, *, evict_first: bool = False,
                evicting: bool = False) -> list[Action]:
        """Give the GPU back, or cancel a wait. Only ever the caller's own hold.

        ``evict_first``: the holder is leaving of its own accord (a cell ended, an idle spell)
        and can move its memory to host before the next holder starts. When the next holder
        needs that room, the GPU is not handed over yet: the hold becomes a drop (reason
        ``release``, evict, the usual grace and revocation) and the answer is that ``Drop``
        instead of ``Released``; the holder evicts, then releases again, plainly, which hands
        over at once. Handing over first would have the next holder's restore race the old
        holder's eviction, and the driver page on demand between the two.

        ``evicting`` (feature ``memory``): the holder's compute is quiesced and its memory is on
        its way out; the hold ends now and its resident bytes count until its reports and
        ``evicted`` bring them down, so the way out and the next holder's way in overlap.
        """
        actions = self._turns.release(self._state.client(client_id), now, evict_first, evicting)
        return self._tiers_due(actions, now) if self._tiers.clients else actions

    def report_working_set(self, now: float, client_id: str, nbytes: int,
                           figures: MemoryFigures | None = None, *,
                           evictable: int | None = None) -> list[Action]:
        """The client's working set (``evictable``: how much of it could leave the GPU); with
        the ``memory`` feature also where its memory is now (``figures``: progress of an
        eviction, or the end of a restore: ``host`` 0)."""
        said = figures or NOTHING_SAID
        client = self._state.client(client_id)
        if client.tiering is not None:  # before a restore's end is judged: disk counts too
            self._tiers.report(client, said.disk, said.pinned, said.host, now)
        actions = self._turns.report_working_set(client, nbytes, evictable, now, said.resident,
                                                 said.host, said.shadow)
        return self._tiers_due(actions, now)

    # -- resident memory (residency.py) ---------------------------------------------------

    def evicted(self, now: float, client_id: str, figures: MemoryFigures | None = None, *,
                failed: str | None = None, seconds: float | None = None,
                moved: int | None = None) -> list[Action]:
        """An eviction ended, its memory where ``figures`` say (``failed``: it could not; it is
        checkpointed where the daemon reaches it, else not asked again until its next grant);
        ``Evicted`` says what it moved (``moved`` bytes in ``seconds``, as the client says)."""
        client = self._state.client(client_id)
        said = figures or NOTHING_SAID
        if client.tiering is not None:
            self._tiers.report(client, said.disk, None, said.host)
        actions = self._residency.evicted(client, said.resident, said.host, failed, now,
                                          said.shadow, seconds, moved)
        actions.extend(self._turns.schedule(self._state.gpus[client.gpu], now))
        return self._tiers_due(actions, now)

    # -- memory tiers (tiers.py) ----------------------------------------------------------

    def track_tiers(self, client_id: str, disk: int | None = None) -> list[Action]:
        """The client speaks the ``tiers`` feature (with ``memory``; ``disk``: bytes in its
        spill files already): its pin budget and spills are planned from now on."""
        self._tiers.track(self._state.client(client_id), disk)
        return self._tiers.plan_pins()

    def tier_moved(self, now: float, client_id: str, tier: str, host: int | None = None,
                   disk: int | None = None, *, moved: int | None = None,
                   seconds: float | None = None, failed: str | None = None) -> list[Action]:
        """A move between host memory and disk ended (``failed``: it could not)."""
        client = self._state.client(client_id)
        actions = self._tiers.moved(client, tier, host, disk, moved, seconds, failed, now)
        gpu = self._state.gpus[client.gpu]
        gpu.ledger.book(client)
        self._tiers_due(actions, now)
        # Host room a grant's evictions waited for may be there now, on any GPU.
        return [*actions, *self._turns.schedule_all(now)]

    def tier_figures(self, client_id: str, disk: int | None, pinned: int | None,
                     now: float | None = None) -> None:
        """A report's ``disk`` and ``pinned``: the progress of a move, recorded (the status
        shows it; the next pass plans with it)."""
        self._tiers.report(self._state.client(client_id), disk, pinned, now=now)

    def intent(self, now: float, client_id: str, reason: str) -> list[Action]:
        """A hint that the client is about to work (``reason``: execute, front)."""
        return self._tiers.intent(self._state.client(client_id), reason, now)

    def host_memory_read(self, now: float, free: int | None) -> list[Action]:
        """The shell read the host's memory: ``free`` is MemAvailable less the margin (None:
        unreadable; negative: the host is short of its margin). The measured budget is Kiwi's
        own counted host use, which MemAvailable no longer counts, plus ``free``: the clients'
        own growth does not shrink it, the host's other tenants' does (a configured
        ``host_budget`` stays as configured). What the new budget changes is decided at once:
        spills, pin budgets, waiting evictions."""
        state = self._state
        state.host_read_at = now
        state.measured_host_budget = None if free is None \
            else max(0, host_used(state) + free)
        state.read_config()
        return self.tick(now)

    def host_budget_stale(self, now: float) -> bool:
        """The budget planned with is the measured one, some client speaks ``tiers``, and
        the last read is older than ``HOST_READ_FRESH``: read again before deciding."""
        state = self._state
        return bool(self._tiers.clients) and state.config.host_budget is None and (
            state.host_read_at is None or now - state.host_read_at >= HOST_READ_FRESH)

    @property
    def host_budget(self) -> int | None:
        """Host memory the node's clients may take (the status's ``host_budget``)."""
        return self._state.host_budget

    @property
    def plans_host(self) -> bool:
        """Some client speaks ``tiers``: the host budget is planned with."""
        return bool(self._tiers.clients)

    def _tiers_due(self, actions: list[Action], now: float) -> list[Action]:
        if self._tiers.clients:
            actions.extend(self._tiers.due(now))
        return actions

    def checkpointed(self, now: float, client_id: str, error: str | None = None,
                     memory_free: bool = False) -> list[Action]:
        """The checkpoint evictor finished a ``Suspend`` (``error``: it failed;
        ``memory_free``: the process holds no GPU memory, so none is counted for it)."""
        client = self._state.clients.get(client_id)
        if client is None or not client.memory:
            return []
        actions = self._residency.checkpointed(client, error, now, memory_free)
        return [*actions, *self._turns.schedule(self._state.gpus[client.gpu], now)]

    def memory_seen(self, now: float, used: Mapping[str, int | None]) -> list[Action]:
        """NVML's per-process used memory, by client id, where the daemon reads it (None: NVML
        does not vouch for the client's process, and its claims stand)."""
        touched: set[int] = set()
        for client_id, nbytes in used.items():
            client = self._state.clients.get(client_id)
            if client is not None and client.memory and client.nvml_bytes != nbytes:
                self._residency.nvml_seen(client, nbytes)
                touched.add(client.gpu)
        actions: list[Action] = []
        for index in sorted(touched):
            actions.extend(self._turns.schedule(self._state.gpus[index], now))
        return actions

    def tick(self, now: float) -> list[Action]:
        """Time has passed: end quanta, revoke holders past their grace, spill."""
        actions = self._tiers.stalled(now) if self._tiers.clients else []
        actions.extend(self._turns.schedule_all(now))  # after: a move given up counts no more
        return self._tiers_due(actions, now)

    # -- the admin's controls (controls.py) -----------------------------------------------

    def set_mode(self, now: float, mode: str) -> list[Action]:
        return self._controls.set_mode(now, mode)

    def set_tq(self, now: float, seconds: float, gpu: int | None = None) -> list[Action]:
        """A new TQ applies to running quanta too, measured from their start."""
        return self._controls.set_tq(now, seconds, gpu)

    def reconfigure(self, config: SchedulerConfig, now: float) -> list[Action]:
        """Apply a reloaded config (SIGHUP) without dropping anyone."""
        return self._tiers_due(self._controls.reconfigure(config, now), now)

    # -- questions between events (queries.py) --------------------------------------------

    def next_deadline(self, now: float) -> float | None:
        """When ``tick`` must next be called, or None if nothing is due until the next event."""
        deadline = self._queries.next_deadline(now)
        if not self._tiers.clients:
            return deadline
        spill = self._tiers.deadline(now)
        return spill if deadline is None or (spill is not None and spill < deadline) \
            else deadline

    def queue(self, gpu_index: int, now: float) -> list[ClientRecord]:
        """Waiters in the order they are expected to be granted, next first."""
        return self._queries.queue(gpu_index, now)

    def queue_position(self, client_id: str, now: float) -> int | None:
        """A waiter's 1-based place in ``queue``, without building the queue."""
        return self._queries.queue_position(client_id, now)

    def shares(self, gpu_index: int, now: float) -> dict[str, float]:
        return self._state.shares(gpu_index, now)

    def quantum_remaining(self, gpu_index: int, now: float) -> float | None:
        return self._queries.quantum_remaining(gpu_index, now)

    def gpu_seconds(self, client: ClientRecord, now: float) -> float:
        return self._queries.gpu_seconds(client, now)

    def pool_gpu_seconds(self, gpu_index: int, now: float) -> dict[str, float]:
        """GPU seconds each pool has held ``gpu_index`` for since start, open holds included."""
        return self._queries.pool_gpu_seconds(gpu_index, now)

    def turn_length(self) -> float:
        """Seconds of a turn where holders take turns now; 0 where they do not."""
        return self._taking.turn_length()

    # -- for the tests: a rule's parts, asked directly ------------------------------------

    def _drop(self, gpu: GpuState, holder: ClientRecord, reason: str, now: float,
              incoming: ClientRecord | None, evict: bool | None = None) -> list[Action]:
        return self._turns.drop(gpu, holder, reason, now, incoming, evict)

    def _compute_deadline(self, now: float) -> tuple[float | None, bool]:
        return self._queries.compute_deadline(now)
