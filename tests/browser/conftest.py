"""Browser tests: real headless Chromium (/usr/bin/chromium, never downloaded) driving a real
`jupyter lab` with the Kiwi extension."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from labserver import CHROMIUM, CHROMIUM_ARGS, LabServer


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} not found: install it with `apt-get install -y chromium`")
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        yield browser
        browser.close()


@pytest.fixture
def lab() -> Iterator[LabServer]:
    """JupyterLab with the embedded scheduler and a TQ long enough that only the test's own
    releases change the holder."""
    server = LabServer("--KiwiExtension.tq=120").start()
    yield server
    server.stop()
