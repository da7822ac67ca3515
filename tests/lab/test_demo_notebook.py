"""The demo notebooks in binder/: valid, in the Kiwi kernel, and they run from top to bottom
against a real daemon with no red output and without changing the node's scheduler."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import nbformat
import pytest
from support import DaemonProcess, scaled

from nodeside.client import Client

BINDER = Path(__file__).resolve().parents[2] / "binder"
DEMOS = ["kiwi-demo.ipynb", "kiwi-demo-partner.ipynb"]
#: Commands that change the scheduler for every notebook on the node.
NODE_WIDE = re.compile(r"^\s*%kiwi\s+(on|off|auto|tq)\b", re.MULTILINE)


def code_of(notebook: Any) -> str:
    return "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "code")


def scheduler(socket: str) -> dict[str, Any]:
    with Client(socket, register=False, reconnect_timeout=scaled(5)) as control:
        return control.status()


@pytest.mark.parametrize("name", DEMOS)
def test_demo_notebook_is_valid_and_runs_in_the_kiwi_kernel(name: str) -> None:
    notebook = nbformat.read(BINDER / name, as_version=4)
    nbformat.validate(notebook)
    assert notebook.metadata.kernelspec.name == "kiwi"
    assert "%kiwi status" in code_of(notebook)


@pytest.mark.parametrize("name", DEMOS)
def test_demo_notebook_does_not_change_the_scheduler_for_everyone(name: str) -> None:
    notebook = nbformat.read(BINDER / name, as_version=4)
    assert NODE_WIDE.findall(code_of(notebook)) == []


@pytest.mark.slow
@pytest.mark.parametrize("name", DEMOS)
def test_demo_notebook_runs_top_to_bottom_in_the_kiwi_kernel_with_no_red_output(
        name: str, kiwi_daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    from nbclient import NotebookClient

    monkeypatch.setenv("KIWI_SOCKET", kiwi_daemon.socket)
    monkeypatch.setenv("KIWI_DEMO_SECONDS", "0.3")
    before = scheduler(kiwi_daemon.socket)
    notebook = nbformat.read(BINDER / name, as_version=4)

    NotebookClient(notebook, timeout=int(scaled(120)),
                   resources={"metadata": {"path": tmp_path}}).execute()

    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert [o for o in outputs if o.output_type == "error"] == []
    red = [o.text for o in outputs if o.output_type == "stream" and o.name == "stderr"]
    assert red == []
    text = "".join(o.get("text", "") for o in outputs)
    assert "Workload: " in text
    assert "kiwi: this kernel's mode is eager" in text
    after = scheduler(kiwi_daemon.socket)
    assert (after["mode"], after["tq"]) == (before["mode"], before["tq"])


@pytest.mark.slow
def test_the_demos_workload_definitions_run_without_waiting_for_the_gpu(
        kiwi_daemon: DaemonProcess, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The cell that only defines the workload runs while another client holds the GPU."""
    from nbclient import NotebookClient

    monkeypatch.setenv("KIWI_SOCKET", kiwi_daemon.socket)
    notebook = nbformat.read(BINDER / "kiwi-demo.ipynb", as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    definitions = next(cell for cell in code if "def burst(" in cell.source)
    picking = next(cell for cell in code if "pick_backend()" in cell.source)
    notebook.cells = [picking, definitions]
    client = NotebookClient(notebook, timeout=int(scaled(60)),
                            resources={"metadata": {"path": tmp_path}})
    with client.setup_kernel():
        client.execute_cell(picking, 0)
        with Client(kiwi_daemon.socket, name="holder") as holder:
            holder.acquire(timeout=scaled(10))
            client.execute_cell(definitions, 1)
            # Had it waited, it would have run only once the holder's quantum ran out and the
            # daemon took the GPU from it, and its waiting line would be in its output.
            assert scheduler(kiwi_daemon.socket)["gpus"][0]["holders"] == [holder.id]
    assert [o for o in definitions.outputs if o.output_type == "display_data"] == []


def test_make_labs_quantum_ends_inside_a_demo_burst() -> None:
    """`make lab`'s TQ is shorter than the demo's bursts, so a burst beside a waiting partner
    outlives its quantum and the quantum's end shows (with 30 s against 15 s it never did)."""
    makefile = (BINDER.parent / "Makefile").read_text()
    tq = float(re.search(r"^LAB_TQ \?= ([\d.]+)$", makefile, re.M).group(1))
    assert re.search(r"^\tjupyter lab .*--KiwiExtension\.tq=\$\(LAB_TQ\)",
                     makefile.replace("$(BIN)/", "").replace("\\\n", " "), re.M)
    notebook = nbformat.read(BINDER / "kiwi-demo.ipynb", as_version=4)
    burst = float(re.search(r'"KIWI_DEMO_SECONDS", "([\d.]+)"', code_of(notebook)).group(1))
    assert tq < burst



def test_make_labs_gpu_fits_one_demos_working_set_and_not_two() -> None:
    """Without a GPU, `make lab` (and Binder) tell the scheduler a GPU size that holds one demo
    notebook's matrices on the stand-in GPU but not both: the memory moves at each turn."""
    from nodeside.config.values import parse_size

    makefile = (BINDER.parent / "Makefile").read_text()
    declared = re.search(r"^LAB_GPU_MEMORY \?= \$\(if \$\(shell command -v nvidia-smi\),,(\S+)\)$",
                         makefile, re.M)
    assert declared, "make lab declares no GPU memory where there is no GPU"
    binder = re.search(r'scheduler_args = \["--gpu-memory", "(\S+)"\]',
                       (BINDER / "postBuild").read_text())
    assert binder and binder.group(1) == declared.group(1)
    for name in DEMOS:
        code = code_of(nbformat.read(BINDER / name, as_version=4))
        n = int(re.search(r"^N = (\d+) if xp is None", code, re.M).group(1))
        assert "gpu.rand(2, n, n)" in code
        working_set = 2 * n * n * 4  # two float32 matrices
        assert working_set <= parse_size(declared.group(1)) < 2 * working_set
