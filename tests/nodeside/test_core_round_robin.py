"""Mode on and off, quanta and handovers on the sans-I/O core, with an injected clock.

Each test is one rule of the seed's overview (kiwi-overview.txt) or of issue 2.
"""

from __future__ import annotations

import pytest

from nodeside import protocol as p
from nodeside.config import SchedulerConfig
from nodeside.model import Registration
from nodeside.scheduler.core import (
    Drop,
    GpuSpec,
    Grant,
    Released,
    Revoke,
    Scheduler,
    SchedulerError,
)

TQ = 30.0


def make(mode: str = "on", tq: float = TQ, grace: float = 5.0, gpus: int = 1) -> Scheduler:
    config = SchedulerConfig(tq=tq, mode=mode, grace=grace)
    return Scheduler(config, [GpuSpec(i) for i in range(gpus)], now=0.0)


def grants(actions: list) -> list[str]:
    return [a.client for a in actions if isinstance(a, Grant)]


def drops(actions: list) -> list[Drop]:
    return [a for a in actions if isinstance(a, Drop)]


def test_seed_timeline_t0_to_t4() -> None:
    s = make()
    a = s.register(0.0, Registration(name="A"))
    b = s.register(0.0, Registration(name="B"))
    # T0-T1: A does CPU work, B is idle; nothing happens.
    assert s.next_deadline(5.0) is None
    # T1: A asks; nobody holds, so it is granted at once for one quantum.
    t1 = 10.0
    assert grants(s.acquire(t1, a.id)) == [a.id]
    # T2: B asks while A holds: it waits.
    t2 = 25.0
    assert s.acquire(t2, b.id) == []
    assert s.queue_position(b.id, t2) == 1
    assert s.next_deadline(t2) == pytest.approx(t1 + TQ)
    # T3 = T1 + TQ: A is asked to give the GPU back.
    t3 = t1 + TQ
    actions = s.tick(t3)
    assert [(d.client, d.reason) for d in drops(actions)] == [(a.id, p.REASON_QUANTUM)]
    # A relinquishes; B is granted; A still wants the GPU, asks again and waits.
    assert grants(s.release(t3 + 0.01, a.id)) == [b.id]
    assert s.acquire(t3 + 0.02, a.id) == []
    assert s.clients[a.id].state == "waiting"
    # T4 < T3 + TQ: B's burst ends early; A gets the GPU back at once.
    t4 = t3 + 12.0
    assert grants(s.release(t4, b.id)) == [a.id]
    # T > T4: no overlap; A releases and both run unhindered.
    s.release(t4 + 3, a.id)
    assert grants(s.acquire(t4 + 20, b.id)) == [b.id]


def test_request_with_no_holder_is_granted_at_once_for_one_quantum() -> None:
    s = make()
    a = s.register(0.0, Registration(name="A"))
    assert s.acquire(1.0, a.id) == [Grant(a.id, 0, TQ)]
    assert s.quantum_remaining(0, 11.0) == pytest.approx(TQ - 10.0)


def test_waiters_are_served_in_request_order() -> None:
    s = make()
    holder, *waiters = (s.register(0.0, Registration(name=n)) for n in "HXYZ")
    s.acquire(0.0, holder.id)
    for i, w in enumerate(waiters):
        s.acquire(1.0 + i, w.id)
    assert [c.id for c in s.queue(0, 5.0)] == [w.id for w in waiters]
    order = []
    current = holder
    for t in (31.0, 62.0, 93.0):
        s.tick(t)
        granted = grants(s.release(t, current.id))
        order += granted
        current = s.clients[granted[0]]
    assert order == [w.id for w in waiters]


def test_holder_that_asks_again_joins_the_tail() -> None:
    s = make()
    a, b, c = (s.register(0.0, Registration(name=n)) for n in "ABC")
    s.acquire(0.0, a.id)
    s.acquire(1.0, b.id)
    s.acquire(2.0, c.id)
    s.tick(TQ)
    s.release(TQ, a.id)
    s.acquire(TQ, a.id)
    assert [x.id for x in s.queue(0, TQ)] == [c.id, a.id]


def test_early_release_hands_over_at_once() -> None:
    s = make()
    a, b = s.register(0.0, Registration(name="A")), s.register(0.0, Registration(name="B"))
    s.acquire(0.0, a.id)
    s.acquire(1.0, b.id)
    actions = s.release(2.0, a.id)
    assert grants(actions) == [b.id]
    assert Released(a.id, evict=True) in actions


def test_quantum_end_with_nobody_waiting_renews_silently() -> None:
    s = make()
    a = s.register(0.0, Registration(name="A"))
    s.acquire(0.0, a.id)
    assert s.next_deadline(0.0) is None  # nothing is due: no timer runs for a lone holder
    # Two and a half quanta later the holder still holds, in its third quantum.
    assert s.clients[a.id].state == "holding"
    assert s.quantum_remaining(0, 2.5 * TQ) == pytest.approx(0.5 * TQ)


def test_a_newcomer_waits_for_the_lone_holders_current_quantum_to_end() -> None:
    # The seed's timeline: B asks while A holds; B waits for A's quantum to elapse. A has
    # held alone for more than one quantum; its quantum was renewed, with no tick, at TQ.
    s = make()
    a, b = s.register(0.0, Registration(name="A")), s.register(0.0, Registration(name="B"))
    s.acquire(0.0, a.id)
    assert drops(s.acquire(TQ + 1, b.id)) == []
    deadline = s.next_deadline(TQ + 1)
    assert deadline == pytest.approx(2 * TQ)
    assert [d.client for d in drops(s.tick(deadline))] == [a.id]


def test_a_newcomer_at_a_renewal_waits_a_whole_quantum() -> None:
    s = make()
    a, b = s.register(0.0, Registration(name="A")), s.register(0.0, Registration(name="B"))
    s.acquire(0.0, a.id)
    assert drops(s.acquire(3 * TQ, b.id)) == []
    assert s.next_deadline(3 * TQ) == pytest.approx(4 * TQ)


def test_a_lone_holders_quanta_keep_their_grid_when_another_gpu_ticks() -> None:
    # GPU 1's deadlines tick GPU 0 too; that must not move GPU 0's lone holder's quanta.
    s = make(gpus=2)
    a = s.register(0.0, Registration(name="A", gpu=0))
    s.acquire(0.0, a.id)  # A's quanta: [0, TQ], [TQ, 2 TQ], [2 TQ, 3 TQ], ...
    c = s.register(0.0, Registration(name="C", gpu=1))
    d = s.register(0.0, Registration(name="D", gpu=1))
    s.acquire(0.5 * TQ, c.id)
    s.acquire(1.0 * TQ, d.id)
    assert s.next_deadline(1.0 * TQ) == pytest.approx(1.5 * TQ)
    s.tick(1.5 * TQ)  # ticks GPU 0 halfway through A's second quantum
    b = s.register(0.0, Registration(name="B", gpu=0))
    s.acquire(2.2 * TQ, b.id)
    deadlines = [a.hold.quantum_start + TQ]
    assert deadlines == [pytest.approx(3 * TQ)]


def test_mode_off_withdraws_drops_so_a_later_request_revokes_nobody() -> None:
    s = make(grace=5.0)
    a, b, c = (s.register(0.0, Registration(name=n)) for n in "ABC")
    s.acquire(0.0, a.id)
    s.acquire(1.0, b.id)
    assert [d.client for d in drops(s.tick(s.next_deadline(1.0)))] == [a.id]
    s.set_mode(TQ, "off")
    assert s.next_deadline(TQ) is None  # the daemon sets no timer in mode off
    actions = s.acquire(TQ + 100.0, c.id)
    assert not [x for x in actions if isinstance(x, Revoke)]
    assert grants(actions) == [c.id]
    assert s.clients[a.id].state == "holding"
    # Back on, A's quantum starts afresh: it is not revoked either.
    s.set_mode(TQ + 101.0, "on")
    assert not [x for x in s.tick(TQ + 101.0) if isinstance(x, Revoke)]


def test_drop_is_sent_once_per_quantum() -> None:
    s = make()
    a, b = s.register(0.0, Registration(name="A")), s.register(0.0, Registration(name="B"))
    s.acquire(0.0, a.id)
    s.acquire(1.0, b.id)
    assert len(drops(s.tick(TQ))) == 1
    assert drops(s.tick(TQ + 1)) == []


def test_holder_ignoring_a_drop_is_revoked_after_the_grace_period() -> None:
    s = make(grace=5.0)
    a, b = s.register(0.0, Registration(name="A")), s.register(0.0, Registration(name="B"))
    s.acquire(0.0, a.id)
    s.acquire(1.0, b.id)
    s.tick(TQ)
    assert s.next_deadline(TQ) == pytest.approx(TQ + 5.0)
    assert s.tick(TQ + 4.9) == []
    actions = s.tick(TQ + 5.0)
    assert Revoke(a.id, 0, p.REASON_GRACE, ignored_for=5.0) in actions
    assert grants(actions) == [b.id]
    assert s.clients[a.id].state == "idle"


def test_dead_holder_frees_the_gpu_for_the_next_waiter() -> None:
    s = make()
    a, b = s.register(0.0, Registration(name="A")), s.register(0.0, Registration(name="B"))
    s.acquire(0.0, a.id)
    s.acquire(1.0, b.id)
    assert grants(s.unregister(2.0, a.id)) == [b.id]
    assert a.id not in s.clients


def test_dead_waiter_is_never_granted() -> None:
    s = make()
    a, b, c = (s.register(0.0, Registration(name=n)) for n in "ABC")
    s.acquire(0.0, a.id)
    s.acquire(1.0, b.id)
    s.acquire(2.0, c.id)
    s.unregister(3.0, b.id)
    assert grants(s.release(4.0, a.id)) == [c.id]


def test_release_while_waiting_cancels_the_request() -> None:
    s = make()
    a, b = s.register(0.0, Registration(name="A")), s.register(0.0, Registration(name="B"))
    s.acquire(0.0, a.id)
    s.acquire(1.0, b.id)
    assert s.release(2.0, b.id) == [Released(b.id, evict=False)]
    assert s.queue(0, 2.0) == []
    assert grants(s.release(3.0, a.id)) == []


def test_release_when_idle_is_a_no_op() -> None:
    s = make()
    a = s.register(0.0, Registration(name="A"))
    assert s.release(1.0, a.id) == [Released(a.id, evict=False)]


def test_acquire_while_holding_answers_grant_again() -> None:
    s = make()
    a = s.register(0.0, Registration(name="A"))
    s.acquire(0.0, a.id)
    assert grants(s.acquire(1.0, a.id)) == [a.id]
    assert s.clients[a.id].hold.granted_at == 0.0


def test_mode_off_grants_every_request_at_once() -> None:
    s = make(mode="off")
    clients = [s.register(0.0, Registration(name=str(i))) for i in range(5)]
    for i, c in enumerate(clients):
        assert s.acquire(float(i), c.id) == [Grant(c.id, 0, None)]
    assert len(s.gpus[0].holders) == 5
    assert s.next_deadline(10.0) is None


def test_turning_on_while_several_hold_drops_all_but_one_and_serializes() -> None:
    s = make(mode="off")
    a, b, c = (s.register(0.0, Registration(name=n)) for n in "ABC")
    for t, x in enumerate((a, b, c)):
        s.acquire(float(t), x.id)
    actions = s.set_mode(10.0, "on")
    assert sorted(d.client for d in drops(actions)) == sorted([b.id, c.id])
    assert all(d.reason == p.REASON_MODE for d in drops(actions))
    # They give it back; the keeper holds alone; re-requests queue behind it.
    s.release(10.1, b.id)
    s.release(10.1, c.id)
    assert list(s.gpus[0].holders) == [a.id]
    s.acquire(10.2, b.id)
    assert s.clients[b.id].state == "waiting"
    # The keeper's quantum counts from the switch, not from its grant in mode off.
    assert s.next_deadline(10.2) == pytest.approx(10.0 + TQ)


def test_turning_off_grants_every_waiter() -> None:
    s = make()
    a, b = s.register(0.0, Registration(name="A")), s.register(0.0, Registration(name="B"))
    s.acquire(0.0, a.id)
    s.acquire(1.0, b.id)
    assert grants(s.set_mode(2.0, "off")) == [b.id]


def test_tq_change_applies_to_the_running_quantum_from_its_start() -> None:
    s = make(tq=30.0)
    a, b = s.register(0.0, Registration(name="A")), s.register(0.0, Registration(name="B"))
    s.acquire(0.0, a.id)
    s.acquire(1.0, b.id)
    s.set_tq(5.0, 10.0)
    assert s.next_deadline(5.0) == pytest.approx(10.0)
    assert drops(s.tick(10.0))[0].client == a.id


def test_tq_shortened_below_the_time_already_held_ends_the_quantum_now() -> None:
    s = make(tq=30.0)
    a, b = s.register(0.0, Registration(name="A")), s.register(0.0, Registration(name="B"))
    s.acquire(0.0, a.id)
    s.acquire(1.0, b.id)
    assert drops(s.set_tq(20.0, 5.0))[0].client == a.id


def test_per_gpu_tq_and_independent_queues() -> None:
    s = make(gpus=2)
    a = s.register(0.0, Registration(name="A", gpu=0))
    b = s.register(0.0, Registration(name="B", gpu=1))
    assert grants(s.acquire(0.0, a.id)) == [a.id]
    assert grants(s.acquire(0.0, b.id)) == [b.id]
    s.set_tq(0.0, 2.0, gpu=1)
    assert s.tq_for(1) == 2.0 and s.tq_for(0) == TQ


def test_bad_requests_raise_typed_errors() -> None:
    s = make()
    with pytest.raises(SchedulerError) as gpu:
        s.register(0.0, Registration(name="A", gpu=3))
    assert gpu.value.code == p.E_INVALID
    with pytest.raises(SchedulerError):
        s.set_mode(0.0, "sideways")
    with pytest.raises(SchedulerError):
        s.set_tq(0.0, 0)
    with pytest.raises(SchedulerError) as unknown:
        s.acquire(0.0, "c999")
    assert unknown.value.code == p.E_STATE


def test_a_waiter_that_cancels_and_asks_again_goes_behind_those_who_asked_meanwhile() -> None:
    s = make()
    holder, a, b, c = (s.register(0.0, Registration(name=n)) for n in ("H", "A", "B", "C"))
    s.acquire(1.0, holder.id)
    s.acquire(2.0, a.id)
    s.acquire(3.0, b.id)
    s.release(4.0, b.id)  # B gives up its wait (an interrupted cell)...
    s.acquire(5.0, c.id)
    s.acquire(6.0, b.id)  # ... and asks again, after C
    assert [s.queue_position(x.id, 6.0) for x in (a, c, b)] == [1, 2, 3]
    assert grants(s.release(7.0, holder.id)) == [a.id]
    assert [s.queue_position(x.id, 7.0) for x in (c, b)] == [1, 2]
    assert grants(s.release(8.0, a.id)) == [c.id]
    assert grants(s.release(9.0, c.id)) == [b.id]
