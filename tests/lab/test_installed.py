"""Installing the package is enough: Jupyter lists the server extension and the panel as OK."""

from __future__ import annotations

import re
import subprocess
import sys

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def jupyter(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "jupyter", *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    # Both commands print their listing on stderr in some versions and stdout in others.
    return ANSI.sub("", done.stdout + done.stderr)


def test_jupyter_server_extension_list_shows_kiwi_enabled_and_ok() -> None:
    listing = jupyter("server", "extension", "list")
    assert re.search(r"^\s*kiwi_jupyter enabled\s*$", listing, re.M), listing
    assert re.search(r"^\s*kiwi_jupyter \S+ OK\s*$", listing, re.M), listing


def test_jupyter_labextension_list_shows_the_panel_enabled_and_ok() -> None:
    listing = jupyter("labextension", "list")
    assert re.search(r"kiwi-jupyter v\S+ enabled OK", listing), (
        "the panel is not installed; build it with `make labextension`\n" + listing
    )
