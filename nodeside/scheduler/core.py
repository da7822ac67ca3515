"""The scheduler's rules, sans I/O: events and the current time in, actions out.

One ``Scheduler`` arbitrates every GPU of a node. The asyncio shell (nodeside.daemon) calls a
method for each thing that happens (a client registers, asks for its GPU, gives it back, goes
away; an admin changes the mode or the TQ; time passes) and carries out the actions returned:
grant, ask to drop, revoke. There are no sockets, clocks or threads here, so every rule can be
tested to the millisecond with a fake clock.

The rules, per GPU:

* mode ``off``: every request is granted at once;
* mode ``on``: one holder at a time, for a time quantum (TQ). When the quantum ends and someone
  eligible waits, the holder is asked to drop the GPU; a holder that still wants it asks again and
  joins the tail. When nobody waits it keeps the GPU for another quantum and hears nothing;
* mode ``auto``: holders run side by side while their working sets fit in the GPU's memory; a
  request that does not fit waits, and contenders are served by quanta as in mode ``on``.

The code is laid out by role: this file makes the scheduler and takes a client's requests and
the passing of time; ``membership`` takes clients joining and leaving, ``controls`` the admin's
mode and TQ; ``turns`` says what follows on a GPU (grants, quanta, preemption, revocation) and
``moves`` makes each change of a hold it decides; ``choosing`` picks the next holder (the policy
seam: pools by entitlement, then priority, then request order); ``room`` answers mode auto's
memory questions; ``queries`` answers the shell and the status (deadlines, queue, positions,
shares); ``state`` and ``queue`` hold the clients, the waiters and the hold state's transition
table.

A holder that must leave (a drop) is told whether the next holder needs its room (``evict``).
One that leaves of its own accord can ask first (``release(..., evict_first=True)``): when the
room is needed it is kept as a drop until it has moved its memory out, so the GPU never has two
working sets paging through it at once.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from nodeside import protocol as p
from nodeside.config import SchedulerConfig
from nodeside.model import Pool
from nodeside.scheduler.actions import (
    Action,
    Drop,
    Grant,
    Pause,
    Released,
    Resume,
    Revoke,
    SchedulerError,
)
from nodeside.scheduler.controls import Controls
from nodeside.scheduler.policies import POLICIES
from nodeside.scheduler.pools import preemption_off_reason
from nodeside.scheduler.state import (
    PRIORITY_RANK,
    Client,
    GpuSpec,
    GpuState,
    Hold,
    HoldState,
    IllegalTransition,
)

# The actions and the state types are part of this module's interface: the daemon and the tests
# import them from here, the one place that says what the scheduler does.
__all__ = ["PRIORITY_RANK", "Action", "Client", "Drop", "GpuSpec", "GpuState", "Grant", "Hold",
           "HoldState", "IllegalTransition", "Pause", "Released", "Resume", "Revoke",
           "Scheduler", "SchedulerError"]

class Scheduler(Controls):
    """Every GPU of one node: its clients, pools, policy and clock-free rules. Each role is a
    base class of its own module (``Moves`` <- ``Turns`` <- ``Queries`` <- ``Membership`` <-
    ``Controls``), so the one object the shell holds answers every event."""

    def __init__(self, config: SchedulerConfig, gpus: Iterable[GpuSpec], now: float) -> None:
        self.config = config
        self._read_config()
        self._pools: dict[str, Pool] = {}
        self.mode = config.mode
        self.tq = config.tq
        self.gpus = {}
        for spec in gpus:
            self.gpus[spec.index] = GpuState(spec, config.gpu_tq.get(spec.index), now)
        self._resize_windows()
        if not self.gpus:
            raise ValueError("a scheduler needs at least one GPU")
        self.clients = {}
        #: Registered clients by pool name. A pool the config does not name exists while it has
        #: clients: when its last one leaves, what the scheduler keeps by its name goes too, so
        #: peers registering under ever new names cannot grow the daemon.
        self._pool_members: dict[str, int] = {}
        self._ids = itertools.count(1)
        self._order = itertools.count(1)
        self.choice = POLICIES[config.policy](self)
        # Counters for metrics; the shell reads them.
        self.counts = {"grants": 0, "drops": 0, "preemptions": 0, "revocations": 0,
                       "steps_aside": 0, "turns": 0}
        #: Events seen; the cached next deadline is good until this moves.
        self._events = 0
        self._deadline_cache: tuple[object, float | None] | None = None

    # -- configuration --------------------------------------------------------------------

    @property
    def preemption_off_reason(self) -> str | None:
        """Why preemption is off (for the start-up log, status and ``kiwictl pools``)."""
        return preemption_off_reason(self.config.pools)

    def reconfigure(self, config: SchedulerConfig, now: float) -> list[Action]:
        """Apply a reloaded config (SIGHUP) without dropping anyone."""
        self.config = config
        self._read_config()
        self._pools = {}
        if config.policy != self.choice.name:
            self.choice = POLICIES[config.policy](self)
        for gpu in self.gpus.values():
            gpu.tq_override = config.gpu_tq.get(gpu.spec.index)
        self._resize_windows()
        return self._schedule_all(now)

    # -- a client's requests, and time passing --------------------------------------------

    def acquire(self, now: float, client_id: str) -> list[Action]:
        client = self._client(client_id)
        if client.hold_state is not HoldState.IDLE:
            # Asking again while holding is answered with the grant; while waiting, nothing.
            return [Grant(client.id, client.gpu, self._quantum(client.gpu))] \
                if client.state == "holding" else []
        gpu = self.gpus[client.gpu]
        if not gpu.waiters:
            self._renew_lone_quanta(gpu, now)
        client.move(HoldState.WAITING)
        client.request_order = next(self._order)
        client.requested_at = now
        gpu.waiters.add(client)
        return self._schedule(gpu, now)

    def release(self, now: float, client_id: str, *, evict_first: bool = False) -> list[Action]:
        """Give the GPU back, or cancel a wait. Only ever the caller's own hold.

        ``evict_first``: the holder is leaving of its own accord (a cell ended, an idle spell)
        and can move its memory to host before the next holder starts. When the next holder
        needs that room, the GPU is not handed over yet: the hold becomes a drop (reason
        ``release``, evict, the usual grace and revocation) and the answer is that ``Drop``
        instead of ``Released``; the holder evicts, then releases again, plainly, which hands
        over at once. Handing over first would have the next holder's restore race the old
        holder's eviction, and the driver page on demand between the two.
        """
        client = self._client(client_id)
        gpu = self.gpus[client.gpu]
        if client.hold_state is HoldState.WAITING:
            gpu.waiters.remove(client)
            client.move(HoldState.IDLE)
            client.requested_at = None
            return [Released(client.id, evict=False), *self._schedule(gpu, now)]
        if client.hold_state is HoldState.IDLE:
            return [Released(client.id, evict=False)]
        hold = client.hold
        assert hold is not None
        if client.hold_state is HoldState.DROPPING:
            evict = hold.drop_evict
            if evict_first and evict:
                # Already asked to leave (the drop crossed this release on the wire): the drain
                # goes on under that drop, and its grace is not extended.
                left = max(0.0, (hold.drop_sent_at or now) + self.config.grace - now)
                assert hold.drop_reason is not None
                return [Drop(client.id, gpu.spec.index, hold.drop_reason, True, left)]
        else:
            incoming = self.choice.pick(gpu, now)
            evict = self._evict_on_leave(gpu, client, now, incoming)
            if evict_first and evict:
                return [*self._drop(gpu, client, p.REASON_RELEASE, now, incoming, evict=True),
                        *self._schedule(gpu, now)]
        self._end_hold(client, now)
        return [Released(client.id, evict=evict), *self._schedule(gpu, now)]

    def report_working_set(self, now: float, client_id: str, nbytes: int,
                           evictable: int | None = None) -> list[Action]:
        if nbytes < 0:
            raise SchedulerError(p.E_INVALID, "working set must not be negative")
        client = self._client(client_id)
        client.working_set = nbytes
        client.evictable = evictable
        gpu = self.gpus[client.gpu]
        return [*self._relieve_overcommit(gpu, client, now), *self._schedule(gpu, now)]

    def tick(self, now: float) -> list[Action]:
        """Time has passed: end quanta, revoke holders past their grace."""
        return self._schedule_all(now)
