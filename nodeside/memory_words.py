"""Memory in words for people: sizes, where a client's memory is, and what a waiting client
waits for, as every text view says them (``kiwictl status``, ``%kiwi status``, the waiting line).

The words are fixed with the status document's keys (docs/protocol.md, the status document):
``resident`` is "on GPU", ``evicting`` "moving out", ``evicted`` "in host memory" and
``restoring`` "moving in"; a tier (feature ``tiers``) ``gpu`` "on GPU", ``host`` "in host
memory", ``disk`` "on disk", ``moving`` "moving". The panel says the same in TypeScript
(labextension/src/format.ts).
A document from a daemon that keeps no resident memory has none of these keys, and every
function here then says nothing (None), so the views show what they showed before.
"""

from __future__ import annotations

from typing import Any

from nodeside.formats import size
from nodeside.names import who

#: What people read for each residency of the status document.
RESIDENCY_WORDS: dict[str, str] = {
    "resident": "on GPU",
    "evicting": "moving out",
    "evicted": "in host memory",
    "restoring": "moving in",
}


#: What people read for each tier of the status document (feature ``tiers``).
TIER_WORDS: dict[str, str] = {
    "gpu": "on GPU",
    "host": "in host memory",
    "disk": "on disk",
    "moving": "moving",
}


def human_bytes(nbytes: int | None) -> str:
    """Bytes as every view writes them (``nodeside.formats.size``): ``3.0 GiB``, ``512 B``,
    ``unknown`` for None."""
    return size(nbytes)


def memory_use_words(used: int | None, total: int | None) -> str:
    """A GPU's memory in use against its size, as every view says it: ``3.0 GiB of 80.0 GiB
    used``; ``kernels use 3.0 GiB (the GPU's size is not known here)`` without a size (no
    NVIDIA driver where the scheduler runs, and no size given to it); ``its size is not known
    here`` when nothing is (no figure stands in for one nobody measured)."""
    if total is None:
        if not used:
            return "its size is not known here"
        return f"kernels use {size(used)} (the GPU's size is not known here)"
    if used is None:
        return f"{size(total)}, its use not known here"
    return f"{size(used)} of {size(total)} used"


def keeps_memory(document: dict[str, Any]) -> bool:
    """Whether the document comes from a daemon that says where each client's memory is."""
    return any("residency" in c for c in document.get("clients", [])) or any(
        "resident_bytes" in g for g in document.get("gpus", []))


def residency_word(client: dict[str, Any]) -> str:
    """``on GPU``, ``moving out``, ``in host memory`` or ``moving in``; empty when not said."""
    residency = str(client.get("residency") or "")
    return RESIDENCY_WORDS.get(residency, residency)


def memory_place_word(client: dict[str, Any]) -> str:
    """Where a client's memory is in a word: its tier where the document says one (``on
    disk``), else its residency; with ``(move failed)`` while its last move to or from disk
    failed (the reason: ``tier_failed_words``)."""
    place = client.get("tier")
    if place is None:
        return residency_word(client)
    word = TIER_WORDS.get(str(place), str(place))
    return f"{word} (move failed)" if client.get("tier_failed") else word


def tier_failed_words(client: dict[str, Any]) -> str | None:
    """Why a client's last move between host memory and disk failed: ``could not move to or
    from disk: no space left``; None when none failed."""
    failed = client.get("tier_failed")
    return None if not failed else f"could not move to or from disk: {failed}"


def waiting_for_words(client: dict[str, Any], document: dict[str, Any] | None = None,
                      width: int | None = None, viewer: str | None = None) -> str | None:
    """What a waiting client waits for, ``waiting for nbA.ipynb to move 24.0 GiB to host
    memory``; None when it waits for nothing in particular. The other client is named as
    every view names it (``who``) when the document lists it, else by the name the scheduler
    gave."""
    waiting = client.get("waiting_for")
    if not waiting:
        return None
    other = next((c for c in (document or {}).get("clients", [])
                  if c.get("id") == waiting.get("client")), None)
    name = who(other, width, viewer) if other is not None else str(waiting.get("name") or "?")
    size = human_bytes(waiting.get("bytes"))
    action = waiting.get("action")
    if action == "checkpoint":
        return f"waiting for {name} to be checkpointed ({size} to host memory)"
    if action == "restore":
        return f"waiting for {name} to move {size} back onto the GPU"
    if action == "spill":
        return f"waiting for {name} to move {size} to disk (the host memory budget is full)"
    return f"waiting for {name} to move {size} to host memory"


def gpu_memory_words(gpu: dict[str, Any]) -> str | None:
    """A GPU's resident total against its capacity and the host RAM its evicted clients hold
    against the budget: ``27.0 GiB of 80.0 GiB on the GPU, 24.0 GiB of 64.0 GiB in host
    memory``; None for a document without them."""
    if "resident_bytes" not in gpu:
        return None
    capacity, budget = gpu.get("capacity"), gpu.get("host_budget")
    resident = human_bytes(gpu["resident_bytes"])
    on_gpu = (f"{resident} on the GPU (its size unknown)" if capacity is None
              else f"{resident} of {human_bytes(capacity)} on the GPU")
    host = human_bytes(gpu.get("host_bytes", 0))
    in_host = (f"{host} in host memory (no limit set)" if budget is None
               else f"{host} of {human_bytes(budget)} in host memory")
    tiers = ""
    if "spill_bytes" in gpu:  # feature ``tiers``
        tiers = (f" ({human_bytes(gpu.get('pinned_bytes', 0))} pinned), "
                 f"{human_bytes(gpu['spill_bytes'])} on disk")
    return f"{on_gpu}, {in_host}{tiers}"


def tier_words(client: dict[str, Any]) -> str | None:
    """Where a client's memory is by tier, with its bytes there: ``on GPU``, ``in host memory
    (24.0 GiB, 8.0 GiB pinned)``, ``on disk (24.0 GiB)``, ``moving``; None for a document
    without tiers. The panel writes the same (its examples: ``nodeside.formats``)."""
    tier = client.get("tier")
    if not tier:
        return None
    word = TIER_WORDS.get(str(tier), str(tier))
    if tier == "host":
        pinned = client.get("pinned_bytes") or 0
        held = human_bytes(client.get("host_bytes", 0))
        return f"{word} ({held}, {human_bytes(pinned)} pinned)" if pinned else f"{word} ({held})"
    if tier == "disk":
        return f"{word} ({human_bytes(client.get('disk_bytes', 0))})"
    return word
