"""The stream-ordered allocation benchmark runs to its report: each way against the floor of the
same run, and, with callgrind, the driver calls and instructions. Tiny settings: this shows it
still runs and says what it says, never how fast anything is."""

from __future__ import annotations

import re
import shutil

import pytest

from benchmarks.shim import stream_alloc


def rows(text: str) -> dict[str, list[str]]:
    return {cells[0]: cells[1:] for line in text.splitlines() if line.startswith("| ")
            for cells in [[c.strip() for c in line.strip("|").split("|")]]}


def test_each_way_is_reported_against_the_floor() -> None:
    table = rows(stream_alloc.main(["--steps", "2"]))
    assert set(stream_alloc.WAYS) <= table.keys()
    for way in stream_alloc.WAYS:
        floor, shim, ratio, held = table[way]
        assert float(floor) > 0 and float(shim) > 0 and float(ratio) > 0 and float(held) >= 1


@pytest.mark.skipif(not shutil.which("valgrind"), reason="no valgrind")
def test_callgrind_counts_no_vmm_call_once_the_stream_reuses_its_memory() -> None:
    text = stream_alloc.main(["--steps", "2", "--callgrind"])
    header = next(line for line in text.splitlines() if line.startswith("| way"))
    assert re.search(r"driver calls \| of them VMM \| shim instructions", header)
    for way in ("keeps up, fixed", "behind, fixed"):
        vmm_calls = rows(text)[way][5]
        assert float(vmm_calls) == 0, way
