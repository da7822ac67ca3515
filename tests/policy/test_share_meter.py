"""The share meter's running sums answer what counting every hold in the window answers, and
holds side by side split the GPU's time between them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodeside.scheduler.pools import ShareMeter

POOLS = ["a", "b", "c"]

events = st.lists(st.one_of(
    st.tuples(st.just("open"), st.integers(0, 3), st.sampled_from(POOLS), st.booleans()),
    st.tuples(st.just("close"), st.integers(0, 3)),
    st.tuples(st.just("wait"), st.floats(0.0, 4.0)),
    st.tuples(st.just("window"), st.sampled_from([3.0, 10.0, 30.0])),
    st.tuples(st.just("ask"), st.booleans()),
), max_size=80)


class Reference:
    """Every hold counted second by second over the window (what the meter promises): while k
    holds are open each gets 1/k of the GPU's time."""

    def __init__(self, window: float) -> None:
        self.window = window
        self.closed: list[tuple[float, float, str, bool]] = []
        self.open: dict[int, tuple[float, str, bool]] = {}
        #: The meter books the open holds' seconds at each open or close, and forgets what it
        #: booked that ended before a window it saw.
        self.changed = 0.0
        self.trim_line = 0.0

    def start(self, now: float) -> float:
        return max(now - self.window, 0.0)

    def change(self, now: float) -> None:
        """An open or a close at ``now`` (before the open holds change)."""
        if self.open and now > self.changed:
            self.trim_line = max(self.trim_line, self.start(now))
        self.changed = max(self.changed, now)

    def shares(self, now: float, non_preemptible: bool) -> dict[str, float]:
        start = self.start(now)
        self.trim_line = max(self.trim_line, start)
        spans = [*self.closed, *((b, now, p, low) for b, p, low in self.open.values())]
        cuts = sorted({start, now, *(t for b, e, _, _ in spans for t in (b, e) if start < t < now)})
        seconds = dict.fromkeys(POOLS, 0.0)
        for left, right in zip(cuts, cuts[1:], strict=False):
            if right <= self.trim_line and right <= self.changed:
                continue  # booked, and forgotten
            middle = (left + right) / 2
            holding = [(p, low) for b, e, p, low in spans if b <= middle < e]
            for pool, low in holding:
                if not (non_preemptible and low):
                    seconds[pool] += (right - left) / len(holding)
        span = now - start
        return {p: (s / span if span > 1e-9 else 0.0) for p, s in seconds.items()}


def replay(steps, meter: ShareMeter, ref: Reference):
    """Plays ``steps`` on both; yields (now, the meter's answer, the reference's) at each ask."""
    now = 0.0
    for step in steps:
        if step[0] == "open" and step[1] not in ref.open:
            meter.open(step[1], step[2], now, step[3])
            ref.change(now)
            ref.open[step[1]] = (now, step[2], step[3])
        elif step[0] == "close" and step[1] in ref.open:
            meter.close(step[1], now)
            ref.change(now)
            begin, pool, low = ref.open.pop(step[1])
            if now > begin:
                ref.closed.append((begin, now, pool, low))
        elif step[0] == "wait":
            now += step[1]
        elif step[0] == "window":
            meter.window = ref.window = step[1]
        elif step[0] == "ask":
            got = meter.shares(now, POOLS, non_preemptible=step[1])
            yield now, got, ref.shares(now, step[1])


@settings(max_examples=300, deadline=None)
@given(events)
def test_running_sums_equal_counting_every_hold(steps) -> None:
    meter, ref = ShareMeter(10.0, 0.0, max_intervals=10**6), Reference(10.0)
    for _, got, expected in replay(steps, meter, ref):
        assert got == pytest.approx(expected, abs=1e-9)


@settings(max_examples=300, deadline=None)
@given(events)
def test_the_pools_shares_on_a_gpu_never_sum_to_more_than_1(steps) -> None:
    meter, ref = ShareMeter(10.0, 0.0), Reference(10.0)
    for _, got, _ in replay(steps, meter, ref):
        assert sum(got.values()) <= 1.0 + 1e-9


def test_a_hold_straddling_the_windows_start_counts_only_its_part_inside() -> None:
    meter = ShareMeter(10.0, 0.0)
    meter.open("x", "a", 0.0)
    meter.close("x", 8.0)
    meter.open("y", "b", 8.0)
    meter.close("y", 9.0)
    assert meter.shares(15.0, ["a", "b"]) == pytest.approx({"a": 0.3, "b": 0.1})


def test_two_holders_side_by_side_for_10_s_get_half_the_gpu_each() -> None:
    meter = ShareMeter(10.0, 0.0)
    meter.open("x", "a", 0.0)
    meter.open("y", "b", 0.0)
    assert meter.shares(10.0, ["a", "b"]) == pytest.approx({"a": 0.5, "b": 0.5})  # still open
    meter.close("x", 10.0)
    meter.close("y", 10.0)
    assert meter.shares(10.0, ["a", "b"]) == pytest.approx({"a": 0.5, "b": 0.5})


def test_two_holders_of_one_pool_side_by_side_use_the_gpu_once() -> None:
    meter = ShareMeter(10.0, 0.0)
    meter.open("x", "a", 0.0)
    meter.open("y", "a", 0.0)
    meter.close("x", 10.0)
    meter.close("y", 10.0)
    assert meter.shares(10.0, ["a"]) == pytest.approx({"a": 1.0})


def test_a_hold_alone_then_side_by_side_counts_each_stretch_at_its_rate() -> None:
    # x alone for 5 s, then beside y for 5 s: 5 + 2.5 GPU seconds, of which only the 2.5 of
    # its last 5 s fall in a window that starts at 5 (spread evenly over x's 10 s: 3.75).
    meter = ShareMeter(10.0, 0.0)
    meter.open("x", "a", 0.0)
    meter.open("y", "b", 5.0)
    meter.close("x", 10.0)
    meter.close("y", 10.0)
    assert meter.shares(10.0, ["a", "b"]) == pytest.approx({"a": 0.75, "b": 0.25})
    assert meter.shares(15.0, ["a", "b"]) == pytest.approx({"a": 0.25, "b": 0.25})
