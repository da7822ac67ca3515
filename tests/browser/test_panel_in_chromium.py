"""End to end: the Kiwi GPU panel in real headless Chromium while two kernels contend."""

from __future__ import annotations

from typing import Any

import pytest
from labserver import ARTIFACTS, LabServer, hold_gpu_code, run_cell

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PANEL_TAB = 'li.lm-TabBar-tab[data-id="jp-kiwi-panel"]'
PANEL = "#jp-kiwi-panel"
STATUS_ITEM = ".jp-Kiwi-statusItem"


def open_notebook_with_panel(page: Any, lab: LabServer, path: str) -> str:
    """Open ``path`` in JupyterLab, open the Kiwi panel; return the notebook's kernel id."""
    page.goto(lab.url(f"lab/tree/{path}"))
    page.wait_for_selector(".jp-NotebookPanel", timeout=90_000)
    page.click(PANEL_TAB)
    page.wait_for_selector(f"{PANEL} .jp-Kiwi-scheduler", timeout=30_000)
    kernel_id = None
    for _ in range(300):
        kernel_id = lab.kernel_of(path)
        if kernel_id:
            break
        page.wait_for_timeout(100)
    assert kernel_id, f"no kernel for {path}"
    return kernel_id


def test_panel_follows_two_contending_kernels_and_lets_an_admin_change_the_mode(
    browser: Any, lab: LabServer
) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    kernel_a = open_notebook_with_panel(page, lab, "a.ipynb")
    panel = page.locator(PANEL)
    status_item = page.locator(STATUS_ITEM)
    panel.get_by_text("Nobody holds this GPU.").wait_for()
    assert panel.locator(".jp-Kiwi-mode").inner_text() == "ON"
    assert status_item.inner_text() == "GPU: idle"
    headings = panel.locator(".jp-Kiwi-sectionTitle").all_inner_texts()
    assert headings == ["Scheduler", "GPU 0 · logical GPU", "Pools", "Recent holders"]
    # No NVML and no size given here, and no kernel reports a working set: nothing true to
    # say about memory, so no memory line (and no daemon flag named to a notebook user).
    assert panel.locator(".jp-Kiwi-memory").count() == 0
    assert "--gpu-memory" not in panel.inner_text()

    # Notebook b (no tab open) takes the GPU; then this notebook's kernel asks and waits.
    kernel_b = lab.start_session("b.ipynb")
    client_b = lab.kernel_client(kernel_b)
    client_a = lab.kernel_client(kernel_a)
    try:
        run_cell(client_b, hold_gpu_code(kernel_b, wait=True))
        panel.locator(".jp-Kiwi-holderName", has_text="b.ipynb").wait_for()
        assert panel.locator(".jp-Kiwi-memory").count() == 0
        run_cell(client_a, hold_gpu_code(kernel_a, wait=False))

        mine = panel.locator(".jp-Kiwi-queueItem.jp-Kiwi-mine")
        mine.wait_for()
        assert "#1" in mine.inner_text() and "a.ipynb" in mine.inner_text()
        page.wait_for_function(
            f"document.querySelector('{STATUS_ITEM}').textContent === 'GPU: waiting #1'"
        )

        # b releases: the holder changes to this notebook, the queue empties.
        run_cell(client_b, "kiwi.release()")
        panel.locator(".jp-Kiwi-holderName.jp-Kiwi-mine", has_text="a.ipynb").wait_for()
        page.wait_for_function(
            f"document.querySelector('{STATUS_ITEM}').textContent === 'GPU: holding'"
        )
        assert panel.locator(".jp-Kiwi-queueItem").count() == 0
        # At the sidebar's default width no label breaks inside itself: the badge stays whole,
        # and a pool's line breaks only between its figures.
        assert panel.locator(".jp-Kiwi-figure").count() >= 3
        split = page.evaluate(
            "() => [...document.querySelectorAll('#jp-kiwi-panel .jp-Kiwi-badge,"
            " #jp-kiwi-panel .jp-Kiwi-figure')]"
            ".filter(e => e.getClientRects().length !== 1).map(e => e.textContent)")
        assert split == []
        timeline = panel.locator(".jp-Kiwi-timelineItem")
        assert timeline.count() == 2
        assert "a.ipynb" in timeline.nth(0).inner_text()  # newest first
        assert "b.ipynb" in timeline.nth(1).inner_text()

        # As an admin (the default authorizer lets the token's user write), turn the mode off.
        controls = panel.locator(".jp-Kiwi-controls")
        assert controls.is_visible()
        # The mode is every notebook's on the node: choosing sends nothing, Set asks first.
        controls.locator(".jp-Kiwi-modeSelect").select_option("off")
        controls.locator(".jp-Kiwi-modeButton").click()
        dialog = page.locator(".jp-Dialog")
        dialog.get_by_text("for every notebook on this node").wait_for()
        dialog.locator(".jp-Dialog-button.jp-mod-reject").click()
        dialog.wait_for(state="detached")
        assert lab.kiwi_status()["mode"] == "on"  # cancelled: nothing was sent
        controls.locator(".jp-Kiwi-modeSelect").select_option("off")
        controls.locator(".jp-Kiwi-modeButton").click()
        dialog.locator(".jp-Dialog-button.jp-mod-accept").click()
        panel.locator(".jp-Kiwi-mode", has_text="OFF").wait_for()
        assert lab.kiwi_status()["mode"] == "off"

        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "kiwi-panel.png"))
    finally:
        client_a.stop_channels()
        client_b.stop_channels()
        page.close()


def test_panel_says_plainly_when_the_scheduler_cannot_be_reached(browser: Any) -> None:
    lab = LabServer("--KiwiExtension.embedded_scheduler=False").start()
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    try:
        page.goto(lab.url("lab"))
        page.wait_for_selector(PANEL_TAB, timeout=90_000)
        page.click(PANEL_TAB)
        box = page.locator(f"{PANEL} .jp-Kiwi-unreachable")
        box.wait_for()
        assert "cannot be reached" in box.inner_text()
        assert "no-daemon.sock" in box.inner_text()
        assert page.locator(STATUS_ITEM).inner_text() == "GPU: scheduler unreachable"
        assert not page.locator(f"{PANEL} .jp-Kiwi-controls").is_visible()
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "kiwi-panel-unreachable.png"))
    finally:
        page.close()
        lab.stop()


def test_a_long_notebook_name_is_cut_with_an_ellipsis_and_whole_in_its_tooltip(
    browser: Any,
) -> None:
    notebook = "forecasting-regional-electricity-demand-for-the-coming-winter-season.ipynb"
    lab = LabServer("--KiwiExtension.tq=120", notebooks=(notebook,)).start()
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    client = None
    try:
        kernel_id = open_notebook_with_panel(page, lab, notebook)
        client = lab.kernel_client(kernel_id)
        run_cell(client, hold_gpu_code(kernel_id, wait=True))
        # Once the panel knows the kernel's notebook (its session), not before; laid out in the
        # sidebar, measured in one step in the page (the panel redraws each second, and a row
        # just drawn may not be measured yet, or one measured between two steps be detached):
        # the name's head is cut, its tail (the name's end) kept.
        cut, overflow, title, lines, tail = page.wait_for_function(
            f"() => {{ const e = document.querySelector("
            f"\"{PANEL} .jp-Kiwi-holderName .jp-Kiwi-name[title='{notebook}']\");"
            " const h = e && e.querySelector('.jp-Kiwi-nameHead');"
            " if (!h || !h.isConnected || h.clientWidth === 0) return null;"
            " return [h.scrollWidth > h.clientWidth, getComputedStyle(h).textOverflow, e.title,"
            " e.getClientRects().length, e.querySelector('.jp-Kiwi-nameTail').innerText]; }",
            timeout=20_000).json_value()
        assert cut, "the name fits the sidebar: this test needs a longer one"
        assert overflow == "ellipsis" and lines == 1  # cut on one line, and the cut shows
        assert notebook in title
        assert tail and notebook.endswith(tail)
        # On the timeline too the head is cut and the tail kept whole: where the tail and the
        # duration do not fit side by side, the duration goes to the line below. Measured in one
        # step in the page, on a row laid out (the redraw each second replaces the rows: one
        # measured between two steps may be detached, and measures 0).
        shown = page.wait_for_function(
            f"() => {{ const e = document.querySelector('{PANEL} .jp-Kiwi-timelineItem');"
            " const t = e && e.querySelector('.jp-Kiwi-nameTail');"
            " if (!t || !t.isConnected || t.clientWidth === 0) return null;"
            " const n = t.parentElement.getBoundingClientRect(), r = t.getBoundingClientRect();"
            " return [t.scrollWidth <= t.clientWidth && r.right <= n.right + 0.5"
            " && n.right <= e.getBoundingClientRect().right + 0.5, t.innerText]; }",
            timeout=20_000).json_value()
        assert shown[0] and notebook.endswith(shown[1]), f"the timeline cut the tail: {shown}"
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "kiwi-panel-long-name.png"))
    finally:
        if client is not None:
            client.stop_channels()
        page.close()
        lab.stop()


def test_a_grant_shows_in_the_panel_without_waiting_for_the_refresh_interval(
    browser: Any,
) -> None:
    # A minute between polls: a holder that shows within seconds came by the long-poll.
    lab = LabServer("--KiwiExtension.tq=120", panel_settings={"refreshRate": 60_000}).start()
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    client = None
    try:
        kernel_a = open_notebook_with_panel(page, lab, "a.ipynb")
        panel = page.locator(PANEL)
        panel.get_by_text("Nobody holds this GPU.").wait_for()
        client = lab.kernel_client(kernel_a)
        run_cell(client, hold_gpu_code(kernel_a, wait=True))
        panel.locator(".jp-Kiwi-holderName.jp-Kiwi-mine", has_text="a.ipynb").wait_for(
            timeout=20_000)
        page.wait_for_function(
            f"document.querySelector('{STATUS_ITEM}').textContent === 'GPU: holding'",
            timeout=20_000)
        run_cell(client, "kiwi.release()")
        panel.get_by_text("Nobody holds this GPU.").wait_for(timeout=20_000)
    finally:
        if client is not None:
            client.stop_channels()
        page.close()
        lab.stop()
