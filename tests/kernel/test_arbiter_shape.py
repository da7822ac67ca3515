"""The arbiters' family: each mode's arbiter builds on its base's moments, never around them."""

from __future__ import annotations

import ast
from pathlib import Path

from kiwi_jupyter.kernel.gpu import Arbiter, EagerArbiter
from kiwi_jupyter.kernel.gpu_shim import ShimEagerArbiter, ShimLazyArbiter, ShimOffArbiter

ROOT = Path(__file__).resolve().parents[2]


def calls_past_the_parent(source: str) -> list[str]:
    """Calls like ``Base.method(self, ...)``: a method that names a class to skip the one its
    own class inherits from, so that the class says it is a kind of its parent and is not."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id[:1].isupper()
                and node.args and isinstance(node.args[0], ast.Name)
                and node.args[0].id == "self"):
            found.append(f"{node.func.value.id}.{node.func.attr} (line {node.lineno})")
    return found


def test_no_product_method_calls_around_its_parent() -> None:
    skipping = {str(path.relative_to(ROOT)): calls
                for package in ("kiwi_jupyter", "nodeside")
                for path in sorted((ROOT / package).rglob("*.py"))
                if (calls := calls_past_the_parent(path.read_text()))}
    assert skipping == {}


def test_a_call_around_the_parent_is_found() -> None:
    source = ("class Off(Base):\n"
              "    def begin_cell(self, gated):\n"
              "        Base.begin_cell(self, gated)\n"
              "        super().begin_cell(gated)\n")
    assert calls_past_the_parent(source) == ["Base.begin_cell (line 3)"]


def test_the_shim_arbiters_stand_as_the_kernel_clients_do() -> None:
    # Mode off is the base of the others, with and without the shim.
    assert (Arbiter.mode, EagerArbiter.mode) == ("off", "eager")
    assert issubclass(EagerArbiter, Arbiter)
    assert (ShimOffArbiter.mode, ShimLazyArbiter.mode, ShimEagerArbiter.mode) == (
        "off", "lazy", "eager")
    assert issubclass(ShimLazyArbiter, ShimOffArbiter)
    assert issubclass(ShimEagerArbiter, ShimLazyArbiter)
    # Off frames no cell: its beginning is the base's, not the lazy mode's.
    assert ShimOffArbiter.begin_cell is Arbiter.begin_cell
