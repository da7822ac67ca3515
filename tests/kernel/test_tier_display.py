"""Where each kernel's memory is by tier (issue 42 item 5), as ``%kiwi status``, its waiting line
and ``kiwictl status`` say it: on GPU, in host memory (and how much of it is pinned), on disk, or
moving between tiers; a failed move's reason; the GPU's host memory against the budget, what of
it is pinned and what its kernels spilled to disk. A document without the tier keys (a daemon
without the ``tiers`` feature) reads as it did before."""

from __future__ import annotations

from typing import Any

from status_fixtures import memory_status, tiered_status

from kiwi_jupyter.kernel.status_view import StatusTable
from kiwi_jupyter.kernel.wait_view import describe_wait
from nodeside.ctl import format_status
from nodeside.memory_words import TIER_WORDS, tier_failed_words, tier_words
from nodeside.protocol.document import TIERS

GiB = 2**30


def tiered(**c3: Any) -> dict[str, Any]:
    return tiered_status(**c3)


def test_every_tier_of_the_document_has_its_words() -> None:
    assert set(TIER_WORDS) == set(TIERS)


def test_a_kernel_in_host_memory_says_how_much_of_it_is_pinned() -> None:
    assert tier_words({"tier": "host", "host_bytes": 24 * GiB, "pinned_bytes": 8 * GiB}) == \
        "in host memory (24.0 GiB, 8.0 GiB pinned)"
    assert tier_words({"tier": "host", "host_bytes": 24 * GiB, "pinned_bytes": 0}) == \
        "in host memory (24.0 GiB)"
    assert tier_words({"tier": "disk", "disk_bytes": 3 * GiB}) == "on disk (3.0 GiB)"
    assert tier_words({"residency": "evicted"}) is None


def test_kiwi_status_shows_each_kernels_tier_and_its_bytes_on_disk() -> None:
    lines = StatusTable(tiered(), me="c3").text().splitlines()
    table = lines[lines.index("") + 1:]
    assert table[0].endswith("memory   on GPU    in host   on disk")
    assert [line[line.index("managed") + 9:] for line in table[1:]] == [
        "moving   10.0 GiB  14.0 GiB  0 B",
        "on GPU   40.0 GiB  0 B       0 B",
        "on GPU   0 B       0 B       0 B  <- this kernel",
        "on disk  0 B       0 B       20.0 GiB",
    ]


def test_the_gpus_host_memory_says_what_is_pinned_and_what_is_on_disk() -> None:
    line = ("50.0 GiB of 80.0 GiB on the GPU, 14.0 GiB of 64.0 GiB in host memory (14.0 GiB "
            "pinned), 20.0 GiB on disk")
    assert f"GPU 0 memory: {line}" in StatusTable(tiered()).text().splitlines()
    assert f"  memory: {line}" in format_status(tiered()).splitlines()


def test_a_failed_move_is_said_with_its_reason() -> None:
    document = tiered(tier="host", host_bytes=6 * GiB, tier_failed="no space left on the disk")
    words = "could not move to or from disk: no space left on the disk"
    assert tier_failed_words(document["clients"][2]) == words
    assert f"nbC.ipynb: {words}" in StatusTable(document).text().splitlines()
    assert describe_wait(document, "c3", 3.4).split(" · ")[2:4] == [
        "waiting for nbA.ipynb to move 24.0 GiB to host memory",
        "its memory is in host memory (6.0 GiB)"] and words in describe_wait(document, "c3", 3.4)


def test_the_waiting_line_says_where_the_kernels_memory_is_until_it_is_on_the_gpu() -> None:
    on_disk = tiered(tier="disk", disk_bytes=12 * GiB)
    assert "its memory is on disk (12.0 GiB)" in describe_wait(on_disk, "c3", 1.0).split(" · ")
    assert "its memory is" not in describe_wait(tiered(), "c3", 1.0)


def test_a_document_without_tier_keys_reads_as_before() -> None:
    plain = memory_status()
    assert StatusTable(plain).columns[-1] == "in host"
    for text in (StatusTable(plain).text(), format_status(plain), describe_wait(plain, "c3", 1)):
        assert "on disk" not in text and "pinned" not in text
