"""Invariants of mode on, checked by Hypothesis over random contention on the sans-I/O core.

The machine plays clients that ask, give back (plainly, or evicting first), die, ignore drop
requests, and an admin that flips the mode; time only moves through the scheduler's own
deadlines, as the daemon's timer moves it. After every step: at most one holder while on;
nothing granted to a dead client; and every waiter is served within (waiters ahead of it + 1)
quanta, each plus the grace period.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from nodeside.config import SchedulerConfig
from nodeside.model import Registration
from nodeside.scheduler.core import Drop, GpuSpec, Grant, HoldState, Revoke, Scheduler

TQ = 1.0
GRACE = 0.5


class RoundRobin(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.s = Scheduler(SchedulerConfig(tq=TQ, grace=GRACE), [GpuSpec(0)], now=0.0)
        self.alive: set[str] = set()
        self.dead: set[str] = set()
        self.stubborn: set[str] = set()  # ignore drop requests
        self.deadline_for: dict[str, float] = {}  # waiter -> latest time it may be granted
        self.pending_drops: list[str] = []

    # -- clients ------------------------------------------------------------------------

    @rule(stubborn=st.booleans())
    def register(self, stubborn: bool) -> None:
        client = self.s.register(self.now, Registration(name="x"))
        self.alive.add(client.id)
        if stubborn:
            self.stubborn.add(client.id)

    @precondition(lambda self: self.idle_clients())
    @rule(data=st.data())
    def acquire(self, data: st.DataObject) -> None:
        client = data.draw(st.sampled_from(sorted(self.idle_clients())))
        self.carry_out(self.s.acquire(self.now, client))
        if self.s.clients[client].state == "waiting" and self.s.mode == "on":
            ahead = self.s.queue_position(client, self.now) - 1
            self.deadline_for[client] = self.now + (ahead + 1) * (TQ + GRACE) + 1e-6

    @precondition(lambda self: self.holders())
    @rule(data=st.data(), again=st.booleans(), evict_first=st.booleans())
    def release(self, data: st.DataObject, again: bool, evict_first: bool) -> None:
        client = data.draw(st.sampled_from(sorted(self.holders())))
        actions = self.s.release(self.now, client, evict_first=evict_first)
        # A voluntary release that must evict first is answered with a drop: the client moves
        # its memory out, then releases plainly (a stubborn one never does, and is revoked).
        drain = [a for a in actions if isinstance(a, Drop) and a.client == client]
        self.carry_out([a for a in actions if a not in drain])
        if drain and client not in self.stubborn:
            self.carry_out(self.s.release(self.now, client))
        if again and self.s.clients[client].state == "idle":
            self.acquire_now(client)

    @precondition(lambda self: self.alive)
    @rule(data=st.data())
    def die(self, data: st.DataObject) -> None:
        client = data.draw(st.sampled_from(sorted(self.alive)))
        self.alive.discard(client)
        self.dead.add(client)
        self.deadline_for.pop(client, None)
        self.carry_out(self.s.unregister(self.now, client))

    @rule(dt=st.floats(min_value=0.0, max_value=3.0))
    def time_passes(self, dt: float) -> None:
        target = self.now + dt
        while True:
            deadline = self.s.next_deadline(self.now)
            if deadline is None or deadline > target:
                break
            self.now = max(self.now, deadline)
            self.carry_out(self.s.tick(self.now))
        self.now = target

    @rule(mode=st.sampled_from(["on", "off"]))
    def admin_sets_mode(self, mode: str) -> None:
        self.carry_out(self.s.set_mode(self.now, mode))
        if mode == "off":
            self.deadline_for.clear()
        else:
            for waiter in self.s.queue(0, self.now):
                ahead = self.s.queue_position(waiter.id, self.now) - 1
                # Everyone dropped by the switch may hold on for a grace period first.
                self.deadline_for[waiter.id] = self.now + GRACE + (ahead + 1) * (TQ + GRACE)

    # -- the clients' side of the actions ------------------------------------------------

    def carry_out(self, actions: list) -> None:
        for action in actions:
            if isinstance(action, Grant):
                assert action.client in self.alive, "granted to a dead client"
                self.deadline_for.pop(action.client, None)
            elif isinstance(action, Drop) and action.client not in self.stubborn:
                self.pending_drops.append(action.client)
            elif isinstance(action, Revoke):
                assert action.client in self.stubborn
        while self.pending_drops:
            client = self.pending_drops.pop()
            if client in self.alive and self.s.clients[client].state == "holding":
                self.carry_out(self.s.release(self.now, client))
                self.acquire_now(client)

    def acquire_now(self, client: str) -> None:
        self.carry_out(self.s.acquire(self.now, client))
        if self.s.clients[client].state == "waiting" and self.s.mode == "on":
            ahead = self.s.queue_position(client, self.now) - 1
            self.deadline_for[client] = self.now + (ahead + 1) * (TQ + GRACE) + 1e-6

    def idle_clients(self) -> set[str]:
        return {c for c in self.alive if self.s.clients[c].state == "idle"}

    def holders(self) -> set[str]:
        return {c for c in self.alive if self.s.clients[c].state == "holding"}

    # -- invariants ---------------------------------------------------------------------

    @invariant()
    def at_most_one_holder_when_on(self) -> None:
        if self.s.mode == "on":
            undropped = [c for c in self.s.gpus[0].holders.values()
                         if c.hold and c.hold.drop_reason is None]
            assert len(undropped) <= 1
            if not any(c.hold and c.hold.drop_reason == "mode"
                       for c in self.s.gpus[0].holders.values()):
                assert len(self.s.gpus[0].holders) <= 1

    @invariant()
    def hold_state_agrees_with_the_queues(self) -> None:
        gpu = self.s.gpus[0]
        for client in self.s.clients.values():
            state = client.hold_state
            assert (state is HoldState.WAITING) == (client.id in gpu.waiters)
            assert (state in (HoldState.HOLDING, HoldState.DROPPING)) == (client.id in gpu.holders)
            assert (state is HoldState.DROPPING) == (
                client.hold is not None and client.hold.drop_reason is not None)
            assert (client.hold is None) == (state in (HoldState.IDLE, HoldState.WAITING))

    @invariant()
    def nothing_belongs_to_the_dead(self) -> None:
        gpu = self.s.gpus[0]
        assert not (set(gpu.holders) | set(gpu.waiters)) & self.dead

    @invariant()
    def no_waiter_starves(self) -> None:
        for client, deadline in self.deadline_for.items():
            assert self.now <= deadline or self.s.clients[client].state != "waiting", (
                f"{client} still waits at {self.now:.3f}, past its bound {deadline:.3f}")


RoundRobin.TestCase.settings = settings(max_examples=150, stateful_step_count=60,
                                        deadline=None)
TestRoundRobinInvariants = RoundRobin.TestCase
