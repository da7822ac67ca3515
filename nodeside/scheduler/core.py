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

Who goes next is the pools' business (see ``pools``): the contending pool furthest below its
entitlement, never a pool at its maximum; within a pool HIGH before NORMAL before LOW, then
request order. A non-preemptible request of a pool below its guarantee makes a LOW holder drop
at once; a LOW request never cuts a quantum short.

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
from nodeside.scheduler.actions import (
    Action,
    Drop,
    Grant,
    Released,
    Revoke,
    SchedulerError,
)
from nodeside.scheduler.interactive import Interactive, RoundRobin, make_policy
from nodeside.scheduler.pools import (
    Pool,
    entitlements,
    preemption_enabled,
    preemption_off_reason,
)
from nodeside.scheduler.state import PRIORITY_RANK, Client, GpuSpec, GpuState, Hold

# The actions and the state types are part of this module's interface: the daemon and the tests
# import them from here, the one place that says what the scheduler does.
__all__ = ["PRIORITY_RANK", "Action", "Client", "Drop", "GpuSpec", "GpuState", "Grant", "Hold",
           "Released", "Revoke", "Scheduler", "SchedulerError"]

_EPS = 1e-9
# A pool held back at its maximum is looked at again after this fraction of the share window.
_MAX_RECHECK = 0.005
# The request order of a holder competing as if it asked again: after every real request.
_TAIL_ORDER = 1 << 62


class Scheduler:
    def __init__(self, config: SchedulerConfig, gpus: Iterable[GpuSpec], now: float) -> None:
        self.config = config
        self._pools: dict[str, Pool] = {}
        self.mode = config.mode
        self.tq = config.tq
        self.gpus: dict[int, GpuState] = {}
        for spec in gpus:
            self.gpus[spec.index] = GpuState(spec, config.gpu_tq.get(spec.index), now)
        self._resize_windows()
        if not self.gpus:
            raise ValueError("a scheduler needs at least one GPU")
        self.clients: dict[str, Client] = {}
        self.policy: RoundRobin | Interactive = make_policy(
            config.policy, config.interactive, config.memory_reserve)
        self._ids = itertools.count(1)
        self._order = itertools.count(1)
        # Counters for metrics; the shell reads them.
        self.counts = {"grants": 0, "drops": 0, "preemptions": 0, "revocations": 0}

    # -- configuration --------------------------------------------------------------------

    def tq_for(self, gpu: int) -> float:
        override = self.gpus[gpu].tq_override
        return self.tq if override is None else override

    def pool(self, name: str) -> Pool:
        pool = self._pools.get(name)
        if pool is None:
            pool = self._pools[name] = self.config.pool(name)
        return pool

    @property
    def preemption(self) -> bool:
        return preemption_enabled(self.config.pools)

    @property
    def preemption_off_reason(self) -> str | None:
        """Why preemption is off (for the start-up log, status and ``kiwictl pools``)."""
        return preemption_off_reason(self.config.pools)

    def reconfigure(self, config: SchedulerConfig, now: float) -> list[Action]:
        """Apply a reloaded config (SIGHUP) without dropping anyone."""
        self.config = config
        self._pools = {}
        if config.policy != self.policy.name:
            self.policy = make_policy(config.policy, config.interactive, config.memory_reserve)
        elif isinstance(self.policy, Interactive):  # keep what each client used
            self.policy.settings = config.interactive
            self.policy.memory_reserve = config.memory_reserve
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
                 working_set: int | None = None) -> Client:
        if gpu not in self.gpus:
            raise SchedulerError(p.E_INVALID, f"no GPU {gpu} on this node "
                                 f"(it has {', '.join(map(str, self.gpus))})")
        if priority not in PRIORITY_RANK:
            raise SchedulerError(p.E_INVALID, f"priority must be one of {', '.join(p.PRIORITIES)}")
        if not pool:
            raise SchedulerError(p.E_INVALID, "pool must be a non-empty name")
        client = Client(id=f"c{next(self._ids)}", name=name, gpu=gpu, pool=pool,
                        priority=priority, pid=pid, uid=uid, kind=kind,
                        labels=dict(labels or {}), working_set=working_set,
                        registered_at=now)
        self.clients[client.id] = client
        return client

    def unregister(self, now: float, client_id: str) -> list[Action]:
        """The client's connection is gone: free whatever it held or waited for, at once."""
        client = self.clients.pop(client_id, None)
        if client is None:
            return []
        gpu = self.gpus[client.gpu]
        gpu.waiters.remove(client)
        if client.id in gpu.holders:
            self._end_hold(client, now)
        self.policy.forget(client.id)
        return self._schedule(gpu, now)

    def acquire(self, now: float, client_id: str) -> list[Action]:
        client = self._client(client_id)
        if client.state != "idle":
            return [Grant(client.id, client.gpu, self._quantum(client.gpu))] \
                if client.state == "holding" else []
        gpu = self.gpus[client.gpu]
        client.state = "waiting"
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
        if client.state == "waiting":
            gpu.waiters.remove(client)
            client.state = "idle"
            client.requested_at = None
            return [Released(client.id, evict=False), *self._schedule(gpu, now)]
        if client.state != "holding":
            return [Released(client.id, evict=False)]
        hold = client.hold
        assert hold is not None
        if hold.drop_reason is not None:
            evict = hold.drop_evict
            if evict_first and evict:
                # Already asked to leave (the drop crossed this release on the wire): the drain
                # goes on under that drop, and its grace is not extended.
                left = max(0.0, (hold.drop_sent_at or now) + self.config.grace - now)
                return [Drop(client.id, gpu.spec.index, hold.drop_reason, True, left)]
        else:
            incoming = self._pick(gpu, now)
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
                    actions.extend(self._drop(gpu, holder, p.REASON_MODE, now, incoming=keeper))
        elif mode == "auto":
            for gpu in self.gpus.values():
                first = next(iter(gpu.holders.values()), None)
                actions.extend(self._relieve_overcommit(gpu, first, now, p.REASON_MODE))
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

    def next_deadline(self, now: float) -> float | None:
        """When ``tick`` must next be called, or None if nothing is due until the next event."""
        deadlines: list[float] = []
        for gpu in self.gpus.values():
            if self.mode == "off":
                continue
            for holder in gpu.holders.values():
                hold = holder.hold
                assert hold is not None
                if hold.drop_sent_at is not None:
                    deadlines.append(hold.drop_sent_at + self.config.grace)
                elif gpu.waiters or self._over_maximum(gpu, holder.pool, now):
                    deadlines.append(hold.quantum_start + self._quantum_length(gpu, holder, now))
                    if self.policy.cuts_quanta and gpu.waiters and self.mode == "on":
                        # Who may cut this quantum short changes as GPU time is used, with no
                        # event to say so: look again after a first quantum.
                        deadlines.append(now + self.config.interactive.first_quantum)
            if not gpu.waiters:
                continue
            if any(self._over_maximum(gpu, pool, now) for pool in gpu.waiters.pools()):
                deadlines.append(now + max(gpu.meter.window * _MAX_RECHECK, 0.001))
            elif self._grantable(gpu, now):
                # Shares fall while the GPU idles: a pool held back at its maximum may have
                # become eligible since the last schedule with no event to say so. Asking for
                # a tick now (not at the recheck armed earlier, which a caller re-arming from
                # this answer would cancel) keeps that wake-up from being lost.
                deadlines.append(now)
        return min(deadlines) if deadlines else None

    def _grantable(self, gpu: GpuState, now: float) -> bool:
        """Would a schedule now grant someone? (mode on or auto)"""
        candidate = self._pick(gpu, now)
        if candidate is None:
            return False
        return not gpu.holders or (self.mode == "auto" and self._fits(gpu, [candidate]))

    # -- queries --------------------------------------------------------------------------

    def gpu_seconds(self, client: Client, now: float) -> float:
        held = now - client.hold.granted_at if client.hold else 0.0
        return client.gpu_seconds + held

    def pool_gpu_seconds(self, gpu_index: int, now: float) -> dict[str, float]:
        """GPU seconds each pool has held ``gpu_index`` for since start, open holds included."""
        gpu = self.gpus[gpu_index]
        seconds = dict(gpu.pool_seconds)
        for holder in gpu.holders.values():
            seconds[holder.pool] = seconds.get(holder.pool, 0.0) + self.gpu_seconds(holder, now) \
                - holder.gpu_seconds
        return seconds

    def queue(self, gpu_index: int, now: float) -> list[Client]:
        """Waiters in the order they are expected to be granted, next first."""
        gpu = self.gpus[gpu_index]
        if not gpu.waiters:
            return []
        order = self._predicted_order(gpu, now)
        # A holder asked to drop for someone hands the GPU to that one: it is next.
        promised = [order.pop(order.index(c)) for h in gpu.holders.values()
                    if h.hold and (c := gpu.waiters.get(h.hold.drop_incoming or "")) in order]
        return promised + order

    def _predicted_order(self, gpu: GpuState, now: float) -> list[Client]:
        gpu_index = gpu.spec.index
        by_pool = {pool: self.policy.in_order(gpu, pool, now) for pool in gpu.waiters.pools()}
        if len(by_pool) == 1:
            return list(next(iter(by_pool.values())))
        # Several pools: replay the pool choice, charging each pick one quantum of its pool's
        # share, which is how the shares will move as the queue drains.
        shares = self.shares(gpu_index, now)
        contending = self._contending_pools(gpu)
        ent = entitlements(self.pool(name) for name in contending)
        step = self.tq_for(gpu_index) / max(gpu.meter.window, _EPS)
        order: list[Client] = []
        while by_pool:
            name = max(by_pool, key=lambda n: (ent.get(n, 0.0) - shares.get(n, 0.0),
                                                -by_pool[n][0].request_order))
            order.append(by_pool[name].pop(0))
            shares[name] = shares.get(name, 0.0) + step
            if not by_pool[name]:
                del by_pool[name]
        return order

    def queue_position(self, client_id: str, now: float) -> int | None:
        client = self.clients.get(client_id)
        if client is None or client.state != "waiting":
            return None
        ids = [c.id for c in self.queue(client.gpu, now)]
        return ids.index(client.id) + 1

    def shares(self, gpu_index: int, now: float) -> dict[str, float]:
        gpu = self.gpus[gpu_index]
        return gpu.meter.shares(now, self._contending_pools(gpu))

    def quantum_remaining(self, gpu_index: int, now: float) -> float | None:
        gpu = self.gpus[gpu_index]
        if self.mode == "off" or not gpu.holders:
            return None
        first = next(iter(gpu.holders.values()))
        assert first.hold is not None
        return max(0.0, first.hold.quantum_start + self.tq_for(gpu_index) - now)

    # -- the rules ------------------------------------------------------------------------

    def _schedule_all(self, now: float) -> list[Action]:
        actions: list[Action] = []
        for gpu in self.gpus.values():
            actions.extend(self._schedule(gpu, now))
        return actions

    def _schedule(self, gpu: GpuState, now: float) -> list[Action]:
        actions: list[Action] = self._revoke_overdue(gpu, now)
        if self.mode == "off":
            for waiter in list(gpu.waiters.values()):
                actions.append(self._grant(gpu, waiter, now))
            return actions
        # Grant while the GPU is free (mode on) or the next one fits (mode auto). Head-of-line:
        # the first waiter that does not fit stops the others, so a big request never starves
        # behind a stream of small ones.
        while gpu.waiters and not (gpu.holders and self.mode == "on"):
            candidate = self._keep_promise(gpu, now) or self._pick(gpu, now)
            if candidate is None or (gpu.holders and not self._fits(gpu, [candidate])):
                break
            actions.append(self._grant(gpu, candidate, now))
        actions.extend(self._preempt(gpu, now))
        actions.extend(self._end_quanta(gpu, now))
        return actions

    def _pick(self, gpu: GpuState, now: float, tail: Client | None = None) -> Client | None:
        """The next client to serve: pool furthest below entitlement, then priority, order.

        ``tail`` is a holder whose quantum ended, competing as if it had just asked again.
        """
        heads = self.policy.heads(gpu, now)
        if tail is not None:
            best = heads.get(tail.pool)
            if best is None or self.policy.before(tail, best, now):
                heads[tail.pool] = tail
        if len(heads) == 1:  # the common case, and the hot path: no shares to measure
            (name, only), = heads.items()
            return None if self._over_maximum(gpu, name, now) else only
        if not heads:
            return None
        shares = gpu.meter.shares(now, heads)
        heads = {name: c for name, c in heads.items()
                 if not self._over_maximum(gpu, name, now, shares)}
        if len(heads) <= 1:
            return next(iter(heads.values()), None)
        ent = entitlements(self.pool(name) for name in self._contending_pools(gpu))
        # Guarantees come first: a non-preemptible request of a pool below its guarantee goes
        # before any split by weight; then the policy weighs each pool's shortfall.
        return self.policy.choose(
            list(heads.values()), lambda c: self._below_guarantee(gpu, c, now),
            {name: ent.get(name, 0.0) - shares.get(name, 0.0) for name in heads}, now)

    def _preempt(self, gpu: GpuState, now: float) -> list[Action]:
        if self.mode == "off" or not self.preemption:
            return []
        victims = [h for h in gpu.holders.values() if h.preemptible and h.hold
                   and h.hold.drop_reason is None]
        if not victims:
            return []
        shares = gpu.meter.shares(now, [w.pool for w in gpu.waiters.values()])
        claimants = sorted((w for w in gpu.waiters.values()
                            if self._below_guarantee(gpu, w, now)
                            and not self._over_maximum(gpu, w.pool, now, shares)),
                           key=_within_pool)
        actions: list[Action] = []
        for claimant in claimants:
            # Holders already leaving count as gone: a claimant whose room is already being
            # made must not cost a second preemptible holder its quantum.
            leaving = [h for h in gpu.holders.values() if h.hold and h.hold.drop_reason]
            if self._room_after(gpu, claimant, leaving):
                continue
            chosen: list[Client] = []
            while victims and not self._room_after(gpu, claimant, [*leaving, *chosen]):
                chosen.append(victims.pop())  # the newest grant first: it has run the least
            if not self._room_after(gpu, claimant, [*leaving, *chosen]):
                break  # not even every preemptible holder together would make room
            for victim in chosen:
                self.counts["preemptions"] += 1
                actions.extend(self._drop(gpu, victim, p.REASON_PREEMPT, now, incoming=claimant))
        return actions

    def _room_after(self, gpu: GpuState, claimant: Client, leaving: list[Client]) -> bool:
        """Would ``claimant`` be granted once ``leaving`` are gone?"""
        staying = [h for h in gpu.holders.values() if h not in leaving]
        if self.mode == "on":
            return not staying
        return self._fits_together(gpu, [*staying, claimant])

    def _quantum_length(self, gpu: GpuState, holder: Client, now: float) -> float:
        """The TQ, or less where the policy cuts the quantum short for the next holder."""
        tq = self.tq_for(gpu.spec.index)
        if not self.policy.cuts_quanta or self.mode != "on" or not gpu.waiters:
            return tq
        winner = self._pick(gpu, now, _as_tail(holder, _TAIL_ORDER))
        if winner is None or winner.id == holder.id:
            return tq
        return self.policy.quantum(gpu, holder, winner, tq, now)

    def _end_quanta(self, gpu: GpuState, now: float) -> list[Action]:
        actions: list[Action] = []
        tq = self.tq_for(gpu.spec.index)
        for holder in list(gpu.holders.values()):
            hold = holder.hold
            assert hold is not None
            if hold.drop_reason is not None:
                continue
            length = tq if self.mode == "auto" else self._quantum_length(gpu, holder, now)
            if now < hold.quantum_start + length - _EPS:
                continue
            # The holder competes as if it asked again now, at the tail; if it would win
            # anyway it keeps the GPU and hears nothing.
            if self.mode == "auto":
                blocked = self._pick(gpu, now)
                leaving = [h for h in gpu.holders.values() if h.hold and h.hold.drop_reason]
                if blocked is None or self._room_after(gpu, blocked, leaving):
                    # Nobody is blocked, or those already leaving make the room: no need to
                    # end this holder's turn as well.
                    hold.quantum_start = now
                    continue
                actions.extend(self._drop(gpu, holder, p.REASON_ROOM, now, incoming=blocked))
                continue
            tail = _as_tail(holder, next(self._order))
            winner = self._pick(gpu, now, tail)
            if winner is None and self._over_maximum(gpu, holder.pool, now):
                actions.extend(self._drop(gpu, holder, p.REASON_MAXIMUM, now, incoming=None))
                continue
            if winner is None or winner is tail:
                if winner is tail:
                    self.policy.on_keep(gpu, holder, now)
                hold.quantum_start = now
                continue
            actions.extend(self._drop(gpu, holder, p.REASON_QUANTUM, now, incoming=winner))
        return actions

    def _relieve_overcommit(self, gpu: GpuState, keep: Client | None, now: float,
                            reason: str = p.REASON_ROOM) -> list[Action]:
        """Mode auto: the holders no longer fit together; ask some to leave until they do.

        It happens when a holder's working set grows (side by side was granted on the sizes
        reported then) and when the mode turns auto while several hold. Running on past the
        GPU's memory is the thrashing Kiwi exists to prevent. ``keep`` stays (the one in the
        middle of allocating, or the first holder); the others leave, longest-running first,
        until the rest fits, and must move their memory out, since the room is what is missing.
        """
        if self.mode != "auto" or keep is None or keep.state != "holding":
            return []
        actions: list[Action] = []
        for holder in list(gpu.holders.values()):
            staying = [h for h in gpu.holders.values() if h.hold and h.hold.drop_reason is None]
            if self._fits_together(gpu, staying):
                break
            if holder is keep or holder.hold is None or holder.hold.drop_reason is not None:
                continue
            actions.extend(self._drop(gpu, holder, reason, now, incoming=None, evict=True))
        return actions

    def _revoke_overdue(self, gpu: GpuState, now: float) -> list[Action]:
        actions: list[Action] = []
        for holder in list(gpu.holders.values()):
            hold = holder.hold
            assert hold is not None
            if hold.drop_sent_at is None or now < hold.drop_sent_at + self.config.grace - _EPS:
                continue
            self.counts["revocations"] += 1
            self._end_hold(holder, now)
            actions.append(Revoke(holder.id, gpu.spec.index, p.REASON_GRACE,
                                  ignored_for=now - hold.drop_sent_at))
        return actions

    # -- helpers --------------------------------------------------------------------------

    def _grant(self, gpu: GpuState, client: Client, now: float) -> Grant:
        gpu.waiters.remove(client)
        client.state = "holding"
        client.requested_at = None
        client.hold = Hold(granted_at=now, quantum_start=now)
        gpu.holders[client.id] = client
        gpu.meter.open(client.id, client.pool, now, client.preemptible)
        self.policy.on_grant(gpu, client, now)
        self.counts["grants"] += 1
        return Grant(client.id, gpu.spec.index, self._quantum(gpu.spec.index))

    def _drop(self, gpu: GpuState, holder: Client, reason: str, now: float,
              incoming: Client | None, evict: bool | None = None) -> list[Action]:
        hold = holder.hold
        if hold is None or hold.drop_reason is not None:
            return []
        hold.drop_reason = reason
        hold.drop_sent_at = now
        hold.drop_evict = self._evict_on_leave(gpu, holder, now, incoming) \
            if evict is None else evict
        hold.drop_incoming = incoming.id if incoming is not None else None
        self.counts["drops"] += 1
        return [Drop(holder.id, gpu.spec.index, reason, hold.drop_evict, self.config.grace)]

    def _keep_promise(self, gpu: GpuState, now: float) -> Client | None:
        promised, gpu.promised = gpu.promised, None
        client = gpu.waiters.get(promised) if promised is not None else None
        if client is None or self._over_maximum(gpu, client.pool, now):
            return None
        # A request owed its guarantee that arrived during the handoff still goes first.
        if not self._below_guarantee(gpu, client, now) and any(
                self._below_guarantee(gpu, head, now) for head in gpu.waiters.heads().values()):
            return None
        return client

    def _end_hold(self, client: Client, now: float) -> None:
        gpu = self.gpus[client.gpu]
        if client.hold is not None and client.hold.drop_incoming is not None:
            gpu.promised = client.hold.drop_incoming
        gpu.holders.pop(client.id, None)
        gpu.meter.close(client.id, now)
        if client.hold is not None:
            self.policy.on_hold_end(client, now)
            held = now - client.hold.granted_at
            client.gpu_seconds += held
            gpu.pool_seconds[client.pool] = gpu.pool_seconds.get(client.pool, 0.0) + held
        client.hold = None
        client.state = "idle"

    def _evict_on_leave(self, gpu: GpuState, leaving: Client, now: float,
                        incoming: Client | None = None) -> bool:
        """Must ``leaving`` move its memory out? Only when the next holder needs the room."""
        if incoming is None:
            incoming = self._pick(gpu, now)
        if incoming is None:
            return False
        staying = [h for h in gpu.holders.values() if h is not leaving and h is not incoming]
        return not self._fits_together(gpu, [*staying, incoming, leaving])

    def _fits(self, gpu: GpuState, newcomers: list[Client]) -> bool:
        return self._fits_together(gpu, [*gpu.holders.values(), *newcomers])

    def _fits_together(self, gpu: GpuState, clients: list[Client]) -> bool:
        capacity = gpu.spec.memory_total
        if capacity is None or any(c.working_set is None for c in clients):
            return len(clients) <= 1
        need = sum(c.working_set or 0 for c in clients)
        return need <= capacity - self.config.memory_reserve

    def _below_guarantee(self, gpu: GpuState, client: Client, now: float) -> bool:
        """Is ``client`` a non-preemptible request of a pool below its guarantee?

        As in KAI, the guarantee covers a pool's non-preemptible work: its LOW holds do not
        count towards it, so a pool running only preemptible work is still owed its guarantee.
        """
        if client.preemptible:
            return False
        used = gpu.meter.shares(now, [client.pool], non_preemptible=True)[client.pool]
        return used < self.pool(client.pool).guarantee - _EPS

    def _over_maximum(self, gpu: GpuState, pool: str, now: float,
                      shares: Mapping[str, float] | None = None) -> bool:
        cap = self.pool(pool).cap
        if cap >= 1.0:
            return False
        if shares is None or pool not in shares:
            shares = gpu.meter.shares(now, [pool])
        return shares.get(pool, 0.0) >= cap - _EPS

    def _contending_pools(self, gpu: GpuState) -> list[str]:
        names = {c.pool for c in gpu.holders.values()} | gpu.waiters.pools()
        return sorted(names)

    def _quantum(self, gpu: int) -> float | None:
        return None if self.mode == "off" else self.tq_for(gpu)

    def _client(self, client_id: str) -> Client:
        try:
            return self.clients[client_id]
        except KeyError:
            raise SchedulerError(p.E_STATE, f"no client {client_id}") from None


def _within_pool(client: Client) -> tuple[int, int]:
    return PRIORITY_RANK[client.priority], client.request_order


def _as_tail(holder: Client, order: int) -> Client:
    """A stand-in for ``holder`` asking again now: same pool and priority, at the tail."""
    return Client(id=holder.id, name=holder.name, gpu=holder.gpu, pool=holder.pool,
                  priority=holder.priority, working_set=holder.working_set,
                  request_order=order)
