"""Kernels are named by their notebooks: a kernel a Jupyter server starts for a notebook
(``JPY_SESSION_NAME``) registers that path as its display name, and the waiting line and
``%kiwi status`` show it. Real kernels, a real daemon."""

from __future__ import annotations

import itertools
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from kernel_support import (
    Holder,
    KernelUnderTest,
    entry,
    holders,
    kernel_env,
    scheduler_status,
    start_kernels,
)
from support import DaemonProcess, scaled

from kiwi_jupyter.kernel.identity import display_name, notebook_name

HOLDER_NOTEBOOK = "/srv/notebooks/team/holder-analysis.ipynb"
WAITER_NOTEBOOK = "/srv/notebooks/waiter.ipynb"


@pytest.fixture(scope="module")
def named(module_daemon: DaemonProcess) -> Iterator[tuple[KernelUnderTest, KernelUnderTest]]:
    (a,) = start_kernels(module_daemon.directory, module_daemon.socket,
                         JPY_SESSION_NAME=HOLDER_NOTEBOOK)
    (b,) = start_kernels(module_daemon.directory, module_daemon.socket,
                         JPY_SESSION_NAME=WAITER_NOTEBOOK)
    yield a, b
    a.shutdown()
    b.shutdown()


def test_the_notebook_path_is_the_display_name_and_home_reads_as_a_tilde() -> None:
    assert notebook_name({"JPY_SESSION_NAME": "/home/ada/runs/a.ipynb", "HOME": "/home/ada"}) \
        == "~/runs/a.ipynb"
    assert notebook_name({"JPY_SESSION_NAME": "/srv/b.ipynb", "HOME": "/home/ada"}) \
        == "/srv/b.ipynb"
    assert notebook_name({"HOME": "/home/ada"}) is None
    assert display_name({"KIWI_DISPLAY_NAME": "mine", "JPY_SESSION_NAME": "/x.ipynb"}) == "mine"


def test_under_a_kiwi_lab_the_notebook_is_named_as_the_lab_shows_it() -> None:
    """Kiwi's server extension tells its kernels the folder it serves: the path in there is
    the name the panel, %kiwi, kiwictl and the daemon's log all use."""
    lab = {"KIWI_NOTEBOOK_ROOT": "/home/ada/kiwi/binder", "HOME": "/home/ada"}
    assert notebook_name({**lab, "JPY_SESSION_NAME": "/home/ada/kiwi/binder/kiwi-demo.ipynb"}) \
        == "kiwi-demo.ipynb"
    assert notebook_name({**lab, "JPY_SESSION_NAME": "/home/ada/kiwi/binder/runs/a.ipynb"}) \
        == "runs/a.ipynb"
    assert notebook_name({**lab, "JPY_SESSION_NAME": "/home/ada/elsewhere.ipynb"}) \
        == "~/elsewhere.ipynb"


def test_a_kernel_started_for_a_notebook_registers_its_path_as_display_name(
        named: tuple[KernelUnderTest, KernelUnderTest], module_daemon: DaemonProcess) -> None:
    a, _ = named
    seen = a.run("import os\nfrom kiwi_jupyter.kernel import extension\n"
                 "(os.environ['KIWI_DISPLAY_NAME'], extension._loaded.link.client.display_name,"
                 " extension._loaded.link.client.name)").value
    assert seen == (HOLDER_NOTEBOOK, HOLDER_NOTEBOOK, a.kernel_id)  # the id stays the key
    row = entry(scheduler_status(module_daemon.socket), a.kernel_id)
    assert row is not None
    assert row["display_name"] == HOLDER_NOTEBOOK


def test_the_waiting_line_names_the_holder_by_its_notebook(
        named: tuple[KernelUnderTest, KernelUnderTest], module_daemon: DaemonProcess) -> None:
    a, b = named
    with Holder(module_daemon.directory) as hold:
        holding = a.submit(hold.code)
        hold.started()
        assert holders(module_daemon.socket) == [a.kernel_id]
        waiting = b.submit("1")
        b.wait_seen(waiting, "display_data")  # B's line is up while A holds
    assert a.collect(holding).status == "ok"
    waited = b.collect(waiting)
    lines = [m["content"]["data"].get("text/plain", "")
             for m in waited.of_type("display_data", "update_display_data")]
    assert lines, "B did not wait long enough to show its waiting line"
    assert "held by " in lines[0] and "holder-analysis.ipynb" in lines[0]
    assert a.kernel_id not in lines[0]


def test_kiwi_status_names_kernels_by_their_notebooks(
        named: tuple[KernelUnderTest, KernelUnderTest], module_daemon: DaemonProcess) -> None:
    _, b = named
    text = b.run("%kiwi status").result["text/plain"]
    assert "holder-analysis.ipynb" in text and "waiter.ipynb" in text


# What the kernel sees of itself in the daemon's status, run by nbconvert (not a Jupyter server).
WHO_AM_I = (
    "import json\n"
    "from kiwi_jupyter.kernel import extension\n"
    "link = extension._loaded.link\n"
    "link.check()\n"
    "print(json.dumps([c for c in link.client.status()['clients'] if c['id'] == link.client.id]))"
)


def documented_nbconvert_command() -> str:
    """The command docs/kernel.md gives for naming a kernel nbconvert runs."""
    doc = (Path(__file__).parents[2] / "docs" / "kernel.md").read_text()
    section = doc.split("### Naming a kernel that no Jupyter server started", 1)[1]
    section = section.split("\n#", 1)[0]
    (line,) = [line for line in section.splitlines() if line.startswith("    ")]  # the example
    return line.strip()


def test_the_documented_name_names_a_kernel_that_nbconvert_runs(
        module_daemon: DaemonProcess, tmp_path: Path) -> None:
    """nbclient gives the kernel neither a kernel id nor its notebook: the docs' variable does."""
    words = shlex.split(documented_nbconvert_command())
    leading = list(itertools.takewhile(lambda word: re.match(r"^[A-Z_]+=", word), words))
    assignments = dict(word.split("=", 1) for word in leading)
    command = words[len(leading):]
    assert command[0] == "jupyter" and assignments.keys() == {"KIWI_DISPLAY_NAME"}
    notebook = tmp_path / command[-1]
    notebook.parent.mkdir(parents=True)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(WHO_AM_I)])
    nb.metadata["kernelspec"] = {"name": "kiwi", "display_name": "Python 3 (Kiwi vGPU)",
                                 "language": "python"}
    nbformat.write(nb, notebook)
    subprocess.run([str(Path(sys.executable).parent / "jupyter"), *command[1:]], cwd=tmp_path,
                   env=kernel_env(module_daemon.socket, **assignments), check=True,
                   capture_output=True, timeout=scaled(120))
    ran = nbformat.read(notebook.with_suffix(".nbconvert.ipynb"), as_version=4)
    (row,) = json.loads(ran.cells[0].outputs[0]["text"])
    assert row["display_name"] == assignments["KIWI_DISPLAY_NAME"]
    assert row["name"].startswith("ipython-")  # no kernel id reaches an nbclient kernel
