"""The hold's table: kiwi_hold_move (client/hold.c) makes exactly the moves client/hold.h lists,
refuses every other one and leaves the hold where it was, and says so aloud in a checked build
(the sanitizer builds, whose tests fail on the line: shim_harness.SANITIZER_REPORT)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kiwi_jupyter.shim import build

STATES = ["idle", "waiting", "holding", "releasing"]
#: The client's hold machine, as the table in docs/shim.md ("The hold") has it.
LEGAL = {("idle", "waiting"),                           # a call waits at the gate, or acquire
         ("waiting", "holding"), ("waiting", "idle"),   # grant; released, or connection lost
         ("holding", "releasing"), ("holding", "idle"),  # release begins; revoked, or lost
         ("releasing", "holding"), ("releasing", "idle")}  # release cannot go ahead; released

EVERY_MOVE = r"""
#include <stdio.h>
#include "client/client.h"

struct kiwi_comm_state kiwi_comm;

int main(void)
{
    for (int from = 0; from < KIWI_HOLD_COUNT; from++) {
        for (int to = 0; to < KIWI_HOLD_COUNT; to++) {
            kiwi_comm.stats.hold = (enum kiwi_hold)from;
            bool moved = kiwi_hold_move((enum kiwi_hold)to);
            printf("%s %s %d %s\n", kiwi_hold_name((enum kiwi_hold)from),
                   kiwi_hold_name((enum kiwi_hold)to), moved, kiwi_hold_name(kiwi_comm.stats.hold));
        }
    }
    return 0;
}
"""


def every_move(tmp_path: Path, *defines: str) -> tuple[list[tuple[str, str, bool, str]], str]:
    """Each (from, to) tried from a fresh hold: whether it moved, and where the hold is then;
    and what the shim said on stderr."""
    source = tmp_path / "every_move.c"
    source.write_text(EVERY_MOVE)
    program = tmp_path / "every_move"
    shim = build.HERE
    subprocess.run([build.compiler(), "-std=c11", "-Wall", "-Werror", *defines, f"-I{shim}",
                    "-o", str(program), str(source), str(shim / "client" / "hold.c"),
                    str(shim / "mechanisms" / "config.c"), "-lpthread"],
                   check=True, capture_output=True, text=True)
    result = subprocess.run([str(program)], check=True, capture_output=True, text=True,
                            env={"KIWI_SHIM_LOG": "0"})
    rows = []
    for line in result.stdout.splitlines():
        start, to, moved, now = line.split()
        rows.append((start, to, moved == "1", now))
    return rows, result.stderr


@pytest.mark.parametrize("checked", [True, False], ids=["checked", "shipped"])
def test_the_hold_makes_exactly_the_legal_moves(tmp_path: Path, checked: bool) -> None:
    rows, _ = every_move(tmp_path, *(["-DKIWI_CHECKED"] if checked else []))
    assert [(start, to) for start, to, _, _ in rows] == [(a, b) for a in STATES for b in STATES]
    assert {(start, to) for start, to, moved, _ in rows if moved} == LEGAL
    for start, to, moved, now in rows:
        assert now == (to if moved else start), f"{start} -> {to} left the hold at {now}"


def test_a_checked_build_says_each_refused_move_aloud(tmp_path: Path) -> None:
    rows, stderr = every_move(tmp_path, "-DKIWI_CHECKED")
    said = [line.split("warning: ", 1)[1] for line in stderr.splitlines()]
    assert said == [f"BUG: the hold cannot move from {start} to {to}; refused"
                    for start, to, moved, _ in rows if not moved]


def test_a_shipped_build_refuses_quietly(tmp_path: Path) -> None:
    _, stderr = every_move(tmp_path)
    assert stderr == ""
