"""The notebook image started: the Kiwi kernel is the default, the server extension and the panel
are enabled, and a Jupyter server started in it, under a Kubeflow-style prefix, runs its own
scheduler and answers the panel's status endpoint."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from image_containers import NOTEBOOK_IMAGE, TESTS_INSIDE, Container, container_of
from support import scaled

PREFIX = "/notebook/kiwi-user/smoke/"
# Listing the extensions and starting JupyterLab take tens of seconds on a loaded machine.
pytestmark = pytest.mark.timeout(scaled(240))


def plain(text: str) -> str:
    """Jupyter's listings without their colours."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


@pytest.fixture(scope="module")
def notebook() -> Iterator[Container]:
    yield from container_of(NOTEBOOK_IMAGE)


@pytest.fixture(scope="module")
def seen(notebook: Container) -> dict[str, Any]:
    timeout = scaled(60)
    done = notebook.run("python3", f"{TESTS_INSIDE}/inside_notebook_image.py", str(timeout),
                        env={"NB_PREFIX": PREFIX}, timeout=6 * timeout)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_image_runs_as_the_notebook_user_not_root(notebook: Container) -> None:
    done = notebook.run("id", "-un")
    for _ in range(2):
        # Seen once under load (2026-11-27): `buildah run --isolation chroot` exited 0 with the
        # command's output lost. `id -un` never prints nothing, so ask again rather than fail.
        if done.returncode != 0 or done.stdout.strip():
            break
        done = notebook.run("id", "-un")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "jovyan"


def test_the_kiwi_kernel_is_installed_and_the_default(seen: dict[str, Any]) -> None:
    spec = seen["kernelspecs"]["kernelspecs"]["kiwi"]["spec"]
    assert spec["display_name"] == "Python 3 (Kiwi vGPU)"
    assert seen["api_kernelspecs"]["default"] == "kiwi"


def test_the_server_extension_is_enabled(seen: dict[str, Any]) -> None:
    listing = plain(seen["server_extensions"])
    validated = r"kiwi_jupyter enabled\n(?:.*\n){0,2}?\s*kiwi_jupyter \S+ OK"
    assert re.search(validated, listing), listing


def test_the_panel_is_enabled(seen: dict[str, Any]) -> None:
    listing = plain(seen["lab_extensions"])
    assert re.search(r"kiwi-jupyter v\S+ enabled", listing), listing
    # JupyterLab 4.2 (Kubeflow 1.9's, and so the stand-in's) must load it: labextension/
    # package.json asks for no newer @jupyterlab packages than that.
    assert re.search(r"kiwi-jupyter v\S+ enabled OK", listing), listing


def test_a_server_started_in_the_image_answers_with_its_embedded_scheduler(
        seen: dict[str, Any]) -> None:
    assert seen["url"].endswith(PREFIX)
    assert "Kiwi: embedded scheduler listening on" in seen["server_log"]
    status = seen["kiwi_status"]
    assert status["reachable"] is True, status
    assert status["clients"] == []
