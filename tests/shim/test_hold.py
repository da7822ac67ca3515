"""The hold's table: kiwi_hold_move (client/hold.c) makes exactly the moves of the protocol's one
table of a client's hold (nodeside/protocol/hold.py, generated into client/protocol.h), refuses
every other one and leaves the hold where it was, and says so aloud in a checked build (the
sanitizer builds, whose tests fail on the line: shim_harness.SANITIZER_REPORT). The statistics
show each state as one of the four words they have always shown."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kiwi_jupyter.shim import build
from nodeside.protocol.hold import MOVES, Hold

STATES = [hold.name for hold in Hold]
LEGAL = {(before.name, after.name) for before, after in MOVES}
#: What the stats' "state" says for each: the kernel and its users read these words.
WORDS = {"IDLE": "idle", "ASKING": "waiting", "WAITING": "waiting", "HOLDING": "holding",
         "DROPPING": "releasing", "RELEASING": "releasing"}

EVERY_MOVE = r"""
#include <stdio.h>
#include "client/client.h"

int main(void)
{
    for (int from = 0; from < KIWI_HOLD_STATES; from++) {
        for (int to = 0; to < KIWI_HOLD_STATES; to++) {
            struct kiwi_client client = {0}; /* a handle on the stack: hold.c needs no other */
            client.stats.hold = (enum kiwi_hold_state)from;
            bool moved = kiwi_hold_move(&client, (enum kiwi_hold_state)to);
            printf("%s %s %d %s %s\n", kiwi_hold_state_name((enum kiwi_hold_state)from),
                   kiwi_hold_state_name((enum kiwi_hold_state)to), moved,
                   kiwi_hold_state_name(client.stats.hold),
                   kiwi_hold_word((enum kiwi_hold_state)from));
        }
    }
    return 0;
}
"""


def every_move(tmp_path: Path, *defines: str) -> tuple[list[tuple[str, str, bool, str, str]], str]:
    """Each (from, to) tried from a fresh hold: whether it moved, where the hold is then and
    the word the stats show for from; and what the shim said on stderr."""
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
        start, to, moved, now, word = line.split()
        rows.append((start, to, moved == "1", now, word))
    return rows, result.stderr


@pytest.mark.parametrize("checked", [True, False], ids=["checked", "shipped"])
def test_the_hold_makes_exactly_the_moves_of_the_protocols_table(tmp_path: Path,
                                                                  checked: bool) -> None:
    rows, _ = every_move(tmp_path, *(["-DKIWI_CHECKED"] if checked else []))
    assert [(start, to) for start, to, *_ in rows] == [(a, b) for a in STATES for b in STATES]
    assert {(start, to) for start, to, moved, *_ in rows if moved} == LEGAL
    for start, to, moved, now, _ in rows:
        assert now == (to if moved else start), f"{start} -> {to} left the hold at {now}"


def test_the_stats_show_each_state_as_one_of_four_words(tmp_path: Path) -> None:
    rows, _ = every_move(tmp_path)
    assert {start: word for start, _, _, _, word in rows} == WORDS


def test_a_checked_build_says_each_refused_move_aloud(tmp_path: Path) -> None:
    rows, stderr = every_move(tmp_path, "-DKIWI_CHECKED")
    said = [line.split("warning: ", 1)[1] for line in stderr.splitlines()]
    assert said == [f"BUG: the hold cannot move from {start} to {to}; refused"
                    for start, to, moved, *_ in rows if not moved]


def test_a_shipped_build_refuses_quietly(tmp_path: Path) -> None:
    _, stderr = every_move(tmp_path)
    assert stderr == ""
