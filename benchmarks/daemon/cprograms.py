"""The benchmarks' own C programs (benchmarks/daemon/c/), compiled with gcc on first use.

Like the tests' fake CUDA driver, they are built from source by the run that uses them, into a
folder keyed by the source's hash, so a changed source is rebuilt and an unchanged one is not.
"""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
from pathlib import Path

SOURCES = Path(__file__).resolve().parent / "c"


def build(name: str) -> Path:
    """The executable built from ``benchmarks/daemon/c/<name>.c``."""
    source = SOURCES / f"{name}.c"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    target = Path(tempfile.gettempdir()) / "kiwi-bench-bin" / f"{name}-{digest}"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".partial")
        subprocess.run(["gcc", "-O2", "-Wall", "-Wextra", "-o", str(partial), str(source)],
                       check=True)
        partial.rename(target)
    return target
