"""One fact, written one way in every view: a duration, a size and a client's name read the same
in kiwictl, ``%kiwi status`` (text and HTML), the waiting line, the daemon's log and the panel (in
real headless Chromium), each made by the one formatter for it (nodeside/formats.py,
nodeside/names.py; the panel's own copy is checked against their examples in Jest).

The document is tests/status_fixtures.py's memory sample, nbA.ipynb made another user's (ada) and
the rest the viewer's own, so a name shows its user exactly where the viewer is someone else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from labserver import LabServer
from status_fixtures import MEMORY_PANEL_NAMES, memory_status
from support import DaemonProcess, scaled

from kiwi_jupyter.kernel.status_view import StatusTable
from kiwi_jupyter.kernel.wait_view import describe_wait
from nodeside.ctl import format_status
from nodeside.formats import seconds, size
from nodeside.names import current_user, label

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PANEL_TAB = 'li.lm-TabBar-tab[data-id="jp-kiwi-panel"]'
PANEL = "#jp-kiwi-panel"
GiB = 2**30
ME = current_user() or "me"


def sample() -> dict[str, Any]:
    document = memory_status(MEMORY_PANEL_NAMES)
    for client in document["clients"]:
        client["user"] = "ada" if client["display_name"] == "nbA.ipynb" else ME
    return document


#: The facts, each written by its one formatter.
TQ = seconds(30.0)                     # "30 s"
LEFT = seconds(27.0)                   # the holder's quantum: "27 s"
MOVING = size(24 * GiB)                # what nbC waits for: "24.0 GiB"
OTHERS = label("k", "nbA.ipynb", "ada", ME)   # "nbA.ipynb (ada)"
MINE = label("k", "nbB.ipynb", ME, ME)        # "nbB.ipynb"


def text_views(document: dict[str, Any]) -> dict[str, str]:
    table = StatusTable(document, me="c2", viewer=ME)
    return {"kiwictl status": format_status(document),
            "%kiwi status": table.text(),
            "%kiwi status (HTML)": table._repr_html_(),
            "the waiting line": describe_wait(document, "c3", 3.0)}


def test_the_text_views_write_each_fact_alike() -> None:
    for view, text in text_views(sample()).items():
        if view != "the waiting line":  # it says no TQ
            assert f"TQ {TQ}" in text, view
        assert f"{LEFT} left in its quantum" in text, view
        assert f"waiting for {OTHERS} to move {MOVING} to host memory" in text, view
        assert f"{MINE} ({ME})" not in text, view  # the viewer's own need no "(user)"


def test_the_daemons_log_names_a_client_as_every_view(
        start_daemon: Any) -> None:
    daemon: DaemonProcess = start_daemon("--gpu-memory", "12MiB")
    code = ("from nodeside.client import Client\n"
            f"c = Client({daemon.socket!r}, name='k', display_name='nbA.ipynb')\n"
            "c.acquire(timeout=30); c.release(); c.close()\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=scaled(60),
                   env={**os.environ, "KIWI_SOCKET": daemon.socket})
    # The log has no viewer: the user is always said, as another user's views say it.
    daemon.wait_log(rf"Registered nbA\.ipynb \({ME}\) as c1")
    assert f"GPU 0 (logical GPU, {size(12 * 2**20)})" in daemon.log()


def test_the_panel_writes_each_fact_as_the_text_views(browser: Any) -> None:
    lab = LabServer(notebooks=()).start()
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        body = json.dumps({"reachable": True, **sample(), "viewer": ME, "pushed": False})
        page.route("**/kiwi/api/status*", lambda route: route.fulfill(
            status=200, content_type="application/json", body=body))
        page.goto(lab.url("lab") + "&reset")
        page.wait_for_selector(".jp-Launcher", timeout=90_000)
        page.click(PANEL_TAB)
        panel = page.locator(PANEL)
        panel.locator(".jp-Kiwi-residentBar").wait_for(timeout=30_000)
        assert panel.locator(".jp-Kiwi-tq").inner_text() == TQ
        queued = panel.locator(".jp-Kiwi-queueItem .jp-Kiwi-waitingFor").inner_text()
        assert queued == f"waiting for {OTHERS} to move {MOVING} to host memory"
        holder = panel.locator(".jp-Kiwi-holderName .jp-Kiwi-name").get_attribute("title")
        assert holder == MINE
        left = panel.locator(".jp-Kiwi-quantum").inner_text()
        assert left.endswith(" s") and float(left[:-2]) <= 27  # counting down from LEFT
    finally:
        page.close()
        lab.stop()
