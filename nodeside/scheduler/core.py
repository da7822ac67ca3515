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

The room is laid out by role: this file takes the events; ``turns`` says what follows on a GPU
(grants, quanta, preemption, revocation) and ``moves`` makes each change of a hold it decides;
``choosing`` picks the next holder (the policy seam: pools by entitlement, then priority, then
request order); ``room`` answers mode auto's memory questions; ``queries`` answers the shell and
the status (deadlines, queue, positions, shares); ``state`` and ``queue`` hold the clients, the
waiters and the hold state's transition table.

A holder that must leave (a drop) is told whether the next holder needs its room (``evict``).
One that leaves of its own accord can ask first (``release(..., evict_first=True)``): when the
room is needed it is kept as a drop until it has moved its memory out, so the GPU never has two
working sets paging through it at once.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping

from nodeside import protocol as p
from nodeside.config import SchedulerConfig
from nodeside.scheduler.access import judge
from nodeside.scheduler.actions import (
    Action,
    Drop,
    Grant,
    Released,
    Revoke,
    SchedulerError,
)
from nodeside.scheduler.policies import POLICIES
from nodeside.scheduler.pools import Pool, preemption_off_reason
from nodeside.scheduler.queries import Queries
from nodeside.scheduler.state import (
    EVICT_MODES,
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
           "HoldState", "IllegalTransition", "Released", "Revoke", "Scheduler",
           "SchedulerError"]

class Scheduler(Queries):
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
        self.counts = {"grants": 0, "drops": 0, "preemptions": 0, "revocations": 0}
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

    def _resize_windows(self) -> None:
        for index, gpu in self.gpus.items():
            gpu.meter.window = self.config.share_window(self.tq_for(index))

    # -- events ---------------------------------------------------------------------------

    def register(self, now: float, *, name: str, gpu: int = 0, pool: str = "default",
                 priority: str = "NORMAL", pid: int | None = None, uid: int | None = None,
                 kind: str = "client", labels: Mapping[str, str] | None = None,
                 working_set: int | None = None, gids: Iterable[int] = (),
                 display_name: str | None = None, user: str | None = None,
                 evict: str = "managed", gpu_uuid: str | None = None,
                 namespace: str | None = None) -> Client:
        """A new client. ``uid`` and ``gids`` are the peer's credentials, read by the shell from
        the socket, never from what the client says: the access policy judges the claimed pool
        and priority by them, and by ``namespace``, its pod's namespace as the shell verified
        it (None: not in a pod, or not verified). A downgraded claim leaves its reason in
        ``Client.warning``.
        """
        gpu = self._gpu_named(gpu, gpu_uuid)
        if priority not in PRIORITY_RANK:
            raise SchedulerError(p.E_INVALID, f"priority must be one of {', '.join(p.PRIORITIES)}")
        if not pool:
            raise SchedulerError(p.E_INVALID, "pool must be a non-empty name")
        if evict not in EVICT_MODES:
            raise SchedulerError(p.E_INVALID, f"evict must be one of {', '.join(EVICT_MODES)}")
        gids = tuple(gids)
        try:
            verdict = judge(self.config.access, uid=uid, gids=gids, pool=pool,
                            priority=priority, namespace=namespace)
        except PermissionError as exc:
            raise SchedulerError(p.E_PERMISSION, str(exc)) from None
        client = Client(id=f"c{next(self._ids)}", name=name, gpu=gpu, pool=verdict.pool,
                        priority=verdict.priority, pid=pid, uid=uid, gids=gids, kind=kind,
                        labels=dict(labels or {}), working_set=working_set,
                        registered_at=now, display_name=display_name or name, user=user,
                        evict=evict, warning=verdict.warning, namespace=namespace)
        self.clients[client.id] = client
        self._pool_members[client.pool] = self._pool_members.get(client.pool, 0) + 1
        return client

    def _gpu_named(self, gpu: int, uuid: str | None) -> int:
        """The GPU a client asked for: by UUID when it gave one and the node knows UUIDs."""
        known = {g.spec.uuid: index for index, g in self.gpus.items() if g.spec.uuid}
        if uuid and known:
            if uuid not in known:
                raise SchedulerError(p.E_INVALID, f"no GPU {uuid} on this node")
            return known[uuid]
        if gpu not in self.gpus:
            raise SchedulerError(p.E_INVALID, f"no GPU {gpu} on this node "
                                 f"(it has {', '.join(map(str, self.gpus))})")
        return gpu

    def unregister(self, now: float, client_id: str) -> list[Action]:
        """The client's connection is gone: free whatever it held or waited for, at once."""
        client = self.clients.pop(client_id, None)
        if client is None:
            return []
        gpu = self.gpus[client.gpu]
        if client.hold_state is HoldState.WAITING:
            gpu.waiters.remove(client)
            client.move(HoldState.IDLE)
        elif client.hold_state is not HoldState.IDLE:
            self._end_hold(client, now)
        self.choice.forget(client.id)
        self._leave_pool(client.pool)
        return self._schedule(gpu, now)

    def _leave_pool(self, name: str) -> None:
        left = self._pool_members[name] - 1
        if left:
            self._pool_members[name] = left
            return
        del self._pool_members[name]
        if name in self.config.pools:
            return
        # An ad-hoc pool with no clients left: its GPU-seconds counter (metrics) and cached
        # Pool go. The share meter forgets it as its holds leave the window.
        self._pools.pop(name, None)
        for state in self.gpus.values():
            state.pool_seconds.pop(name, None)

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

    def set_mode(self, now: float, mode: str) -> list[Action]:
        if mode not in p.MODES:
            raise SchedulerError(p.E_INVALID, f"mode must be one of {', '.join(p.MODES)}")
        previous, self.mode = self.mode, mode
        actions: list[Action] = []
        if mode != "off" and previous == "off":
            # Running side by side ends now: every holder gets a fresh quantum measured from
            # the switch, so none is dropped the instant the scheduler comes on.
            for gpu in self.gpus.values():
                for holder in gpu.holders.values():
                    assert holder.hold is not None
                    holder.hold.quantum_start = now
        if mode == "on":
            for gpu in self.gpus.values():
                keeper, *others = gpu.holders.values() if gpu.holders else (None,)
                for holder in others:
                    if holder.hold_state is HoldState.HOLDING:
                        actions.extend(self._drop(gpu, holder, p.REASON_MODE, now,
                                                  incoming=keeper))
        elif mode == "auto":
            for gpu in self.gpus.values():
                first = next(iter(gpu.holders.values()), None)
                actions.extend(self._relieve_overcommit(gpu, first, now, p.REASON_MODE))
        else:
            for gpu in self.gpus.values():
                self._withdraw_drops(gpu)
        return actions + self._schedule_all(now)

    def set_tq(self, now: float, seconds: float, gpu: int | None = None) -> list[Action]:
        """A new TQ applies to running quanta too, measured from their start."""
        if not seconds > 0:
            raise SchedulerError(p.E_INVALID, "TQ must be a positive number of seconds")
        if gpu is None:
            self.tq = seconds
            for state in self.gpus.values():
                state.tq_override = None
        elif gpu in self.gpus:
            self.gpus[gpu].tq_override = seconds
        else:
            raise SchedulerError(p.E_INVALID, f"no GPU {gpu} on this node")
        self._resize_windows()
        return self._schedule_all(now)

    def tick(self, now: float) -> list[Action]:
        """Time has passed: end quanta, revoke holders past their grace."""
        return self._schedule_all(now)

    def _client(self, client_id: str) -> Client:
        try:
            return self.clients[client_id]
        except KeyError:
            raise SchedulerError(p.E_STATE, f"no client {client_id}") from None
