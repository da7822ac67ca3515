"""The shim's tiers: calls only go down, no file calls back into one that calls it, and the hold
has one writer. Each check also runs on a copy of the sources with the fault put in, so that a
checker which sees nothing cannot pass for one that found nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import shim_tiers
from shim_tiers import Call, NoCallGraph

from kiwi_jupyter.shim import build

SHIM = build.HERE


def calls_or_skip(shim: Path) -> list[Call]:
    try:
        return shim_tiers.calls_between_files(shim)
    except NoCallGraph as exc:
        pytest.skip(f"the compiler cannot write call graphs: {exc}")


@pytest.fixture(scope="module")
def calls() -> list[Call]:
    return calls_or_skip(SHIM)


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """The shim's sources, to put a fault into."""
    return shim_tiers.copy_sources(SHIM, tmp_path / "shim")


def add(path: Path, code: str) -> None:
    path.write_text(path.read_text() + "\n" + code + "\n")


def test_every_c_file_lives_in_a_tier() -> None:
    assert not shim_tiers.files_outside_tiers(SHIM)
    for tier in shim_tiers.TIERS:
        assert list((SHIM / tier).glob("*.c")), f"{tier}/ has no C file"


def test_the_call_graph_sees_the_calls_between_the_tiers(calls: list[Call]) -> None:
    between = {(c.caller, c.callee, c.function) for c in calls}
    assert ("interpose/gated.c", "mechanisms/gate.c", "kiwi_gate_enter") in between
    assert ("client/release.c", "mechanisms/pager.c", "kiwi_pager_move") in between
    assert ("client/dispatch.c", "client/hold.c", "kiwi_hold_move") in between


def test_calls_only_go_down(calls: list[Call]) -> None:
    wrong = shim_tiers.upward_calls(calls)
    assert not wrong, "calls against the tiers:\n" + "\n".join(map(str, wrong))


def test_no_file_below_the_client_names_it() -> None:
    found = shim_tiers.client_names_below(SHIM)
    assert not found, "the client named below it:\n" + "\n".join(found)


def test_no_two_files_call_each_other(calls: list[Call]) -> None:
    loops = shim_tiers.cycles(calls)
    assert not loops, "files in a call cycle:\n" + "\n".join(" ".join(c) for c in loops)


def test_only_kiwi_hold_move_writes_the_hold() -> None:
    found = shim_tiers.hold_writes_elsewhere(SHIM)
    assert not found, "the hold written outside kiwi_hold_move: " + ", ".join(found)


def test_a_mechanism_calling_the_client_is_caught(copy: Path) -> None:
    add(copy / "mechanisms" / "gate.c",
        "void kiwi_comm_start(void);\nvoid kiwi_gate_probe(void) { kiwi_comm_start(); }")
    wrong = shim_tiers.upward_calls(calls_or_skip(copy))
    assert [(c.caller, c.callee, c.function) for c in wrong] == [
        ("mechanisms/gate.c", "client/start.c", "kiwi_comm_start")]
    named = shim_tiers.client_names_below(copy)
    assert len(named) == 2 and all(n.startswith("mechanisms/gate.c:") for n in named)


def test_an_entry_point_calling_the_client_is_caught(copy: Path) -> None:
    add(copy / "interpose" / "meminfo.c",
        "void kiwi_evict_answered(const char *);\n"
        "void kiwi_meminfo_probe(void) { kiwi_evict_answered(\"managed\"); }")
    wrong = shim_tiers.upward_calls(calls_or_skip(copy))
    assert [(c.caller, c.callee, c.function) for c in wrong] == [
        ("interpose/meminfo.c", "client/evict.c", "kiwi_evict_answered")]


def test_a_cycle_between_two_files_is_caught(copy: Path) -> None:
    add(copy / "mechanisms" / "news.c",  # interrupt.c posts news: news.c must not call it back
        "unsigned kiwi_news_probe(void) { return kiwi_interrupts(); }")
    assert shim_tiers.cycles(calls_or_skip(copy)) == [["mechanisms/interrupt.c",
                                                       "mechanisms/news.c"]]


def test_a_write_of_the_hold_elsewhere_is_caught(copy: Path) -> None:
    dispatch = copy / "client" / "dispatch.c"
    add(dispatch, "void kiwi_dispatch_probe(struct kiwi_client *c)\n{\n"
                  "    c->stats.hold = KIWI_HOLDING;\n}")
    line = len(dispatch.read_text().splitlines()) - 1
    assert shim_tiers.hold_writes_elsewhere(copy) == [f"client/dispatch.c:{line}"]
