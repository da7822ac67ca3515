"""Hypothesis explores the core with clients that speak the ``memory`` feature.

Random clients (working sets, priorities, reachable by the checkpoint evictor or not) on one GPU
with room for some of them ask, give back (plainly or ``evicting``), answer an ``evict`` in
part, in full or not at all, while time passes. Whatever the order:

* never a grant while the bytes counted on the GPU plus the incoming working set exceed the
  capacity (a client that could not evict and nobody checkpointed counts nothing: only its claim
  says it holds anything);
* an idle client is asked to evict only when the room is missing, and only as much as needed;
* every eviction asked is acknowledged, checkpointed or reported (after the timeout without
  progress nobody is left on its way out);
* nobody starves: once every client gives back and answers, every waiter is granted or refused;
* a waiter for room never blocks the queue: a plain client (no ``memory`` feature, working set
  unknown) that waits while nobody holds the GPU is granted at once (issue 40, N4b);
* after every step the GPU's ledger books what a recomputation from the clients gives: each
  idle client's counted bytes, those on their way out, and their totals.
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from nodeside.config import SchedulerConfig
from nodeside.model import EVICTING, MemoryFigures, Registration
from nodeside.scheduler.core import Evict, GpuSpec, Grant, Refuse, Scheduler, Suspend
from nodeside.scheduler.residency import counted, holding, need, occupies

GiB = 1 << 30
CAPACITY = 10 * GiB
TIMEOUT = 5.0

clients = st.lists(st.tuples(st.sampled_from([2, 3, 4, 6, 8]),
                             st.sampled_from(["LOW", "NORMAL", "HIGH"]),
                             st.booleans(),   # the checkpoint evictor reaches it
                             st.booleans()),  # its checkpoint succeeds
                   min_size=2, max_size=4)
steps = st.lists(st.tuples(st.sampled_from(["acquire", "release", "evicting", "answer",
                                            "half", "nvml", "wait"]),
                           st.integers(0, 3), st.floats(0.1, 4.0)),
                 max_size=40)


class Driver:
    def __init__(self, specs: list[tuple[int, str, bool, bool]]) -> None:
        config = SchedulerConfig(tq=30.0, mode="on", memory_reserve=0, evict_timeout=TIMEOUT,
                                 checkpoint_after=0)
        self.s = Scheduler(config, [GpuSpec(0, memory_total=CAPACITY)], now=0.0)
        self.ids: list[str] = []
        self.checkpoint_works: dict[str, bool] = {}
        for i, (gib, priority, reachable, works) in enumerate(specs):
            c = self.s.register(0.0, Registration(name=f"c{i}", working_set=gib * GiB,
                                                  priority=priority,
                                                  evict="vmm"))
            self.s.track_memory(c.id, MemoryFigures(resident=0, host=0), checkpointable=reachable)
            self.ids.append(c.id)
            self.checkpoint_works[c.id] = works
        #: A client that needs no room the scheduler can count: it never waits for evictions.
        self.plain = self.s.register(0.0, Registration(name="plain")).id
        self.ids.append(self.plain)
        self.now = 0.0
        self.asked: set[str] = set()
        self.refused: set[str] = set()

    def resident_total(self) -> int:
        gpu = self.s.gpus[0]
        return sum(need(c) if holding(c) else counted(c) for c in gpu.memory_clients.values())

    def take(self, actions: list) -> None:
        """Check what the core said, and answer as the clients and the daemon would."""
        evicts = [a for a in actions if isinstance(a, Evict)]
        if evicts:
            waiter = next(c for c in self.s.clients.values()
                          if c.display_name == evicts[0].for_name)
            # Only as much as is missing: without the last one asked, the room would be short.
            asked = sum(a.nbytes for a in evicts)
            assert asked - evicts[-1].nbytes < self.s.gpus[0].ledger.shortfall(waiter)
        for action in actions:
            if isinstance(action, Grant):
                client = self.s.clients[action.client]
                assert self.resident_total() <= CAPACITY, "granted past the capacity"
                if not client.memory:
                    continue
                # The newcomer moves in: its working set is resident now.
                moved_in = MemoryFigures(resident=client.working_set, host=0)
                self.take(self.s.report_working_set(self.now, client.id, client.working_set,
                                                    moved_in))
            elif isinstance(action, Evict):
                self.asked.add(action.client)
                waiter = next(c for c in self.s.clients.values()
                              if c.display_name == action.for_name)
                assert waiter.state == "waiting"
                assert self.s.gpus[0].ledger.shortfall(waiter) > 0, \
                    "an idle client was asked to evict while the room was there"
            elif isinstance(action, Suspend):
                self.asked.add(action.client)
                works = self.checkpoint_works[action.client]
                self.take(self.s.checkpointed(self.now, action.client,
                                              None if works else "lock timed out"))
            elif isinstance(action, Refuse):
                self.refused.add(action.client)
                assert self.s.clients[action.client].state == "idle"

    def check_ledger(self) -> None:
        """The ledger's books, recomputed from the clients."""
        gpu = self.s.gpus[0]
        idle = {c.id: 0 if holding(c) else counted(c) for c in gpu.memory_clients.values()}
        out = {c.id: idle[c.id] if c.residency == EVICTING and c.evict_failed is None else 0
               for c in gpu.memory_clients.values()}
        ledger = gpu.ledger
        assert (ledger.idle, ledger.outgoing) == (idle, out)
        assert (ledger.idle_total, ledger.outgoing_total) == (sum(idle.values()),
                                                              sum(out.values()))

    def blocked_behind_room(self) -> bool:
        gpu = self.s.gpus[0]
        return not gpu.holders and self.s.clients[self.plain].state == "waiting"

    def step(self, op: str, index: int, dt: float) -> None:
        self.now += dt
        c = self.ids[index % len(self.ids)]
        client = self.s.clients[c]
        if op == "acquire" and client.state == "idle":
            self.take(self.s.acquire(self.now, c))
        elif op == "release" and client.state == "holding":
            self.take(self.s.release(self.now, c))
        elif op == "evicting" and client.state == "holding":
            self.take(self.s.release(self.now, c, evicting=True))
        elif op in ("answer", "half") and client.residency == EVICTING and client.state == "idle":
            moved = occupies(client)
            if op == "half":
                half = MemoryFigures(resident=moved // 2,
                                     host=client.host_bytes + moved - moved // 2)
                self.take(self.s.report_working_set(self.now, c, client.working_set or 0, half))
            else:
                out = MemoryFigures(resident=0, host=client.host_bytes + moved)
                self.take(self.s.evicted(self.now, c, out))
        elif op == "nvml" and client.memory:
            # NVML starts or stops vouching for its process (dt picks which figure).
            figure = None if dt < 1.0 else occupies(client) if dt < 3.0 else 0
            self.take(self.s.memory_seen(self.now, {c: figure}))
        else:
            self.take(self.s.tick(self.now))
        self.check_ledger()


@settings(max_examples=300, deadline=None)
@given(clients, steps)
# Three idle residents (2, 3 and 4 GiB) and a newcomer of 6: two of them make the room.
@example([(2, "NORMAL", False, False), (3, "NORMAL", False, False), (4, "NORMAL", False, False),
          (6, "NORMAL", True, True)],
         [("acquire", 0, 1.0), ("release", 0, 1.0), ("acquire", 1, 1.0), ("release", 1, 1.0),
          ("acquire", 2, 1.0), ("release", 2, 1.0), ("acquire", 3, 1.0), ("half", 0, 1.0),
          ("answer", 1, 1.0)])
# A waiter for room (the second) and a plain client behind it (index 2) while nobody holds.
@example([(6, "NORMAL", False, False), (6, "NORMAL", False, False)],
         [("acquire", 0, 1.0), ("release", 0, 1.0), ("acquire", 1, 1.0), ("acquire", 2, 1.0)])
def test_the_rules_hold_whatever_the_clients_do(specs, ops) -> None:
    d = Driver(specs)
    for op, index, dt in ops:
        d.step(op, index, dt)
        assert not d.blocked_behind_room(), "a plain client waits behind a wait for room"
    # Nobody answers any more: past the timeout, no eviction asked before it is still open
    # (each was acknowledged, checkpointed or reported; the tick may ask others).
    d.now += TIMEOUT + 1
    d.take(d.s.tick(d.now))
    assert [c.id for c in d.s.clients.values() if c.residency == EVICTING
            and c.eviction.progress_at is not None
            and c.eviction.progress_at + TIMEOUT <= d.now] == []
    # Now everyone cooperates: holders give back, evictions are answered, time passes.
    for _ in range(4 * len(d.ids) + 4):
        d.now += 1.0
        for c in d.ids:
            client = d.s.clients[c]
            if client.state == "holding":
                d.take(d.s.release(d.now, c))
            elif client.residency == EVICTING:
                out = MemoryFigures(resident=0, host=client.host_bytes + occupies(client))
                d.take(d.s.evicted(d.now, c, out))
        d.take(d.s.tick(d.now))
    assert [c.id for c in d.s.clients.values() if c.state == "waiting"] == []
