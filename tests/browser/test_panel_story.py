"""The panel and the status bar tell one story, in real headless Chromium: what the status bar
says with no notebook in focus, a holder history that every tab and every reload shows alike,
colours and names that keep two notebooks apart, pools and memory in plain words, and NVML's
figures where the server's machine has NVML (here a stand-in library, tests/browser/fake_nvml.c).

One server for the module: two notebooks named like the demo's took turns before any page was
loaded (the demo held and gave the GPU back; the partner holds now and the demo waits again).
Each test opens its own pages on it."""

from __future__ import annotations

import colorsys
import re
from collections.abc import Iterator
from typing import Any

import pytest
from labserver import ARTIFACTS, LabServer, hold_gpu_code, run_cell

pytestmark = [pytest.mark.browser, pytest.mark.slow]

DEMO, PARTNER = "kiwi-demo.ipynb", "kiwi-demo-partner.ipynb"
PANEL_TAB = 'li.lm-TabBar-tab[data-id="jp-kiwi-panel"]'
PANEL = "#jp-kiwi-panel"
STATUS_ITEM = ".jp-Kiwi-statusItem"


@pytest.fixture(scope="module")
def turns_taken(browser: Any) -> Iterator[LabServer]:
    """The server after the turns: DEMO held and released, PARTNER holds, DEMO waits."""
    lab = LabServer("--KiwiExtension.tq=120", notebooks=(DEMO, PARTNER), fake_nvml=True).start()
    clients = []
    try:
        demo, partner = lab.start_session(DEMO), lab.start_session(PARTNER)
        clients = [lab.kernel_client(demo), lab.kernel_client(partner)]
        run_cell(clients[0], hold_gpu_code(demo, wait=True))
        run_cell(clients[0], "kiwi.release()")
        run_cell(clients[1], hold_gpu_code(partner, wait=True))
        run_cell(clients[0], "import threading\n"
                             "threading.Thread(target=kiwi.acquire, kwargs={'timeout': 300},"
                             " daemon=True).start()")
        yield lab
    finally:
        for client in clients:
            client.stop_channels()
        lab.stop()


def open_launcher_with_panel(browser: Any, lab: LabServer) -> Any:
    """A page on JupyterLab's Launcher (no notebook, no kernel in focus), the panel open."""
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    # `reset`: a fresh workspace, so the panel is closed however the last page left it.
    page.goto(lab.url("lab") + "&reset")
    page.wait_for_selector(".jp-Launcher", timeout=90_000)
    page.click(PANEL_TAB)
    page.locator(f"{PANEL} .jp-Kiwi-holderName").wait_for(timeout=30_000)
    page.locator(f"{PANEL} .jp-Kiwi-timelineItem").nth(1).wait_for(timeout=30_000)
    return page


def timeline(page: Any) -> list[str]:
    return page.locator(f"{PANEL} .jp-Kiwi-timelineItem .jp-Kiwi-name").evaluate_all(
        "names => names.map(n => n.title)")


def test_the_status_bar_names_the_holder_with_a_launcher_in_focus(
        browser: Any, turns_taken: LabServer) -> None:
    page = open_launcher_with_panel(browser, turns_taken)
    try:
        page.wait_for_function(
            f"document.querySelector('{STATUS_ITEM}').textContent"
            f" === 'GPU: held by {PARTNER} · 1 waiting'", timeout=20_000)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "kiwi-launcher-status-bar.png"))
    finally:
        page.close()


def test_every_tab_and_every_reload_shows_the_turns_taken_before_it_was_opened(
        browser: Any, turns_taken: LabServer) -> None:
    first = open_launcher_with_panel(browser, turns_taken)
    second = open_launcher_with_panel(browser, turns_taken)
    try:
        # Newest first: the partner (holding now), then the demo's turn that ended before
        # either page existed.
        assert timeline(first) == [PARTNER, DEMO]
        assert timeline(second) == timeline(first)
        first.reload()  # the workspace keeps the panel open
        first.locator(f"{PANEL} .jp-Kiwi-timelineItem").nth(1).wait_for(timeout=90_000)
        assert timeline(first) == [PARTNER, DEMO]
    finally:
        first.close()
        second.close()


def test_two_notebooks_get_colours_far_apart_the_same_in_every_view(
        browser: Any, turns_taken: LabServer) -> None:
    page = open_launcher_with_panel(browser, turns_taken)
    try:
        # Read in one go: the panel redraws each second, and a swatch read from a row the
        # redraw replaced has no style.
        swatches = page.evaluate(
            """panel => [...document.querySelectorAll(`${panel} [data-client-id]`)].map(e =>
                [e.className, e.dataset.clientId,
                 getComputedStyle(e.querySelector('.jp-Kiwi-swatch')).backgroundColor])""",
            PANEL)
        timeline = {client: hue_of(colour) for kind, client, colour in swatches
                    if "jp-Kiwi-timelineItem" in kind}
        assert len(timeline) == 2, swatches
        first, second = timeline.values()
        assert min(abs(first - second), 360 - abs(first - second)) >= 30, swatches
        # The holder and the queue show each client in the colour the timeline gives it.
        elsewhere = [(client, hue_of(colour)) for kind, client, colour in swatches
                     if "jp-Kiwi-timelineItem" not in kind]
        assert len(elsewhere) == 2, swatches
        for client, hue in elsewhere:
            assert hue == timeline[client], swatches
    finally:
        page.close()


def test_the_two_demo_names_show_whole_on_the_timeline_at_the_default_width(
        browser: Any, turns_taken: LabServer) -> None:
    page = open_launcher_with_panel(browser, turns_taken)
    try:
        # At the sidebar's default width a timeline row (swatch, name, "holding, N s") puts its
        # duration below rather than cut a name that fits the sidebar. For each row: is the
        # name's head cut, and is the word that tells it from the other (partner, demo) on
        # screen? (A name too long even alone keeps its tail: test_panel_in_chromium.py.)
        rows = page.evaluate(
            """panel => [...document.querySelectorAll(
                    `${panel} .jp-Kiwi-timelineItem .jp-Kiwi-name`)].map(n => {
                const head = n.querySelector('.jp-Kiwi-nameHead');
                const tail = n.querySelector('.jp-Kiwi-nameTail');
                const word = n.title.includes('partner') ? 'partner' : 'demo';
                const text = tail.firstChild;
                const at = text ? text.data.indexOf(word) : -1;
                let shown = false;
                if (at >= 0) {
                    const range = document.createRange();
                    range.setStart(text, at);
                    range.setEnd(text, at + word.length);
                    shown = range.getBoundingClientRect().right
                            <= tail.getBoundingClientRect().right + 0.5;
                }
                return {title: n.title, word, shown,
                        cut: head.scrollWidth > head.clientWidth};
            })""", PANEL)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "kiwi-panel-two-names.png"))
    finally:
        page.close()
    assert [r["title"] for r in rows] == [PARTNER, DEMO]  # whole on hover
    assert not any(r["cut"] for r in rows), rows
    assert all(r["shown"] for r in rows), rows


def test_the_pool_bar_says_in_words_what_it_shows(browser: Any, turns_taken: LabServer) -> None:
    page = open_launcher_with_panel(browser, turns_taken)
    try:
        bar = page.locator(f"{PANEL} .jp-Kiwi-shareBar").first
        title = bar.get_attribute("title")
        legend = page.locator(f"{PANEL} .jp-Kiwi-legend").inner_text()
        line = page.locator(f"{PANEL} .jp-Kiwi-pool .jp-Kiwi-detail").first.inner_text()
    finally:
        page.close()
    # Both notebooks are in the default pool, which the daemon says is below its guarantee
    # while they contend (guarantee 1.0): the orange bar says so in words too.
    below = "below its guarantee: it goes first"
    assert re.fullmatch(rf"default: using \d+% of the GPU; guaranteed 100%; no maximum(; {below})?",
                        title), title
    assert re.fullmatch(rf"using \d+% of the GPU · guaranteed 100% · no maximum( · {below})?",
                        line), line
    assert "guaranteed" in legend


def test_memory_is_said_without_daemon_flags_and_nvml_figures_are_shown(
        browser: Any, turns_taken: LabServer) -> None:
    page = open_launcher_with_panel(browser, turns_taken)
    try:
        nvml = page.locator(f"{PANEL} .jp-Kiwi-nvml")
        nvml.wait_for(timeout=20_000)
        memory = nvml.locator(".jp-Kiwi-nvmlMemory").inner_text()
        utilization = nvml.locator(".jp-Kiwi-nvmlUtilization").inner_text()
        text = page.locator(PANEL).inner_text()
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "kiwi-panel-nvml.png"))
    finally:
        page.close()
    assert (memory, utilization) == ("6.0 GiB of 16.0 GiB", "37%")
    assert "--gpu-memory" not in text and "NVML, no" not in text


def hue_of(css_colour: str) -> float:
    """The hue in degrees of an `rgb(r, g, b)` colour."""
    numbers = re.findall(r"[\d.]+", css_colour)
    assert len(numbers) >= 3, f"not a colour: {css_colour!r}"
    r, g, b = (float(v) / 255 for v in numbers[:3])
    return round(colorsys.rgb_to_hls(r, g, b)[0] * 360) % 360
