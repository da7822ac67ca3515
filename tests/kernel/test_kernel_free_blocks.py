"""Reading PyTorch's free blocks from its memory snapshot, shaped as PyTorch documents it
(``torch.cuda.memory._snapshot``: segments with their blocks)."""

from __future__ import annotations

from typing import Any

from kiwi_jupyter.kernel.free_blocks import torch_free_blocks

MiB = 1 << 20
BASE = 0x7F0000000000


def block(address: int, size: int, state: str) -> dict[str, Any]:
    return {"address": address, "size": size, "requested_size": size, "state": state,
            "frames": []}


def segment(address: int, blocks: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    total = sum(b["size"] for b in blocks)
    return {"device": 0, "address": address, "total_size": total, "stream": 0,
            "segment_type": "large", "segment_pool_id": (0, 0), "allocated_size": 0,
            "active_size": 0, "requested_size": 0, "is_expandable": False, "blocks": blocks,
            **extra}


def test_inactive_blocks_are_the_free_ones() -> None:
    seg = segment(BASE, [block(BASE, 4 * MiB, "active_allocated"),
                         block(BASE + 4 * MiB, 8 * MiB, "inactive"),
                         block(BASE + 12 * MiB, 4 * MiB, "active_awaiting_free"),
                         block(BASE + 16 * MiB, 16 * MiB, "inactive")])
    assert torch_free_blocks([seg]) == [(BASE + 4 * MiB, 8 * MiB), (BASE + 16 * MiB, 16 * MiB)]


def test_blocks_too_small_to_hold_a_whole_page_are_left_out() -> None:
    seg = segment(BASE, [block(BASE, 1 * MiB, "inactive"), block(BASE + MiB, MiB, "active")])
    assert torch_free_blocks([seg]) == []


def test_blocks_without_addresses_tile_their_segment_in_order() -> None:
    """PyTorch before 2.1: blocks carry no address."""
    blocks = [block(0, 4 * MiB, "active_allocated"), block(0, 6 * MiB, "inactive")]
    for b in blocks:
        del b["address"]
    assert torch_free_blocks([segment(BASE, blocks)]) == [(BASE + 4 * MiB, 6 * MiB)]


def test_cuda_graph_pools_and_expandable_segments_are_left_alone() -> None:
    graph_pool = segment(BASE, [block(BASE, 8 * MiB, "inactive")], segment_pool_id=(1, 0))
    expandable = segment(BASE + 8 * MiB, [block(BASE + 8 * MiB, 8 * MiB, "inactive")],
                         is_expandable=True)
    plain = segment(BASE + 16 * MiB, [block(BASE + 16 * MiB, 8 * MiB, "inactive")])
    assert torch_free_blocks([graph_pool, expandable, plain]) == [(BASE + 16 * MiB, 8 * MiB)]
