"""The import graph of ``nodeside``: no module cycle, and no module importing one above it; and
of ``kiwi_jupyter`` and the panel's TypeScript: no module cycle.

The graph is read from the sources with ``ast``, every import counted: at the top of a module,
inside a function (a lazy import) or under ``TYPE_CHECKING`` (a type still ties two modules
together: neither can be read, moved or compiled without the other). ``LAYERS`` is the order
the parts sit in, lowest first; a module may import its own layer's modules and any below, never
one above. A new module or package must be given its place in ``LAYERS``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest
from graphs import cycles

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "nodeside"

#: The parts of ``nodeside``, lowest first. An entry names a module, or a package and all of its
#: modules; the most specific entry places a module. ``nodeside`` itself is its ``__init__``.
LAYERS: tuple[tuple[str, ...], ...] = (
    # Which core runs (compiled or pure): loaded before anything else, by path at build time.
    ("nodeside.compiled",),
    # What every part shares: the package's version, the bounds, the wire format, names, and
    # the checks on files the daemon reads.
    ("nodeside", "nodeside.limits", "nodeside.protocol", "nodeside.names",
     "nodeside.headline", "nodeside.errors", "nodeside.files", "nodeside.memory_words",
     "nodeside.formats"),
    # The domain's values that the config names and the scheduler applies.
    ("nodeside.model",),
    ("nodeside.config",),
    # The scheduler, in tiers: what the rules read and return ...
    ("nodeside.scheduler", "nodeside.scheduler.actions", "nodeside.scheduler.clients",
     "nodeside.scheduler.queue", "nodeside.scheduler.meter", "nodeside.scheduler.pools",
     "nodeside.scheduler.gpu_state", "nodeside.scheduler.access", "nodeside.scheduler.history",
     "nodeside.scheduler.ledger"),
    # ... the policies, which see the node only through ``view.PolicyView`` ...
    ("nodeside.scheduler.view", "nodeside.scheduler.attained", "nodeside.scheduler.light",
     "nodeside.scheduler.pricing", "nodeside.scheduler.light_first",
     "nodeside.scheduler.choosing", "nodeside.scheduler.interactive",
     "nodeside.scheduler.policies"),
    # ... the node's state and the components that take it ...
    ("nodeside.scheduler.node", "nodeside.scheduler.residency", "nodeside.scheduler.room",
     "nodeside.scheduler.moves",
     "nodeside.scheduler.taking_turns", "nodeside.scheduler.turns",
     "nodeside.scheduler.membership", "nodeside.scheduler.controls",
     "nodeside.scheduler.queries", "nodeside.scheduler.tiers"),
    # ... the facade the daemon holds ...
    ("nodeside.scheduler.core",),
    # ... and what reads it whole.
    ("nodeside.scheduler.report", "nodeside.scheduler.status"),
    # What the daemon uses besides the core, and the client, which uses none of it.
    ("nodeside.client", "nodeside.evict", "nodeside.metrics"),
    ("nodeside.daemon",),
    # Commands over the rest (the panel's copy of the formatters is written by one).
    ("nodeside.ctl", "nodeside.kai", "nodeside.deviceplugin", "nodeside.formats_panel"),
    # What tests drive: the core and the daemon on virtual time; nothing of the product uses it.
    ("nodeside.testing",),
)

#: Imports that break the rules, each with the reason it is allowed. Empty since the daemon's
#: shell goes one way (issue 32 R3: connections talk to the router, the errors in a leaf
#: module); an entry whose import is gone fails the test, so that the list only shrinks.
ALLOWED: Mapping[tuple[str, str], str] = {}


def modules(root: Path, package: str = PACKAGE) -> dict[str, Path]:
    """Every module of ``package`` under ``root``, by dotted name."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imported(module: str, path: Path, known: Iterable[str]) -> set[str]:
    """The package's modules that ``module`` imports, wherever in it the import is."""
    known = set(known)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            # ``from nodeside import protocol`` imports the submodule; ``from nodeside import
            # __version__`` the package itself.
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                     for alias in node.names]
        else:
            continue
        for name in names:
            # ``import nodeside.scheduler.core`` imports the module named, and its packages.
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def graph(root: Path, package: str = PACKAGE) -> dict[str, set[str]]:
    found = modules(root, package)
    return {module: imported(module, path, found) for module, path in found.items()}


def layer(module: str) -> int:
    """The index in ``LAYERS`` of the most specific entry that places ``module``."""
    best: tuple[int, int] | None = None  # (length of the entry, layer)
    for index, entries in enumerate(LAYERS):
        for entry in entries:
            places = module == entry or (entry != PACKAGE and module.startswith(entry + "."))
            if places and (best is None or len(entry) > best[0]):
                best = (len(entry), index)
    if best is None:
        raise LookupError(f"{module} has no place in LAYERS: add it to the layer it belongs to")
    return best[1]


def without_allowed(edges: Mapping[str, set[str]]) -> dict[str, set[str]]:
    return {module: {m for m in imports if (module, m) not in ALLOWED}
            for module, imports in edges.items()}


@pytest.fixture(scope="module")
def edges() -> dict[str, set[str]]:
    return graph(ROOT)


def test_no_module_imports_itself_back_through_others(edges: dict[str, set[str]]) -> None:
    assert cycles(without_allowed(edges)) == []


def test_no_module_imports_one_of_a_layer_above_it(edges: dict[str, set[str]]) -> None:
    upward = sorted(f"{module} -> {target}"
                    for module, imports in without_allowed(edges).items()
                    for target in imports if layer(target) > layer(module))
    assert upward == []


def test_no_module_of_the_notebook_side_imports_itself_back_through_others() -> None:
    assert cycles(graph(ROOT, "kiwi_jupyter")) == []


#: ``import type { X } from './y'``, ``export { X } from './y'``: a panel file's imports of another.
TS_IMPORT = re.compile(r"""^(?:import|export)\b[^;]*?\bfrom\s+'(\.[^']+)'""", re.M | re.S)


def panel_graph(source: Path) -> dict[str, set[str]]:
    """The panel's files (by name without ``.ts``) and the files each imports, types included:
    a type still ties two files together."""
    files = {path.relative_to(source).with_suffix("").as_posix(): path
             for path in sorted(source.rglob("*.ts")) if not path.name.endswith(".d.ts")}
    return {name: {(Path(name).parent / target).as_posix().removeprefix("./")
                   for target in TS_IMPORT.findall(path.read_text())}
            for name, path in files.items()}


def test_no_file_of_the_panel_imports_itself_back_through_others() -> None:
    assert cycles(panel_graph(ROOT / "labextension" / "src")) == []


def test_a_cycle_through_a_type_import_of_the_panel_is_found(tmp_path: Path) -> None:
    (tmp_path / "a.ts").write_text("import type { B } from './b';\n")
    (tmp_path / "b.ts").write_text("import {\n  A\n} from './a';\nimport { x } from 'y';\n")
    assert panel_graph(tmp_path) == {"a": {"b"}, "b": {"a"}}
    assert cycles(panel_graph(tmp_path)) == [["a", "b"]]


def test_every_allowed_exception_is_still_needed(edges: dict[str, set[str]]) -> None:
    gone = sorted(f"{a} -> {b} ({why})" for (a, b), why in ALLOWED.items()
                  if b not in edges.get(a, ()))
    assert gone == [], "delete these entries of ALLOWED: their imports are gone"


def test_the_config_and_the_scheduler_share_the_domain_types_without_importing_each_other(
        edges: dict[str, set[str]]) -> None:
    config = {m for m in edges if m.startswith("nodeside.config")}
    reaches = {target for m in config for target in edges[m]}
    assert "nodeside.model" in reaches
    assert not any(target.startswith("nodeside.scheduler") for target in reaches)


def test_a_policy_reads_the_node_only_through_its_view(edges: dict[str, set[str]]) -> None:
    policies = next(tier for tier in LAYERS if "nodeside.scheduler.view" in tier)
    above = {m for m in edges if m.startswith("nodeside.scheduler.")
             and layer(m) > layer("nodeside.scheduler.view")}
    assert {m: sorted(edges[m] & above) for m in policies} == {m: [] for m in policies}


# -- the checks themselves, on small packages written for them -----------------------------

def write(root: Path, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        path = root / PACKAGE / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_cycle_through_a_lazy_or_type_only_import_is_found(tmp_path: Path) -> None:
    write(tmp_path, {
        "__init__.py": "",
        "a.py": "from nodeside import b\n",
        "b.py": ("from typing import TYPE_CHECKING\n"
                 "if TYPE_CHECKING:\n    from nodeside.c import X\n"),
        "c.py": "def f():\n    import nodeside.a\n",
        "d.py": "from nodeside import __version__\n",
    })
    found = graph(tmp_path)
    assert found["nodeside.d"] == {"nodeside"}
    assert cycles(found) == [["nodeside.a", "nodeside.b", "nodeside.c"]]


def test_a_relative_import_names_its_module(tmp_path: Path) -> None:
    write(tmp_path, {
        "__init__.py": "",
        "sub/__init__.py": "from . import x\n",
        "sub/x.py": "from ..y import Y\nfrom .z import Z\n",
        "sub/z.py": "",
        "y.py": "",
    })
    found = graph(tmp_path)
    assert found["nodeside.sub"] == {"nodeside.sub.x"}
    assert found["nodeside.sub.x"] == {"nodeside.y", "nodeside.sub.z"}


def test_a_module_is_placed_by_its_most_specific_entry() -> None:
    assert layer("nodeside") < layer("nodeside.model") < layer("nodeside.config")
    assert layer("nodeside.scheduler.view") < layer("nodeside.scheduler.node")
    assert layer("nodeside.daemon.server") > layer("nodeside.metrics")
    with pytest.raises(LookupError):
        layer("nodeside.somewhere_new")
