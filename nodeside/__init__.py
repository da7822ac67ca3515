"""Everything Kiwi runs on a node, outside notebooks: the per-GPU scheduler daemon, its wire
protocol, the Python client, ``kiwictl`` and the Kubernetes device plugin.

Nothing here imports Jupyter, IPython or tornado: the node image must not need them.
"""

__version__ = "0.1.0"


from pathlib import Path as _Path

from nodeside import compiled as _compiled

# Before any other nodeside module is imported: which core runs, compiled or pure, is decided
# for all of its modules together (nodeside/compiled.py).
_core = _compiled.install(_Path(__file__).resolve().parent.parent)


def core() -> str:
    """Which scheduler core this process runs: "compiled (mypyc)" or "pure Python (why)"."""
    return str(_core.core)
