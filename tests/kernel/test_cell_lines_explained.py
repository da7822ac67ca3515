"""Every line Kiwi can write under a cell is explained where a newcomer reads: the demo
notebook and docs/kernel.md. The lines are made by the code that writes them, their figures
masked, so a new or changed line fails here until both say what it means."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from kiwi_jupyter.kernel.cells import drop_sentence, handed_back_sentence
from kiwi_jupyter.kernel.wait_view import describe_wait

REPO = Path(__file__).resolve().parents[2]
MiB = 1024 * 1024


def _document(**gpu: object) -> dict:
    return {"gpus": [{"index": 0, "holders": ["c2"], "queue": ["c1"], **gpu}],
            "clients": [{"id": "c1", "name": "k1", "display_name": "kiwi-demo.ipynb",
                         "queue_position": 1},
                        {"id": "c2", "name": "k2", "display_name": "kiwi-demo-partner.ipynb"}]}


def lines() -> list[str]:
    waiting_for = _document(quantum_remaining=0.0)
    waiting_for["clients"][0]["waiting_for"] = {"client": "c2", "bytes": 8 * MiB,
                                                "action": "evict"}
    return [
        describe_wait(_document(quantum_remaining=2.0), "c1", 3.0),
        describe_wait(_document(quantum_remaining=0.0), "c1", 3.0).split(", ")[-1],
        describe_wait(waiting_for, "c1", 3.0).split(" · ")[2],
        "kiwi: waited 12.3 s for the GPU",
        f"kiwi: {handed_back_sentence(2, 'quantum', 10.4)}",
        f"kiwi: {drop_sentence('quantum')}",
        f"kiwi: {drop_sentence('grace')}",
    ]


def masked(text: str) -> str:
    """Figures and names out of the way: what a line says, not the numbers it says it with."""
    text = re.sub(r"\d+(\.\d+)?", "N", text)
    return re.sub(r"\s+", " ", text.replace("`", ""))


@pytest.mark.parametrize("where", ["binder/kiwi-demo.ipynb", "docs/kernel.md"])
def test_every_line_a_cell_can_print_is_explained(where: str) -> None:
    if where.endswith(".ipynb"):
        notebook = nbformat.read(REPO / where, as_version=4)
        text = "\n".join(c.source for c in notebook.cells if c.cell_type == "markdown")
    else:
        text = (REPO / where).read_text()
    missing = [line for line in lines() if masked(line) not in masked(text)]
    assert missing == []


def test_the_connection_lost_line_is_explained_in_the_docs() -> None:
    assert masked(f"kiwi: {drop_sentence(None)}") in masked((REPO / "docs/kernel.md").read_text())
