"""``GET kiwi/api/nvml``: the GPUs' memory used and utilization as NVML reads them on the
server's machine, and a plain "no" with the reason where NVML is not there."""

from __future__ import annotations

import json
from typing import Any

import pytest
from browser.labserver import LabServer


def nvml_finds_a_gpu() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetCount() > 0
    except Exception:
        return False


@pytest.mark.skipif(nvml_finds_a_gpu(), reason="this machine has NVML and a GPU")
async def test_without_nvml_the_answer_is_no_and_why(jp_fetch: Any) -> None:
    response = await jp_fetch("kiwi", "api", "nvml")
    reading = json.loads(response.body)
    assert reading["nvml"] is False
    assert reading["reason"]  # pynvml's own words: the library was not found, or no GPU
    assert "gpus" not in reading


@pytest.mark.slow
def test_with_nvml_it_gives_each_gpus_memory_and_utilization() -> None:
    lab = LabServer("--KiwiExtension.tq=120", fake_nvml=True,
                    env={"FAKE_NVML_USED": str(6 << 30), "FAKE_NVML_UTILIZATION": "37"}).start()
    try:
        reading = lab.api("GET", "kiwi/api/nvml")
    finally:
        lab.stop()
    assert reading == {"nvml": True, "gpus": [{
        "index": 0, "name": "Fake GPU (tests)",
        "uuid": "GPU-00000000-fake-0000-0000-000000000000",
        "memory_used": 6 << 30, "memory_total": 16 << 30,
        "utilization": 37, "memory_utilization": 12}]}
