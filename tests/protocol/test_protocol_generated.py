"""What the protocol's table makes for others is checked in, and never stale: docs/protocol.md's
tables, the Python names, the shim's C header, the panel's types, and the panel's status fixture.
``python -m nodeside.protocol.generate`` (and ``python tests/status_fixtures.py``) write them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import status_fixtures

from nodeside.protocol import generate, messages
from nodeside.protocol.hold import MOVES, Hold

REPO = Path(__file__).resolve().parents[2]
HEADER = REPO / "kiwi_jupyter/shim/client/protocol.h"


def test_every_generated_file_reads_what_the_table_makes() -> None:
    stale = [target.path for target, _ in generate.stale()]
    assert stale == [], f"{stale} differ from the table: run python -m nodeside.protocol.generate"


def test_a_change_to_the_table_makes_every_file_that_shows_it_stale(
        monkeypatch: pytest.MonkeyPatch) -> None:
    renamed = tuple(messages.Message(m.const, "pong2" if m.op == "pong" else m.op, m.sender,
                                     m.fields, m.answers, m.event, m.doc)
                    for m in messages.MESSAGES)
    monkeypatch.setattr(messages, "MESSAGES", renamed)
    assert sorted(target.path for target, _ in generate.stale()) == [
        "docs/protocol.md", "kiwi_jupyter/shim/client/protocol.h", "nodeside/protocol/names.py"]


def test_the_check_exits_1_naming_a_stale_file(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(messages, "REASONS", messages.REASONS[:-1])
    assert generate.main(["--check"]) == 1
    assert "nodeside/protocol/names.py differs" in capsys.readouterr().err


def test_splice_replaces_only_what_is_between_a_blocks_markers() -> None:
    text = ("prose\n<!-- generated: errors (how) -->\nold\n<!-- end generated: errors -->\n"
            "more prose\n")
    assert generate.splice(text, {"errors": "new\n"}) == (
        "prose\n<!-- generated: errors (how) -->\nnew\n<!-- end generated: errors -->\n"
        "more prose\n")
    with pytest.raises(KeyError, match="no generated block called 'errors'"):
        generate.splice(text, {})


def test_the_panels_status_fixture_is_what_build_status_makes() -> None:
    assert status_fixtures.PANEL_FIXTURE.read_text() == status_fixtures.panel_fixture(), \
        "run python tests/status_fixtures.py"


def test_the_c_header_compiles_under_the_shims_warnings_and_holds_the_same_moves(
        tmp_path: Path) -> None:
    program = tmp_path / "moves.c"
    program.write_text(
        '#include <stdio.h>\n#include "protocol.h"\n'
        "int main(void)\n{\n"
        "    for (int a = 0; a < KIWI_HOLD_STATES; a++)\n"
        "        for (int b = 0; b < KIWI_HOLD_STATES; b++)\n"
        "            if (kiwi_hold_legal((enum kiwi_hold_state)a, (enum kiwi_hold_state)b))\n"
        '                printf("%s %s\\n", kiwi_hold_state_name((enum kiwi_hold_state)a),\n'
        "                       kiwi_hold_state_name((enum kiwi_hold_state)b));\n"
        '    printf("fatal %d %d\\n", kiwi_error_fatal(KIWI_E_VERSION), '
        "kiwi_error_fatal(KIWI_E_LIMIT));\n"
        "    return 0;\n}\n")
    binary = tmp_path / "moves"
    subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", "-Wshadow", "-Wstrict-prototypes",
                    "-Werror", f"-I{HEADER.parent}", str(program), "-o", str(binary)],
                   check=True, capture_output=True, text=True)
    printed = subprocess.run([str(binary)], check=True, capture_output=True,
                             text=True).stdout.splitlines()
    order = list(Hold)
    expected = [f"{a.name} {b.name}" for a in order for b in order if (a, b) in MOVES]
    assert printed == [*expected, "fatal 1 0"]


def test_the_panels_formats_are_what_nodeside_formats_writes() -> None:
    from nodeside import formats_panel

    assert (formats_panel.ROOT / formats_panel.PANEL_FILE).read_text() == \
        formats_panel.panel_module(), "run python -m nodeside.formats_panel"
