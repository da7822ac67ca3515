"""The share meter's running sums answer what counting every hold in the window answers."""

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
    """Every closed hold, counted one by one over the window (what the meter promises)."""

    def __init__(self, window: float) -> None:
        self.window = window
        self.closed: list[tuple[float, float, str, bool]] = []
        self.open: dict[int, tuple[float, str, bool]] = {}
        self.trim_line = 0.0  # the meter forgets holds that ended before a window it saw

    def start(self, now: float) -> float:
        return max(now - self.window, 0.0)

    def shares(self, now: float, non_preemptible: bool) -> dict[str, float]:
        start = self.start(now)
        self.trim_line = max(self.trim_line, start)
        seconds = dict.fromkeys(POOLS, 0.0)
        spans = [*self.closed, *((b, now, p, low) for b, p, low in self.open.values())]
        for begin, end, pool, low in spans:
            if end <= self.trim_line and (begin, end, pool, low) in self.closed:
                continue
            if non_preemptible and low:
                continue
            seconds[pool] += max(0.0, min(end, now) - max(begin, start))
        span = now - start
        return {p: (s / span if span > 1e-9 else 0.0) for p, s in seconds.items()}


@settings(max_examples=200, deadline=None)
@given(events)
def test_running_sums_equal_counting_every_hold(steps) -> None:
    meter, ref, now = ShareMeter(10.0, 0.0, max_intervals=10**6), Reference(10.0), 0.0
    for step in steps:
        if step[0] == "open" and step[1] not in ref.open:
            meter.open(step[1], step[2], now, step[3])
            ref.open[step[1]] = (now, step[2], step[3])
        elif step[0] == "close" and step[1] in ref.open:
            begin, pool, low = ref.open.pop(step[1])
            ref.trim_line = max(ref.trim_line, ref.start(now))
            meter.close(step[1], now)
            if now > begin:
                ref.closed.append((begin, now, pool, low))
        elif step[0] == "wait":
            now += step[1]
        elif step[0] == "window":
            meter.window = ref.window = step[1]
        elif step[0] == "ask":
            got = meter.shares(now, POOLS, non_preemptible=step[1])
            assert got == pytest.approx(ref.shares(now, step[1]), abs=1e-9)


def test_a_hold_straddling_the_windows_start_counts_only_its_part_inside() -> None:
    meter = ShareMeter(10.0, 0.0)
    meter.open("x", "a", 0.0)
    meter.close("x", 8.0)
    meter.open("y", "b", 8.0)
    meter.close("y", 9.0)
    assert meter.shares(15.0, ["a", "b"]) == pytest.approx({"a": 0.3, "b": 0.1})
