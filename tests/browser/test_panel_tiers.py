"""The panel shows where each kernel's memory is by tier, in real headless Chromium (issue 42):
each kernel's tier (on GPU, in host memory, on disk, moving between tiers) in the words every
view uses, a failed move's reason, and the GPU's pinned host memory and bytes on disk.

The status document is tests/status_fixtures.py's tiered sample, served to the page in place of
the server's answers (as test_panel_memory.py does): the daemon that fills these keys is built
beside this panel (tiers-core). Everything else is real: JupyterLab, the Kiwi extension as
installed, and the panel's own requests.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from labserver import LabServer
from status_fixtures import MEMORY_PANEL_NAMES, tiered_status

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PANEL_TAB = 'li.lm-TabBar-tab[data-id="jp-kiwi-panel"]'
PANEL = "#jp-kiwi-panel"
FAILED = "no space left on the disk"


@pytest.fixture
def tiers_page(browser: Any, lab: LabServer) -> Any:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    document = {"reachable": True, "pushed": False,
                **tiered_status(MEMORY_PANEL_NAMES, tier="host", host_bytes=6 * 2**30,
                                tier_failed=FAILED)}
    body = json.dumps(document)
    page.route("**/kiwi/api/status*", lambda route: route.fulfill(
        status=200, content_type="application/json", body=body))
    page.goto(lab.url("lab") + "&reset")
    page.wait_for_selector(".jp-Launcher", timeout=90_000)
    page.click(PANEL_TAB)
    page.locator(f"{PANEL} .jp-Kiwi-spillTotal").wait_for(timeout=30_000)
    yield page
    page.close()


def test_each_kernel_shows_its_tier_in_the_words_of_every_view(tiers_page: Any) -> None:
    # Read in one step in the page: the panel redraws every second while it shows.
    rows = tiers_page.evaluate(
        """panel => [...document.querySelectorAll(`${panel} .jp-Kiwi-memoryItem`)].map(item => [
            item.querySelector('.jp-Kiwi-name').getAttribute('title'),
            item.querySelector('.jp-Kiwi-tierWord').innerText,
            item.querySelector('.jp-Kiwi-tierFailed')?.innerText ?? null])""", PANEL)
    assert rows == [
        ["nbA.ipynb", "moving", None],
        ["nbB.ipynb", "on GPU", None],
        ["nbC.ipynb", "in host memory (6.0 GiB)",
         f"could not move to or from disk: {FAILED}"],
        ["nbD.ipynb", "on disk (20.0 GiB)", None],
    ]


def test_the_gpu_says_its_host_budget_pinned_memory_and_spill(tiers_page: Any) -> None:
    panel = tiers_page.locator(PANEL)
    assert panel.locator(".jp-Kiwi-hostTotal").inner_text() == \
        "14.0 GiB of 64.0 GiB in host memory"
    assert panel.locator(".jp-Kiwi-spillTotal").inner_text() == \
        "14.0 GiB pinned, 20.0 GiB on disk"
