"""The two demo notebooks (binder/) run from two browser tabs, as README tells a new user to:
each tab's status bar and panel follow the turns, and screenshots of the panel are kept in
test-artifacts/ (docs/lab.md shows two of them).

As `make lab` runs them on a machine without a GPU (the stand-in GPU, a scheduler told the GPU
has 12 MiB: one notebook's 8 MiB fit, two do not), with shorter bursts (10 s against a TQ of 2 s
instead of 15 s against 5 s) and a faster modelled link: one notebook holds, the other waits with
its place shown, a quantum ends during a burst and the GPU changes hands, and the memory of the
one giving it back moves to host memory, as the panel shows."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from labserver import ARTIFACTS, LabServer
from support import scaled

pytestmark = [pytest.mark.browser, pytest.mark.slow]

BINDER = Path(__file__).resolve().parents[2] / "binder"
DEMO, PARTNER = "kiwi-demo.ipynb", "kiwi-demo-partner.ipynb"
PANEL_TAB = 'li.lm-TabBar-tab[data-id="jp-kiwi-panel"]'
PANEL = "#jp-kiwi-panel"
STATUS_ITEM = ".jp-Kiwi-statusItem"


def open_with_panel(browser: Any, lab: LabServer, path: str) -> Any:
    page = browser.new_page(viewport={"width": 1500, "height": 950})
    # `reset`: a fresh workspace, so the panel is closed however the other tab left it.
    page.goto(lab.url(f"lab/tree/{path}") + "&reset")
    page.wait_for_selector(".jp-NotebookPanel", timeout=90_000)
    page.click(PANEL_TAB)
    page.wait_for_selector(f"{PANEL} .jp-Kiwi-scheduler", timeout=30_000)
    page.wait_for_function(
        f"document.querySelector('{STATUS_ITEM}').textContent.startsWith('GPU: ')",
        timeout=90_000)
    # The notebook's Kiwi kernel is up and connected: JupyterLab's own kernel status says idle.
    # (Cells run before then are dropped without a word, and the status item above says the
    # GPU's state whether or not this tab has a kernel yet.)
    page.wait_for_function(
        "[...document.querySelectorAll('.jp-StatusBar-TextItem')].some(e =>"
        " /\\(Kiwi vGPU\\) \\| Idle$/.test(e.textContent.trim()))", timeout=120_000)
    return page


def cut_names(page: Any) -> list[str]:
    """The names cut in the panel's holder, queue, memory and timeline rows, measured in one
    step in the page (the panel redraws each second; a row measured between two steps may be
    detached)."""
    return page.wait_for_function(
        f"() => {{ const names = [...document.querySelectorAll('{PANEL} .jp-Kiwi-holderName"
        f" .jp-Kiwi-name, {PANEL} .jp-Kiwi-queueItem .jp-Kiwi-name,"
        f" {PANEL} .jp-Kiwi-memoryItem .jp-Kiwi-name, {PANEL} .jp-Kiwi-timelineItem .jp-Kiwi-name"
        "')];"
        " if (names.length < 3 || names.some(n => !n.isConnected || n.clientWidth === 0))"
        " return null;"
        " const row = n => n.parentElement.getBoundingClientRect();"
        " return names.filter(n => [n, ...n.children].some(e => e.scrollWidth > e.clientWidth)"
        " || n.getBoundingClientRect().right > row(n).right + 0.5).map(n => n.title); }",
        timeout=20_000).json_value()


def run_all(page: Any) -> None:
    page.click(".jp-NotebookPanel .jp-Cell >> nth=0")
    page.click('li.lm-MenuBar-item:has-text("Run")')
    page.click('li.lm-Menu-item:has-text("Run All Cells")')


@pytest.mark.timeout(int(scaled(300)))  # two Kiwi kernels, two bursts of 10 s each
def test_the_two_demo_notebooks_take_turns_in_two_tabs(browser: Any) -> None:
    lab = LabServer("--KiwiExtension.tq=2", '--KiwiExtension.scheduler_args=["--gpu-memory",'
                    ' "12MiB"]', notebooks=(), env={"KIWI_DEMO_SECONDS": "10",
                                                    "KIWI_STANDIN_LINK": "16MiB"})
    for name in (DEMO, PARTNER):
        shutil.copy(BINDER / name, lab.root / name)
    lab.start()
    demo = partner = None
    try:
        demo = open_with_panel(browser, lab, DEMO)
        partner = open_with_panel(browser, lab, PARTNER)
        # The partner goes first and is inside its burst, holding, before the demo starts:
        # which kernel gets the GPU first is otherwise a race the story does not tell.
        run_all(partner)
        partner.locator(".jp-OutputArea-output", has_text="this kernel's mode is eager").wait_for(
            timeout=120_000)
        partner.wait_for_function(
            f"document.querySelector('{STATUS_ITEM}').textContent === 'GPU: holding'",
            timeout=60_000)
        run_all(demo)
        ARTIFACTS.mkdir(exist_ok=True)
        # One holds a burst, the other waits: the live line under the waiting cell, and the
        # waiting tab's status bar and panel, all say the same.
        demo.get_by_text("kiwi: waiting for the GPU").first.wait_for(timeout=120_000)
        demo.wait_for_function(
            f"document.querySelector('{STATUS_ITEM}').textContent === 'GPU: waiting #1'",
            timeout=30_000)
        demo.locator(f"{PANEL} .jp-Kiwi-queueItem.jp-Kiwi-mine").wait_for()
        demo.screenshot(path=str(ARTIFACTS / "kiwi-demo-waiting.png"))
        # At the sidebar's default width both notebooks' names are whole wherever they show:
        # badges and durations go to the next line rather than cut a name that fits.
        assert cut_names(demo) == []
        # Each notebook's memory is in the panel, in one bar of the GPU's 12 MiB.
        demo.locator(f"{PANEL} .jp-Kiwi-memoryItem").nth(1).wait_for(timeout=30_000)
        # The holder's quantum ends inside its burst: it gives the GPU back at its next
        # operation, its memory moves to host memory, and the GPU changes hands.
        partner.bring_to_front()
        partner.wait_for_function(
            f"document.querySelector('{STATUS_ITEM}').textContent.startsWith('GPU: waiting')",
            timeout=60_000)
        partner.locator(f"{PANEL} .jp-Kiwi-memoryItem.jp-Kiwi-mine",
                        has_text="in host memory").wait_for(timeout=60_000)
        partner.locator(f"{PANEL} .jp-Kiwi-timelineItem").nth(1).wait_for(timeout=30_000)
        partner.screenshot(path=str(ARTIFACTS / "kiwi-demo-handoff.png"))
        # The bursts end: each cell says it took turns.
        for page in (partner, demo):
            page.get_by_text("kiwi: this cell gave the GPU back").first.wait_for(
                timeout=120_000)
    finally:
        for page in (demo, partner):
            if page is not None:
                page.close()
        lab.stop()
