"""Queue positions kept incrementally equal the positions in the queue rebuilt from scratch."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from nodeside.config import from_mapping
from nodeside.model import Registration
from nodeside.scheduler.core import ClientRecord, GpuSpec, Scheduler
from nodeside.scheduler.queue import WaitQueue

PRIORITIES = ["HIGH", "NORMAL", "LOW"]

steps = st.lists(st.tuples(st.booleans(), st.integers(0, 40), st.sampled_from(PRIORITIES),
                           st.sampled_from(["a", "b"])), max_size=120)


@given(steps)
def test_a_waiters_place_in_its_pool_equals_its_index_in_the_pools_order(ops) -> None:
    queue, inside = WaitQueue(), {}
    order = 0
    for arrive, n, priority, pool in ops:
        key = f"c{n}"
        if arrive and key not in inside:
            order += 1
            inside[key] = ClientRecord(id=key, name=key, gpu=0, pool=pool, priority=priority,
                                 request_order=order)
            queue.add(inside[key])
        elif not arrive and key in inside:
            queue.remove(inside.pop(key))
        for pool_name in queue.pools():
            for index, client in enumerate(queue.in_order(pool_name)):
                assert queue.index_in_pool(client) == index
                assert queue.nth_in_pool(pool_name, index) is client


@given(steps)
def test_a_pool_waits_exactly_while_one_of_its_clients_waits(ops) -> None:
    queue, inside = WaitQueue(), {}
    for order, (arrive, n, priority, pool) in enumerate(ops):
        key = f"c{n}"
        if arrive and key not in inside:
            inside[key] = ClientRecord(id=key, name=key, gpu=0, pool=pool, priority=priority,
                                 request_order=order)
            queue.add(inside[key])
        elif not arrive and key in inside:
            queue.remove(inside.pop(key))
        for pool_name in ("a", "b"):
            waiting = any(c.pool == pool_name for c in inside.values())
            assert queue.pool_waits(pool_name) == waiting
        assert queue.pool_count() == len({c.pool for c in inside.values()})


def test_a_fifo_queue_answers_positions_as_the_head_is_granted() -> None:
    s = Scheduler(from_mapping({"tq": 1.0}), [GpuSpec(0)], 0.0)
    clients = [s.register(0.0, Registration(name=f"k{n}")) for n in range(6)]
    for client in clients:
        s.acquire(0.0, client.id)
    assert [s.queue_position(c.id, 0.0) for c in clients] == [None, 1, 2, 3, 4, 5]
    s.release(0.1, clients[0].id)  # k1 is granted
    s.release(0.1, clients[3].id)  # k3 cancels its wait, from the middle
    assert [s.queue_position(c.id, 0.1) for c in clients] == [None, None, 1, None, 2, 3]


POOLS = st.fixed_dictionaries({
    "a": st.fixed_dictionaries({"guarantee": st.sampled_from([0.0, 0.2, 0.5]),
                                "weight": st.sampled_from([1, 2]), "maximum": st.just(-1)}),
    "b": st.fixed_dictionaries({"guarantee": st.sampled_from([0.0, 0.2]),
                                "weight": st.sampled_from([1, 3]), "maximum": st.just(-1)}),
})


@settings(max_examples=60, deadline=None)
@given(pools=POOLS, waiters=st.lists(st.tuples(st.sampled_from(["a", "b", "c"]),
                                               st.sampled_from(PRIORITIES)), max_size=25),
       held=st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.floats(0.1, 5.0)),
                     max_size=6),
       cancel=st.lists(st.integers(0, 24), max_size=5),
       holder_pool=st.sampled_from(["a", "b", "c", "d"]))
def test_positions_across_pools_equal_the_rebuilt_order(pools, waiters, held, cancel,
                                                        holder_pool) -> None:
    # Equal entitlements and shares make ties in urgency: the hard case for the binary search.
    s = Scheduler(from_mapping({"tq": 1.0, "pools": pools}), [GpuSpec(0)], 0.0)
    now = 0.0
    for pool, seconds in held:  # some history, so that shares differ
        c = s.register(now, Registration(name="h", pool=pool))
        s.acquire(now, c.id)
        now += seconds
        s.release(now, c.id)
    holder = s.register(now, Registration(name="holder", pool=holder_pool))
    s.acquire(now, holder.id)
    ids = [s.register(now, Registration(name=f"w{n}", pool=pool, priority=priority)).id
           for n, (pool, priority) in enumerate(waiters)]
    for client in ids:
        s.acquire(now, client)
    for n in cancel:
        if n < len(ids):
            s.release(now, ids[n])
    rebuilt = s.queue(0, now + 0.5)
    assert [s.queue_position(c.id, now + 0.5) for c in rebuilt] == \
        list(range(1, len(rebuilt) + 1))


def test_pools_tied_in_urgency_take_turns_by_place_then_request_order() -> None:
    pools = {"a": {"guarantee": 0.0, "weight": 1, "maximum": -1},
             "b": {"guarantee": 0.0, "weight": 1, "maximum": -1}}
    s = Scheduler(from_mapping({"tq": 1.0, "pools": pools}), [GpuSpec(0)], 0.0)
    holder = s.register(0.0, Registration(name="holder", pool="c"))
    s.acquire(0.0, holder.id)
    arrivals = [("a", "NORMAL"), ("b", "NORMAL"), ("b", "NORMAL"), ("a", "HIGH"), ("a", "LOW")]
    clients = [s.register(0.0, Registration(name=f"{pool}{n}", pool=pool, priority=priority))
               for n, (pool, priority) in enumerate(arrivals)]
    for client in clients:
        s.acquire(0.0, client.id)
    rebuilt = [c.name for c in s.queue(0, 0.0)]
    # Each pool in its own order (a: HIGH a3, a0, LOW a4; b: b1, b2); ties between the pools'
    # j-th waiters go to the earlier request.
    assert rebuilt == ["b1", "a3", "a0", "b2", "a4"]
    assert [s.queue_position(c.id, 0.0) for c in clients] == [3, 1, 4, 2, 5]


def test_a_pool_tied_at_an_earlier_place_goes_first() -> None:
    # b used exactly one quantum's share (1 s of a 50 s window, step 1/50): b's j-th waiter ties
    # with a's (j+1)-th, and the smaller place goes first.
    pools = {"a": {"guarantee": 0.0, "weight": 1, "maximum": -1},
             "b": {"guarantee": 0.0, "weight": 1, "maximum": -1}}
    s = Scheduler(from_mapping({"tq": 1.0, "window": 50.0, "pools": pools}), [GpuSpec(0)], 0.0)
    used = s.register(0.0, Registration(name="used", pool="b"))
    s.acquire(10.0, used.id)
    s.release(11.0, used.id)
    holder = s.register(49.0, Registration(name="holder", pool="c"))
    s.acquire(49.0, holder.id)
    clients = [s.register(49.0, Registration(name=name, pool=name[0])) for name in
               ("a0", "a1", "a2", "b0", "b1")]
    for client in clients:
        s.acquire(49.0, client.id)
    assert [c.name for c in s.queue(0, 50.0)] == ["a0", "b0", "a1", "b1", "a2"]
    assert [s.queue_position(c.id, 50.0) for c in clients] == [1, 3, 5, 2, 4]


# Few clients of one lane, so that one leaves and comes back while others still wait behind its
# first place: (arrives or leaves, which client).
rejoins = st.lists(st.tuples(st.booleans(), st.integers(0, 4)), max_size=120)


@given(rejoins)
@example([(True, 0), (True, 1), (False, 1), (True, 2), (True, 1), (False, 0)])
def test_a_client_back_in_its_lane_is_served_after_those_who_came_meanwhile(ops) -> None:
    queue, waiting = WaitQueue(), []
    for order, (arrives, n) in enumerate(ops):
        present = [c for c in waiting if c.id == f"c{n}"]
        if arrives and not present:
            waiting.append(ClientRecord(id=f"c{n}", name=f"c{n}", gpu=0, pool="a",
                                  priority="NORMAL", request_order=order))
            queue.add(waiting[-1])
        elif not arrives and present:
            waiting.remove(present[0])
            queue.remove(present[0])
        assert queue.in_order("a") == waiting  # arrival order, a comeback at the end
        assert [queue.index_in_pool(c) for c in waiting] == list(range(len(waiting)))
        assert queue.heads() == ({"a": waiting[0]} if waiting else {})
