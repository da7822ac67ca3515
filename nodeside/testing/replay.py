"""``Replay``: the scheduler core driven in virtual time, by clients that behave as the protocol
says; the daemon's job, without sockets or clocks.

``Replay`` plays the part of the asyncio shell and of well-behaved clients at once. Each
``Worker`` has GPU work to do (a burst of so many GPU seconds); it asks for its GPU, works while
it holds it, gives it back when asked (after ``release_delay``, the time a real client takes to
move out) and asks again while work remains. Time jumps from event to event, so an hour of
contention replays in milliseconds, and every figure is exact. Tests of the scheduling rules
drive the core with it; the fleet simulator (``benchmarks/fleet``) replays notebook traces
through it.

Holders side by side (mode auto, or off) share the GPU's time when a ``co_run`` efficiency is
given: with k of them working, each does ``co_run / k`` seconds of work per second, as
compute-bound kernels of different processes do on a GPU that time-slices between them. Without
it each works at full speed, which flatters running side by side. A holder the scheduler paused
(``Pause``, mode auto taking turns) does no work until ``Resume``, and then starts after
``resume_cost`` seconds, the GPU switching to it.

With ``switching`` (a ``MemoryMoves``: the simulator's model of the host link, say) a grant
whose working set must be moved in (or others' moved out to make room) starts working only when
that is done: the seconds it takes are in the hold (the scheduler cannot tell them apart) but
are nobody's work, and each span says how many there were. A grant whose room the model says
cannot be made (``grant_cost`` answers None: host memory for the evictions is short, say) is
played as the daemon refuses such a waiter (error ``room``) and the shim answers it: the GPU goes
straight back, the worker asks again after 1 s, doubling to 16 s, and after ``room_timeout``
seconds of refusals its burst fails (the cell's GPU calls get ``CUDA_ERROR_OUT_OF_MEMORY``;
``Worker.failed``). The daemon would refuse the waiter without granting it; here the grant
lasts no time at all.

The spans it records, and what is measured from them, are ``SpanLog`` (spans.py).
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Protocol

from nodeside.model import Registration
from nodeside.scheduler.core import (
    Action,
    Drop,
    Grant,
    Pause,
    Released,
    Resume,
    Revoke,
    Scheduler,
)
from nodeside.testing.spans import Span, SpanLog

#: The shim's retries after a refusal for room: 1 s, doubling to 16 s (client/room.c), and
#: how long it goes on before the calls fail (``KIWI_ROOM_TIMEOUT``'s default).
ROOM_RETRY_FIRST = 1.0
ROOM_RETRY_MOST = 16.0
ROOM_TIMEOUT = 300.0

# A tick whose deadline does not move forward this many times in a row is a core bug (a rule
# that asks to be woken at a time it then does nothing about), not a slow simulation.
_STUCK_LIMIT = 10_000


class MemoryMoves(Protocol):
    """What moving working sets in and out of GPU memory costs, for ``Replay(switching=)``."""

    #: Bytes of one GPU's memory: the working set of a worker that gives none.
    capacity: int

    def grant_cost(self, gpu: int, client: str, working_set: int,
                   keep: Collection[str] = ()) -> float | None:
        """Seconds the GPU spends moving memory before ``client`` can work (``keep``: the
        holders beside it, whose memory stays); None: the room cannot be made (refused)."""

    def used(self, gpu: int, client: str) -> None:
        """``client``'s hold of ``gpu`` ended."""

    def forget(self, client: str) -> None:
        """``client`` has gone."""


@dataclass
class Worker:
    id: str
    name: str
    pool: str
    gpu: int
    #: Bytes of GPU memory the client's work needs (None: the whole GPU), for switching costs.
    working_set: int | None = None
    #: Follow drop requests (False: a client that ignores them, to be revoked).
    complies: bool = True
    #: Paused by the scheduler (holders taking turns): it holds, but does no work.
    paused: bool = False
    remaining: float = 0.0  # GPU seconds of the current burst still to do
    #: When its work in the current hold starts, or went on at ``rate`` (None: not holding).
    holding_since: float | None = None
    rate: float = 1.0  # GPU seconds of work done per second while working
    #: Seconds its work took beyond what it would have alone on the GPU, by sharing its time.
    shared: float = 0.0
    finish_token: int = 0
    #: Called with (worker, now) when a burst is done and the GPU given back.
    on_done: Callable[[Worker, float], None] | None = None
    waits: list[float] = field(default_factory=list)  # seconds from request to each grant
    requested_at: float | None = None
    bursts_done: int = 0
    #: Grants refused for room (``MemoryMoves.grant_cost`` None), and bursts given up on
    #: after ``Replay.room_timeout`` seconds of them.
    refusals: int = 0
    failed: int = 0
    refused_in_a_row: int = 0
    #: When the current burst was first refused (None: it was not, or was granted since).
    refused_since: float | None = None

    def left(self, now: float) -> float:
        """GPU seconds of the current burst still to do at ``now`` (its work in a hold starts
        at ``holding_since``, once its memory has come in)."""
        if self.holding_since is None or self.paused:
            return self.remaining
        return max(0.0, self.remaining - self.rate * max(0.0, now - self.holding_since))

    def settle(self, now: float) -> None:
        """Charge the work done in its hold up to ``now``: the hold goes on from ``now``."""
        assert self.holding_since is not None
        working = max(0.0, now - self.holding_since)
        self.remaining = self.left(now)
        self.shared += working if self.paused else (1.0 - self.rate) * working
        self.holding_since = max(self.holding_since, now)


class Replay(SpanLog):
    def __init__(self, scheduler: Scheduler, now: float = 0.0, *,
                 release_delay: float = 0.0, switching: MemoryMoves | None = None,
                 co_run: float | None = None, resume_cost: float = 0.0,
                 room_timeout: float = ROOM_TIMEOUT) -> None:
        if co_run is not None and not 0.0 < co_run <= 1.0:
            raise ValueError(f"co_run is a fraction of the GPU's work in (0, 1], not {co_run}")
        self.scheduler = scheduler
        self.now = now
        self.release_delay = release_delay
        self.switching = switching
        self.co_run = co_run
        self.resume_cost = resume_cost
        self.room_timeout = room_timeout
        self.workers: dict[str, Worker] = {}
        self.spans: list[Span] = []  # holds
        self.wait_spans: list[Span] = []  # from a request to its grant
        self.actions: list[tuple[float, Action]] = []
        #: Called after every batch of actions; tests hang invariant checks here.
        self.observers: list[Callable[[Replay, list[Action]], None]] = []
        self._open_spans: dict[str, Span] = {}
        self._open_waits: dict[str, Span] = {}
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()

    # -- setting the scene ----------------------------------------------------------------

    def add(self, name: str, *, pool: str = "default", priority: str = "NORMAL", gpu: int = 0,
            working_set: int | None = None, complies: bool = True,
            pausable: bool = False) -> Worker:
        client = self.scheduler.register(self.now, Registration(
            name=name, gpu=gpu, pool=pool, priority=priority, working_set=working_set,
            pausable=pausable))
        worker = Worker(client.id, name, pool, gpu, working_set=working_set, complies=complies)
        self.workers[client.id] = worker
        return worker

    def at(self, when: float, event: Callable[[], None]) -> None:
        heapq.heappush(self._events, (max(when, self.now), next(self._seq), event))

    def burst(self, worker: Worker, seconds: float, when: float | None = None) -> None:
        """``worker`` wants ``seconds`` of GPU work, from ``when`` (default now)."""
        def start() -> None:
            if worker.holding_since is None:
                worker.remaining += seconds
                if worker.requested_at is None:
                    self._request(worker)
                return
            worker.settle(self.now)
            worker.remaining += seconds
            self._share(worker.gpu)
            self._plan_finish(worker)
        self.at(self.now if when is None else when, start)

    def leave(self, worker: Worker, when: float | None = None) -> None:
        """The client's process dies: everything it held goes at once."""
        def gone() -> None:
            self._close_span(worker.id)
            self._close_span(worker.id, self._open_waits)
            self.workers.pop(worker.id, None)
            self._share(worker.gpu)
            if self.switching is not None:
                self.switching.forget(worker.id)
            self._apply(self.scheduler.unregister(self.now, worker.id))
        self.at(self.now if when is None else when, gone)

    def call(self, change: Callable[[float], list[Action]], when: float | None = None) -> None:
        """Run a core call (set_mode, set_tq, report_working_set ...) at ``when``."""
        self.at(self.now if when is None else when, lambda: self._apply(change(self.now)))

    # -- running --------------------------------------------------------------------------

    def run_until(self, end: float) -> None:
        stuck = 0
        while True:
            next_event = self._events[0][0] if self._events else math.inf
            deadline = self.scheduler.next_deadline(self.now)
            due = math.inf if deadline is None else max(deadline, self.now)
            when = min(next_event, due)
            if when > end:
                self.now = max(self.now, end)
                return
            stuck = stuck + 1 if when <= self.now else 0
            if stuck > _STUCK_LIMIT:
                raise RuntimeError(f"the scheduler's deadline does not advance at {self.now}")
            self.now = when
            if due <= next_event:
                self._apply(self.scheduler.tick(self.now))
            else:
                _, _, event = heapq.heappop(self._events)
                event()

    # -- the clients' side ----------------------------------------------------------------

    def _request(self, worker: Worker) -> None:
        worker.requested_at = self.now
        wait = Span(worker.id, worker.name, worker.pool, worker.gpu, self.now)
        self.wait_spans.append(wait)
        self._open_waits[worker.id] = wait
        self._apply(self.scheduler.acquire(self.now, worker.id))

    def _plan_finish(self, worker: Worker) -> None:
        worker.finish_token += 1
        token = worker.finish_token
        assert worker.holding_since is not None
        if worker.paused:
            return  # it finishes once it works again
        # holding_since is when work starts: after the memory moved, if it had to.
        done_at = max(self.now, worker.holding_since) + worker.remaining / worker.rate
        def finish() -> None:
            if worker.finish_token != token or worker.holding_since is None:
                return
            self._account(worker)
            worker.remaining = 0.0
            worker.bursts_done += 1
            self._apply(self.scheduler.release(self.now, worker.id))
            if worker.on_done is not None:
                worker.on_done(worker, self.now)
        self.at(done_at, finish)

    def _account(self, worker: Worker) -> None:
        """Charge the work done in the hold that ends now."""
        if worker.holding_since is not None:
            if self.switching is not None:  # its memory stays, the most recently used
                self.switching.used(worker.gpu, worker.id)
            worker.settle(self.now)
            worker.holding_since = None
            worker.paused = False
            self._end_pause(worker.id)
            self._share(worker.gpu)
        worker.finish_token += 1
        self._close_span(worker.id)

    def _begin_pause(self, client: str) -> None:
        held = self._open_spans.get(client)
        if held is not None:
            held.paused_since = self.now

    def _end_pause(self, client: str) -> None:
        held = self._open_spans.get(client)
        if held is not None and held.paused_since is not None:
            held.paused.append((held.paused_since, self.now))
            held.paused_since = None

    def _share(self, gpu: int) -> None:
        """The holders working on ``gpu`` now share its time: each goes on at its new rate
        (with ``co_run``; at full speed without)."""
        if self.co_run is None:
            return
        working = [w for w in self.workers.values() if w.gpu == gpu and w.remaining > 0
                   and not w.paused and w.holding_since is not None
                   and w.holding_since <= self.now]
        rate = 1.0 if len(working) <= 1 else self.co_run / len(working)
        for worker in working:
            if worker.rate != rate:
                worker.settle(self.now)
                worker.rate = rate
                self._plan_finish(worker)

    def _side_by_side(self, gpu: int) -> bool:
        """May a holder of ``gpu`` have others working beside it?"""
        return self.scheduler.mode != "on" or len(self.scheduler.gpus[gpu].holders) > 1

    def _give_back(self, worker: Worker) -> None:
        if worker.id not in self.workers or worker.holding_since is None:
            return
        self._account(worker)
        self._apply(self.scheduler.release(self.now, worker.id))
        if worker.remaining > 0:
            self._request(worker)
        elif worker.on_done is not None:
            worker.bursts_done += 1
            worker.on_done(worker, self.now)

    def _apply(self, actions: list[Action]) -> None:
        for action in actions:
            self.actions.append((self.now, action))
            worker = self.workers.get(action.client)
            if worker is None:
                continue
            if isinstance(action, Grant) and worker.holding_since is None:
                switching = self._switch_cost(worker, action.gpu)
                if switching is None:
                    self._refused(worker)
                    continue
                if worker.requested_at is not None:
                    worker.waits.append(self.now - worker.requested_at)
                worker.requested_at = None
                worker.refused_since, worker.refused_in_a_row = None, 0
                worker.holding_since = self.now + switching
                worker.rate = 1.0
                worker.paused = False
                self._close_span(worker.id, self._open_waits)
                span = Span(worker.id, worker.name, worker.pool, action.gpu, self.now,
                            switching=switching)
                self.spans.append(span)
                self._open_spans[worker.id] = span
                if self.co_run is not None and self._side_by_side(action.gpu):
                    # Its work starts once its memory is in: the others share from then on.
                    # (Never an event where nobody can be beside it: an extra event moves
                    # the core's look-agains, and the fleet's figures with them.)
                    self.at(worker.holding_since, functools.partial(self._share, action.gpu))
                self._plan_finish(worker)
            elif isinstance(action, Drop) and worker.complies:
                self.at(self.now + self.release_delay, functools.partial(self._give_back, worker))
            elif isinstance(action, Revoke):
                self._account(worker)
                if worker.remaining > 0:
                    self._request(worker)
            elif isinstance(action, Pause) and worker.holding_since is not None:
                self._begin_pause(worker.id)
                worker.settle(self.now)
                worker.paused = True
                worker.finish_token += 1  # its finish, planned while it worked, is off
                self._share(worker.gpu)
            elif isinstance(action, Resume) and worker.holding_since is not None:
                self._end_pause(worker.id)
                worker.settle(self.now)
                worker.paused = False
                # Its work goes on once the GPU has switched to it (and its memory is in).
                worker.holding_since = max(worker.holding_since, self.now + self.resume_cost)
                self._plan_finish(worker)
                self.at(worker.holding_since, functools.partial(self._share, worker.gpu))
            elif isinstance(action, Released):
                pass
        for observe in self.observers:
            observe(self, actions)

    def _refused(self, worker: Worker) -> None:
        """The room for ``worker``'s grant cannot be made: it gives the GPU back at once and
        asks again later, or its burst fails (the module's docstring)."""
        worker.refusals += 1
        worker.refused_in_a_row += 1
        since = worker.refused_since = (self.now if worker.refused_since is None
                                        else worker.refused_since)
        self._close_span(worker.id, self._open_waits)
        worker.requested_at = None
        self._apply(self.scheduler.release(self.now, worker.id))
        if self.now - since >= self.room_timeout:
            worker.refused_since, worker.refused_in_a_row = None, 0
            worker.remaining = 0.0
            worker.failed += 1
            if worker.on_done is not None:
                worker.on_done(worker, self.now)
            return
        delay = min(ROOM_RETRY_MOST, ROOM_RETRY_FIRST * 2 ** min(worker.refused_in_a_row - 1, 8))
        self.at(self.now + delay, functools.partial(self._ask_again, worker))

    def _ask_again(self, worker: Worker) -> None:
        if worker.id in self.workers and worker.holding_since is None \
                and worker.requested_at is None and worker.remaining > 0:
            self._request(worker)

    def _switch_cost(self, worker: Worker, gpu: int) -> float | None:
        if self.switching is None:
            return 0.0
        beside = [c for c in self.scheduler.gpus[gpu].holders if c != worker.id]
        need = worker.working_set if worker.working_set is not None else self.switching.capacity
        return self.switching.grant_cost(gpu, worker.id, need, keep=beside)
