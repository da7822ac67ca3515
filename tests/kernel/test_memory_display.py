"""Where each kernel's memory is, as ``kiwictl status``, ``%kiwi status`` and the waiting line say
it: on GPU, moving out, in host memory or moving in; the GPU's resident total against its
capacity and the host RAM its evicted kernels hold against the budget; and what a waiting kernel
waits for. A document without the memory keys (a daemon that keeps no resident memory) reads as
it did before."""

from __future__ import annotations

from typing import Any

import pytest
from status_fixtures import memory_status, sample_status

from kiwi_jupyter.kernel.status_view import StatusTable
from kiwi_jupyter.kernel.wait_view import Place, WaitView, describe_wait
from nodeside.ctl import format_status
from nodeside.memory_words import human_bytes, waiting_for_words
from nodeside.protocol.document import CLIENT, GPU, Part

#: nbA.ipynb (c1) moving its 24 GiB out, nbB (c2) holding with 40 GiB, nbC (c3) first in the
#: queue and waiting for nbA's 24 GiB, nbD (c4) idle in host memory; 50 of 80 GiB resident,
#: 34 GiB of a 64 GiB host budget taken (tests/status_fixtures.py).
MEMORY = memory_status()


def older_daemons(document: dict[str, Any]) -> dict[str, Any]:
    """The document as a daemon that keeps no resident memory sends it: without the keys the
    table says a memory-keeping scheduler adds."""
    def without(part: Part, entry: dict[str, Any]) -> dict[str, Any]:
        memory = {k.name for k in part.keys if k.added_by == "memory"}
        return {key: value for key, value in entry.items() if key not in memory}
    return {**document, "gpus": [without(GPU, g) for g in document["gpus"]],
            "clients": [without(CLIENT, c) for c in document["clients"]]}


PLAIN = older_daemons(sample_status())

def test_kiwictl_says_the_gpus_resident_total_and_the_host_memory_evicted_kernels_hold() -> None:
    lines = format_status(MEMORY).splitlines()
    assert ("  memory: 50.0 GiB of 80.0 GiB on the GPU, 34.0 GiB of 64.0 GiB in host memory"
            in lines)


def test_kiwictl_says_what_the_waiting_kernel_waits_for() -> None:
    lines = format_status(MEMORY).splitlines()
    assert ("  #1 waiting: nbC.ipynb, waiting for nbA.ipynb to move 24.0 GiB to host memory"
            in lines)


def test_kiwictl_shows_each_kernels_memory_and_where_it_is() -> None:
    lines = format_status(MEMORY).splitlines()
    table = lines[lines.index("") + 1:]
    assert table[0].endswith("GPU TIME MEMORY             ON GPU    IN HOST")
    assert [line[line.index(" NORMAL ") + 26:] for line in table[1:]] == [
        "1 s moving out       10.0 GiB   14.0 GiB",
        "3 s on GPU           40.0 GiB        0 B",
        "0 s on GPU                0 B        0 B",
        "0 s in host memory        0 B   20.0 GiB",
    ]


def test_kiwi_status_shows_each_kernels_memory_in_three_columns() -> None:
    lines = StatusTable(MEMORY, me="c3").text().splitlines()
    table = lines[lines.index("") + 1:]
    assert table[0].endswith("evict    memory          on GPU    in host")
    assert [line[line.index("managed") + 9:] for line in table[1:]] == [
        "moving out      10.0 GiB  14.0 GiB",
        "on GPU          40.0 GiB  0 B",
        "on GPU          0 B       0 B  <- this kernel",
        "in host memory  0 B       20.0 GiB",
    ]


def test_kiwi_status_says_the_gpus_memory_and_what_a_kernel_waits_for() -> None:
    lines = StatusTable(MEMORY).text().splitlines()
    assert ("GPU 0 memory: 50.0 GiB of 80.0 GiB on the GPU, 34.0 GiB of 64.0 GiB in host memory"
            in lines)
    assert "nbC.ipynb is waiting for nbA.ipynb to move 24.0 GiB to host memory" in lines


def test_kiwi_status_in_a_notebook_has_the_memory_columns_too() -> None:
    html = StatusTable(MEMORY, me="c3")._repr_html_()
    assert "<th>memory</th><th>on GPU</th><th>in host</th>" in html
    assert "<td>moving out</td><td>10.0 GiB</td><td>14.0 GiB</td>" in html
    assert "waiting for nbA.ipynb to move 24.0 GiB to host memory" in html


def test_a_document_without_memory_keys_reads_as_before() -> None:
    for text in (format_status(PLAIN), StatusTable(PLAIN).text(), StatusTable(PLAIN)._repr_html_()):
        for words in ("on GPU", "in host", "host memory", "moving", "MEMORY"):
            assert words not in text
    assert StatusTable(PLAIN).columns[-1] == "evict"


def test_the_waiting_line_says_what_it_waits_for() -> None:
    assert describe_wait(MEMORY, "c3", 3.4) == (
        "kiwi: waiting for the GPU (3 s) · position 1 of 1 in the queue · waiting for nbA.ipynb "
        "to move 24.0 GiB to host memory · held by nbB.ipynb, 27 s left in its quantum")


def test_a_kernel_waiting_for_nothing_in_particular_has_no_such_words_in_its_line() -> None:
    assert "to move" not in describe_wait(PLAIN, "c3", 3.4)


class Counting:
    """A status source that counts how often it is asked."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self.asked = 0

    def __call__(self) -> dict[str, Any]:
        self.asked += 1
        return self.document


def test_the_waiting_line_follows_a_move_of_memory_at_every_look() -> None:
    """What the kernel waits for changes as the other kernel's memory moves, and no position
    event says so: while the document says it waits for a move, every look asks again."""
    status = Counting(MEMORY)
    view = WaitView(status, lambda: Place(1, live=True))
    for waited in range(3):
        assert "to move 24.0 GiB" in view.text("c3", waited)
    assert status.asked == 3


def test_the_waiting_line_asks_once_while_nothing_can_change_without_an_event() -> None:
    """Second in the queue of a memory-keeping daemon, waiting for nothing: its position event
    will come first, as before."""
    document = {**MEMORY, "clients": [c if c["id"] != "c3" else {**c, "waiting_for": None,
                                                                  "queue_position": 2}
                                      for c in MEMORY["clients"]]}
    status = Counting(document)
    view = WaitView(status, lambda: Place(2, live=True))
    for waited in range(3):
        view.text("c3", waited)
    assert status.asked == 1


@pytest.mark.parametrize("action, words", [
    ("evict", "waiting for nbA.ipynb to move 24.0 GiB to host memory"),
    ("checkpoint", "waiting for nbA.ipynb to be checkpointed (24.0 GiB to host memory)"),
    ("restore", "waiting for nbA.ipynb to move 24.0 GiB back onto the GPU"),
    ("spill", "waiting for nbA.ipynb to move 24.0 GiB to disk (the host memory budget is full)"),
])
def test_each_action_a_kernel_may_wait_for_in_words(action: str, words: str) -> None:
    waiter = {"waiting_for": {"client": "c1", "name": "nbA.ipynb", "bytes": 24 * 2**30,
                              "action": action}}
    assert waiting_for_words(waiter, MEMORY) == words


def test_a_kernel_waited_for_is_named_as_the_document_names_it_else_as_the_scheduler_did() -> None:
    waiter = {"waiting_for": {"client": "c9", "name": "gone.ipynb", "bytes": 2**30,
                              "action": "evict"}}
    assert waiting_for_words(waiter, MEMORY) == "waiting for gone.ipynb to move 1.0 GiB to " \
                                                "host memory"


def test_one_byte_formatter_for_every_text_view() -> None:
    assert [human_bytes(n) for n in (None, 0, 512, 24 * 2**30)] == \
        ["unknown", "0 B", "512 B", "24.0 GiB"]
