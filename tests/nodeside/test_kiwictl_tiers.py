"""``kiwictl status`` with the ``tiers`` feature's keys: each kernel's tier (on disk, moving)
and its bytes on disk, a failed move's reason on a line of its own, and the GPU's pinned and
spilled bytes beside its host memory; a document without the keys reads as before."""

from __future__ import annotations

from status_fixtures import memory_status

from nodeside.ctl import format_status

GiB = 1 << 30


def tiered() -> dict:
    document = memory_status()
    document["gpus"][0].update({"pinned_bytes": 8 * GiB, "spill_bytes": 24 * GiB})
    for client in document["clients"]:
        client.update({"tier": "gpu", "disk_bytes": 0, "pinned_bytes": 0, "tier_failed": None})
    nbd = next(c for c in document["clients"] if c["id"] == "c4")
    nbd.update({"tier": "disk", "disk_bytes": 24 * GiB, "host_bytes": 0})
    nba = next(c for c in document["clients"] if c["id"] == "c1")
    nba.update({"tier": "host", "tier_failed": "spill_dir: no space left"})
    return document


def test_kiwictl_says_each_kernels_tier_and_the_bytes_it_has_on_disk() -> None:
    text = format_status(tiered())
    lines = text.splitlines()
    head = next(line for line in lines if line.startswith("CLIENT"))
    assert head.endswith("ON DISK")
    nbd = next(line for line in lines if line.startswith("nbD"))
    assert "on disk" in nbd and nbd.endswith("24.0 GiB")
    nba = lines.index(next(line for line in lines if line.startswith("nbA")))
    assert "in host memory (move failed)" in lines[nba]
    assert lines[nba + 1] == "  could not move to or from disk: spill_dir: no space left"
    assert "in host memory (8.0 GiB pinned), 24.0 GiB on disk" in text


def test_a_document_without_tier_keys_reads_as_before() -> None:
    text = format_status(memory_status())
    assert "ON DISK" not in text and "on disk" not in text and "pinned" not in text
