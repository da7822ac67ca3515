"""The panel shows where each kernel's memory is, in real headless Chromium: the GPU's memory as
one bar split by kernel, each part in the colour the panel gives that kernel everywhere, the
totals against the GPU's capacity and the host budget, each kernel's memory and residency, and
what a waiting kernel waits for.

The status document is tests/status_fixtures.py's memory sample (made by the daemon's
build_status, its memory keys laid on as a memory-keeping scheduler lays them), served to the
page in place of the server's answers: the scheduler that fills these keys (issue 31) is built
beside this panel. Everything else is real: JupyterLab, the Kiwi extension as installed, and
the panel's own requests.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from labserver import ARTIFACTS, LabServer
from status_fixtures import MEMORY_PANEL_NAMES, memory_status

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PANEL_TAB = 'li.lm-TabBar-tab[data-id="jp-kiwi-panel"]'
PANEL = "#jp-kiwi-panel"
GiB = 2**30


def serve_memory_sample(page: Any) -> None:
    """Answer the panel's status requests with the memory sample, as the server answers a
    daemon that pushes no changes (the panel asks again at its refresh rate)."""
    document = {"reachable": True, **memory_status(MEMORY_PANEL_NAMES), "pushed": False}
    body = json.dumps(document)
    page.route("**/kiwi/api/status*", lambda route: route.fulfill(
        status=200, content_type="application/json", body=body))


@pytest.fixture
def memory_page(browser: Any, lab: LabServer) -> Any:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    serve_memory_sample(page)
    page.goto(lab.url("lab") + "&reset")
    page.wait_for_selector(".jp-Launcher", timeout=90_000)
    page.click(PANEL_TAB)
    page.locator(f"{PANEL} .jp-Kiwi-residentBar").wait_for(timeout=30_000)
    yield page
    page.close()


def test_the_gpus_memory_is_one_bar_split_by_kernel(memory_page: Any) -> None:
    bar = memory_page.locator(f"{PANEL} .jp-Kiwi-residentBar")
    # One bar for the GPU's memory: it takes the place of the used-of-total bar.
    assert memory_page.locator(f"{PANEL} .jp-Kiwi-gpu .jp-Kiwi-bar").count() == 1
    assert bar.count() == 1
    segments = bar.locator(".jp-Kiwi-residentSegment")
    # nbA has 10 GiB still on the GPU (moving out), nbB 40 GiB; nbC and nbD have none there.
    assert [segments.nth(i).get_attribute("title") for i in range(segments.count())] == [
        "nbA.ipynb: 10.0 GiB (moving out)", "nbB.ipynb: 40.0 GiB (on GPU)"]
    # Measured in one go: the panel redraws every second while it shows.
    whole, *widths = memory_page.evaluate(
        """panel => {
            const bar = document.querySelector(`${panel} .jp-Kiwi-residentBar`);
            return [bar, ...bar.querySelectorAll('.jp-Kiwi-residentSegment')].map(
                e => e.getBoundingClientRect().width);
        }""", PANEL)
    assert whole > 100
    assert widths == [pytest.approx(whole * 10 / 80, abs=1.5),
                      pytest.approx(whole * 40 / 80, abs=1.5)]
    ARTIFACTS.mkdir(exist_ok=True)
    # The panel's own node stays while its body is redrawn: shoot that (docs/lab-memory-bar.png).
    memory_page.locator(PANEL).screenshot(path=str(ARTIFACTS / "kiwi-panel-memory.png"))


def test_each_part_of_the_bar_has_its_kernels_colour(memory_page: Any) -> None:
    colours = memory_page.evaluate(
        """panel => {
            const colour = e => getComputedStyle(e).backgroundColor;
            const swatch = id => document.querySelector(
                `${panel} .jp-Kiwi-memoryItem[data-client-id="${id}"] .jp-Kiwi-swatch`);
            return [...document.querySelectorAll(`${panel} .jp-Kiwi-residentSegment`)].map(
                s => [s.dataset.clientId, colour(s), colour(swatch(s.dataset.clientId))]);
        }""", PANEL)
    assert [client for client, _, _ in colours] == ["c1", "c2"]
    assert all(segment == swatch for _, segment, swatch in colours), colours
    assert colours[0][1] != colours[1][1]


def test_the_panel_says_the_totals_and_each_kernels_memory_in_words(memory_page: Any) -> None:
    panel = memory_page.locator(PANEL)
    assert panel.locator(".jp-Kiwi-residentTotal").inner_text() == \
        "50.0 GiB of 80.0 GiB on the GPU"
    assert panel.locator(".jp-Kiwi-hostTotal").inner_text() == \
        "34.0 GiB of 64.0 GiB in host memory"
    items = panel.locator(".jp-Kiwi-memoryItem")
    rows = [(items.nth(i).locator(".jp-Kiwi-name").get_attribute("title"),
             items.nth(i).locator(".jp-Kiwi-residencyWord").inner_text(),
             items.nth(i).locator(".jp-Kiwi-memoryFigures").inner_text())
            for i in range(items.count())]
    assert rows == [
        ("nbA.ipynb", "moving out", "10.0 GiB on GPU, 14.0 GiB in host memory"),
        ("nbB.ipynb", "on GPU", "40.0 GiB on GPU, 0 B in host memory"),
        ("nbC.ipynb", "on GPU", "0 B on GPU, 0 B in host memory"),
        ("nbD.ipynb", "in host memory", "0 B on GPU, 20.0 GiB in host memory"),
    ]


def test_the_waiting_kernel_says_what_it_waits_for(memory_page: Any) -> None:
    panel = memory_page.locator(PANEL)
    words = "waiting for nbA.ipynb to move 24.0 GiB to host memory"
    waiting = panel.locator(".jp-Kiwi-memoryItem", has_text="nbC.ipynb")
    assert waiting.locator(".jp-Kiwi-waitingFor").inner_text() == words
    queued = panel.locator(".jp-Kiwi-queueItem")
    assert queued.count() == 1
    assert queued.locator(".jp-Kiwi-waitingFor").inner_text() == words
    assert panel.locator(".jp-Kiwi-waitingFor").count() == 2  # nobody else waits for memory
