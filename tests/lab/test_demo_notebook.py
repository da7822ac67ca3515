"""The demo notebooks in binder/: valid, and they run from top to bottom against a real daemon."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import nbformat
import pytest
from support import DaemonProcess

BINDER = Path(__file__).resolve().parents[2] / "binder"
DEMOS = ["kiwi-demo.ipynb", "kiwi-demo-partner.ipynb"]


@pytest.mark.parametrize("name", DEMOS)
def test_demo_notebook_is_valid_and_uses_the_kiwi_magics(name: str) -> None:
    notebook = nbformat.read(BINDER / name, as_version=4)
    nbformat.validate(notebook)
    sources = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "code")
    assert "%load_ext kiwi_jupyter" in sources
    assert "%kiwi status" in sources


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("kiwi_jupyter.kernel") is None,
    reason="needs the kernel extension (kiwi_jupyter.kernel, %kiwi magics), not merged here yet",
)
def test_demo_notebook_runs_top_to_bottom(
    kiwi_daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from nbclient import NotebookClient

    monkeypatch.setenv("KIWI_SOCKET", kiwi_daemon.socket)
    monkeypatch.setenv("KIWI_DEMO_SECONDS", "0.3")
    notebook = nbformat.read(BINDER / "kiwi-demo.ipynb", as_version=4)
    NotebookClient(
        notebook, kernel_name="python3", timeout=120, resources={"metadata": {"path": tmp_path}}
    ).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("Workload: " in o.get("text", "") for o in outputs)
