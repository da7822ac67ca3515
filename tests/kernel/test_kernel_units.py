"""The kernel side's plain functions: names, cells, the waiting line and the status table."""

from __future__ import annotations

import ast

import pytest
from status_fixtures import sample_status

from kiwi_jupyter.kernel.cells import GateInserter, drop_sentence, needs_no_gpu
from kiwi_jupyter.kernel.identity import connection_file_from_argv, kernel_id_from_connection_file
from kiwi_jupyter.kernel.status_view import StatusTable, human_bytes
from kiwi_jupyter.kernel.wait_view import describe_wait
from nodeside.ctl import format_status

#: Made by the daemon's build_status from a real scheduler (tests/status_fixtures.py): c1
#: kernel-a holds GPU 0 (an A100, 80 GiB) with 12.5 s left of its quantum and 17.5 s of GPU
#: time; c2 kernel-b (pool training, LOW) and c3 kernel-<c> (default, HIGH) wait, in that order.
DOCUMENT = sample_status()


def test_the_kernel_id_comes_from_jupyters_connection_file_name() -> None:
    assert kernel_id_from_connection_file("/run/jupyter/kernel-3f2a-77.json") == "3f2a-77"
    assert kernel_id_from_connection_file("/tmp/tmpabc.json") is None


@pytest.mark.parametrize("argv", [["-f", "/r/kernel-x.json"], ["--f=/r/kernel-x.json"],
                                  ["--debug", "--IPKernelApp.connection_file", "/r/kernel-x.json"]])
def test_the_connection_file_is_found_in_every_spelling(argv: list[str]) -> None:
    assert connection_file_from_argv(argv) == "/r/kernel-x.json"


@pytest.mark.parametrize("cell, only", [
    ("%kiwi status", True),
    ("# look first\n\n%kiwi\n%kiwi tq 3", True),
    ("%kiwi status\nx = 1", False),
    ("", True),
    ("# only a note\n\n# and another", True),
    ("# a note\nx = 1", False),
    ("%kiwi?", True),
    ("%config KiwiKernelConfig.failure_policy = 'fail_closed'\n%pip install numpy", True),
    ("%time x = 1", False),
    ("%run train.py", False),
    ("%%bash\necho hi", False),
    ("!kiwictl status", True),
    ("%kiwi\n!.venv/bin/kiwictl status --json", True),
    ("!kiwictl status; python train.py", False),
    ("!kiwictl status | python train.py", False),
    ("!kiwictl status && python train.py", False),
    ("!python train.py", False),
    ("!!kiwictl status", False),
    ("out = !kiwictl status", False),
])
def test_only_cells_of_housekeeping_magics_or_comments_skip_the_gpu(cell: str, only: bool) -> None:
    assert needs_no_gpu(cell) is only


def test_waiting_line_names_position_holder_and_time_left() -> None:
    assert describe_wait(DOCUMENT, "c3", 4.2) == (
        "kiwi: waiting for the GPU (4 s) · position 2 of 2 in the queue · held by kernel-a, "
        "13 s left in its quantum")


def test_waiting_line_says_the_holder_is_giving_back_rather_than_0_s_left() -> None:
    gpu = {**DOCUMENT["gpus"][0], "quantum_remaining": 0.0}
    line = describe_wait({**DOCUMENT, "gpus": [gpu]}, "c3", 4.2)
    assert line.endswith("held by kernel-a, its quantum is over and it is giving the GPU back")
    assert describe_wait(DOCUMENT, "c3", 4.2, aged=12.46).endswith("giving the GPU back")


def test_status_text_counts_one_client_in_the_singular() -> None:
    pools = [{**DOCUMENT["pools"][0], "clients": 1}]
    assert StatusTable({**DOCUMENT, "pools": pools}, me="c2").text().splitlines()[3].endswith(
        "no maximum, 1 client")


def test_waiting_line_without_an_answer_says_so() -> None:
    assert describe_wait(None, "c3", 1.0) == (
        "kiwi: waiting for the GPU (1 s), the scheduler did not say where this kernel is")


def test_status_text_lists_every_client_and_marks_this_kernel() -> None:
    text = StatusTable(DOCUMENT, me="c2").text()
    lines = text.splitlines()
    assert lines[0] == "Kiwi scheduler: mode on, TQ 30 s, policy round-robin"
    assert lines[1] == ("GPU 0 (A100): held by kernel-a, 13 s left in its quantum; "
                        "2 waiting")
    assert lines[2] == "GPU 0 memory: 3.0 GiB of 80.0 GiB used"
    assert lines[3] == ("pool default: share 100%, guarantee 50%, no maximum, 2 clients")
    mine = [line for line in lines if line.endswith("<- this kernel")]
    assert len(mine) == 1 and mine[0].startswith("kernel-b  ")
    assert "18 s" in text and "3.0 GiB" in text


def test_status_says_how_each_client_is_paged_and_why_a_gpu_is_held_back() -> None:
    document = {**DOCUMENT, "gpus": [{**DOCUMENT["gpus"][0],
                                      "evict_blocked": "the checkpoint of kernel-a failed"}],
                "clients": [{**DOCUMENT["clients"][0], "evict": "checkpoint",
                             "checkpoint_state": "checkpointed"}, *DOCUMENT["clients"][1:]]}
    lines = StatusTable(document).text().splitlines()
    assert lines[2] == "GPU 0 grants nobody: the checkpoint of kernel-a failed"
    assert any(line.startswith("kernel-a") and line.endswith("checkpoint (checkpointed)")
               for line in lines)
    assert any(line.startswith("kernel-b") and line.rstrip().endswith("managed")
               for line in lines)


def test_status_shows_a_holder_paused_for_another_ones_turn() -> None:
    document = {**DOCUMENT, "clients": [{**DOCUMENT["clients"][0], "paused": True},
                                        *DOCUMENT["clients"][1:]]}
    [row] = [line for line in StatusTable(document).text().splitlines()
             if line.startswith("kernel-a")]
    assert " paused " in row and " holding " not in row


def test_status_html_escapes_names_and_marks_this_kernel() -> None:
    html = StatusTable(DOCUMENT, me="c3")._repr_html_()
    assert "kernel-&lt;c&gt;" in html and "kernel-<c>" not in html
    assert html.count('title="this kernel"') == 1


def test_human_bytes() -> None:
    assert [human_bytes(n) for n in (None, 512, 2048, 5 * 2**40)] == \
        ["unknown", "512 B", "2.0 KiB", "5.0 TiB"]


@pytest.mark.parametrize("reason, words", [
    (None, "connection to the scheduler was lost"),
    ("quantum", "quantum ended with others waiting"),
    ("preempt", "preempted by a non-preemptible request"),
    ("grace", "kept it past the grace period"),
    ("room", "(another notebook needed the room)"),
    ("bespoke", "(bespoke)"),
])
def test_a_late_drop_is_explained_by_its_reason(reason: str | None, words: str) -> None:
    assert words in drop_sentence(reason)


class Armed:
    def __init__(self, interactivity: str = "last_expr") -> None:
        self.mode = interactivity

    def wants_gate_inserted(self) -> bool:
        return True

    def interactivity(self) -> str:
        return self.mode


GATE = "__import__('kiwi_jupyter.kernel.extension', fromlist=['gate']).gate()"


def gated(cell: str, interactivity: str = "last_expr") -> list[str]:
    tree = ast.parse(cell)
    GateInserter(Armed(interactivity)).visit(tree)
    compile(ast.fix_missing_locations(tree), "<cell>", "exec")  # still valid Python
    return [ast.unparse(stmt) for stmt in tree.body]


def test_the_gate_joins_the_first_statement_after_future_imports() -> None:
    assert gated("from __future__ import annotations\nx = 1\n") == [
        "from __future__ import annotations", f"if not {GATE}:\n    x = 1"]


def test_the_gate_joins_a_first_statement_of_any_kind() -> None:
    assert gated("def f():\n    return 1\nf()") == [
        f"if not {GATE}:\n\n    def f():\n        return 1", "f()"]


def test_a_last_expression_keeps_its_display_apart_from_the_gate() -> None:
    assert gated("2 + 2") == [GATE, "2 + 2"]


@pytest.mark.parametrize("interactivity, joined", [
    ("none", True), ("last_expr", True), ("last", False), ("last_expr_or_assign", False),
    ("all", False)])
def test_a_statement_the_shell_may_display_stays_apart_from_the_gate(
        interactivity: str, joined: bool) -> None:
    body = gated("x = 1", interactivity)
    assert body == ([f"if not {GATE}:\n    x = 1"] if joined else [GATE, "x = 1"])


def test_a_cell_of_future_imports_only_ends_with_the_gate() -> None:
    assert gated("from __future__ import annotations") == [
        "from __future__ import annotations", GATE]


def test_status_text_says_what_is_unknown_about_a_gpu_without_a_known_size() -> None:
    document = {**DOCUMENT, "gpus": [{**DOCUMENT["gpus"][0], "name": "logical GPU",
                                      "memory_total": None}]}
    lines = StatusTable(document).text().splitlines()
    assert lines[1].startswith("GPU 0 (logical GPU): held by kernel-a")
    assert "GPU 0 memory: kernels use 3.0 GiB (the GPU's size is not known here)" in lines


@pytest.mark.parametrize("mode", ["on", "off", "auto"])
def test_kiwi_status_and_kiwictl_status_head_with_the_same_mode_line(mode: str) -> None:
    """One spelling, the document's and kiwictl -S's: 'mode on', never 'mode ON'."""
    document = {**DOCUMENT, "mode": mode, "policy": "round-robin"}
    expected = f"Kiwi scheduler: mode {mode}, TQ 30 s, policy round-robin"
    assert StatusTable(document, me="c2").text().splitlines()[0] == expected
    assert format_status(document).splitlines()[0] == expected


def test_kiwictl_status_marks_the_paused_holder_and_the_turns_in_effect() -> None:
    document = {**DOCUMENT, "mode": "auto",
                "gpus": [{**DOCUMENT["gpus"][0], "holders": ["c1", "c3"], "turns": 1.0}],
                "clients": [{**DOCUMENT["clients"][0], "paused": True}, DOCUMENT["clients"][1],
                            {**DOCUMENT["clients"][2], "state": "holding", "paused": False}]}
    lines = format_status(document).splitlines()
    assert "  holding: kernel-a (paused), kernel-<c> (13 s left in its quantum)" in lines
    assert "  taking turns of 1 s, least GPU time in the cell first" in lines
    assert any(line.startswith("kernel-a") and " paused " in line for line in lines)
