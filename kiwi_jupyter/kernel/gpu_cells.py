"""Which cells can touch the GPU: in eager mode only those wait for it.

A notebook is mostly cells that define things, load data on the CPU or print: making each of
them queue behind another notebook's hour-long training step is what made eager mode feel slow.
So before a cell runs, eager mode asks ``may_use_gpu``, which reads the cell's code and the
kernel's namespace. A cell may touch the GPU when the code it runs (its top-level statements,
not the bodies of the functions it only defines):

- imports a GPU library (``import torch``, ``from cupy import ...``), or names one;
- uses a name the namespace binds to something that reaches one: a GPU library's module, an
  object whose class comes from one (a tensor, an array, a model), a function whose code uses
  such names (followed through the functions and classes it uses, a few levels deep), or an
  object of the notebook's own class whose attributes or methods do;
- runs code this reading cannot see into: ``exec``, ``eval``, ``__import__``, a cell magic
  (``%%time``...), a line magic that runs code (``%time``, ``%run``...) or a shell command.

Anything else (definitions, plain Python and NumPy on the CPU, printing) runs at once. The
reading is a static guess, so it can miss: code of a module of your own reached only through
an attribute of an object it does not follow. ``KiwiKernelConfig.gate_cells = 'all'`` makes
every cell wait, as before; lazy mode (the CUDA shim) needs no guess at all.
"""

from __future__ import annotations

import ast
import functools
import os
import sys
import sysconfig
import types
from collections.abc import Collection, Iterator, Mapping
from typing import Any

from kiwi_jupyter.kernel.cells import HOUSEKEEPING_MAGICS

#: Top-level package names of libraries that run on the GPU (more: ``KiwiKernelConfig.
#: extra_gpu_libraries``).
GPU_LIBRARIES = (
    "cupy", "cupyx", "torch", "torchvision", "torchaudio", "lightning", "pytorch_lightning",
    "jax", "jaxlib", "flax", "numba", "tensorflow", "keras", "cudf", "cuml", "cugraph",
    "cuspatial", "cucim", "rmm", "dask_cuda", "pycuda", "cuda", "triton", "tensorrt",
    "onnxruntime", "mxnet", "paddle", "transformers", "accelerate", "xgboost", "nvidia",
)

#: Builtins that run code this reading cannot see.
_OPAQUE_BUILTINS = frozenset({"exec", "eval", "__import__", "compile", "breakpoint"})
#: How far a name is followed (function to function, object to attribute) before giving up.
_DEPTH = 4
#: How many objects one cell's reading may look at; past it, the cell is taken to use the GPU.
_BUDGET = 2000
#: How many items of a container, or attributes of an object, are looked at.
_ITEMS = 16


class _TooDeep(Exception):  # noqa: N818 (internal signal, never leaves this module)
    """The budget ran out: answer "may use the GPU", the safe side."""


def may_use_gpu(source: str, namespace: Mapping[str, Any],
                libraries: Collection[str] = GPU_LIBRARIES) -> bool:
    """Whether the Python ``source`` of a cell (IPython's transformed cell) may touch the GPU
    when run in ``namespace``. A cell that does not parse never runs, so it needs no GPU."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError):  # Python cannot compile it either
        return False
    try:
        return _Reader(frozenset(libraries), namespace).module(tree)
    except _TooDeep:
        return True


def _top(name: str | None) -> str:
    return (name or "").split(".", 1)[0]


def _executed(node: ast.AST) -> Iterator[ast.AST]:
    """The nodes of ``node`` that run when it runs: not function or lambda bodies, which run
    only when called (their decorators, defaults and annotations do run)."""
    pending = list(ast.iter_child_nodes(node))
    while pending:
        child = pending.pop()
        yield child
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            pending.extend(child.decorator_list)
            pending.append(child.args)
            if child.returns is not None:
                pending.append(child.returns)
        elif isinstance(child, ast.Lambda):
            pending.append(child.args)
        else:
            pending.extend(ast.iter_child_nodes(child))


class _Reader:
    def __init__(self, libraries: frozenset[str], namespace: Mapping[str, Any]) -> None:
        self.libraries = libraries
        self.namespace = namespace
        self.defined: dict[str, ast.AST] = {}  # functions and classes this cell defines
        self.seen: set[int] = set()
        self.budget = _BUDGET

    # ---- the cell's code ------------------------------------------------------------------

    def module(self, tree: ast.Module) -> bool:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.defined.setdefault(node.name, node)
        return self.code(tree, _DEPTH)

    def code(self, tree: ast.AST, depth: int) -> bool:
        """Whether running ``tree`` (a cell, or the body of a function it defines) may."""
        return any(self._node(node, depth) for node in _executed(tree))

    def _node(self, node: ast.AST, depth: int) -> bool:
        if isinstance(node, ast.Import):
            return any(_top(alias.name) in self.libraries for alias in node.names)
        if isinstance(node, ast.ImportFrom):
            return node.level == 0 and _top(node.module) in self.libraries
        if isinstance(node, ast.Call):
            return self._magic_runs_code(node)
        if isinstance(node, ast.Name):
            return isinstance(node.ctx, ast.Load) and self.name(node.id, depth)
        if isinstance(node, ast.Attribute):
            return self.attribute(node, depth)
        return False

    def _magic_runs_code(self, call: ast.Call) -> bool:
        """``get_ipython().run_line_magic('time', ...)`` and the like, as IPython writes magics
        and shell commands: only the housekeeping line magics are known not to run code."""
        func = call.func
        if not (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call)
                and isinstance(func.value.func, ast.Name)
                and func.value.func.id == "get_ipython"):
            return False
        if func.attr == "run_line_magic" and call.args \
                and isinstance(call.args[0], ast.Constant):
            return str(call.args[0].value) not in HOUSEKEEPING_MAGICS
        return func.attr in ("run_cell_magic", "system", "getoutput", "run_line_magic")

    def name(self, name: str, depth: int) -> bool:
        if name in self.libraries or name in _OPAQUE_BUILTINS:
            return True
        if name in self.defined:
            node = self.defined.pop(name)  # read once: recursion ends here
            return depth > 0 and self.code(_body(node), depth - 1)
        if name in self.namespace:
            return self.value(self.namespace[name], depth)
        return False

    def attribute(self, node: ast.Attribute, depth: int) -> bool:
        """``a.b.c`` where ``a`` is a module: what the module's attribute is (``mylib.train``)."""
        chain: list[str] = []
        base: ast.expr = node
        while isinstance(base, ast.Attribute):
            chain.append(base.attr)
            base = base.value
        if not isinstance(base, ast.Name) or base.id not in self.namespace:
            return False
        value = self.namespace[base.id]
        for attr in reversed(chain):
            if not isinstance(value, types.ModuleType):
                return False
            value = vars(value).get(attr)
        return self.value(value, depth)

    # ---- objects in the namespace ---------------------------------------------------------

    def value(self, value: Any, depth: int) -> bool:
        if value is None or id(value) in self.seen:
            return False
        self.budget -= 1
        if self.budget < 0:
            raise _TooDeep
        self.seen.add(id(value))
        if isinstance(value, types.ModuleType):
            return _top(value.__name__) in self.libraries
        if isinstance(value, (str, bytes, int, float, complex, bool, range)):
            return False
        if self._from_library(value if isinstance(value, type) else type(value)):
            return True  # a tensor, an array, a model, or a class of them
        origin = _origin(value)
        if _top(origin) in self.libraries:
            return True  # a library's function
        if depth <= 0:
            return False
        if isinstance(value, (list, tuple, set, frozenset)):
            return any(self.value(item, depth - 1) for item in list(value)[:_ITEMS])
        if isinstance(value, dict):
            return any(self.value(item, depth - 1) for item in list(value.values())[:_ITEMS])
        if isinstance(value, types.BuiltinMethodType) and not isinstance(value.__self__,
                                                                         types.ModuleType):
            return self.value(value.__self__, depth - 1)  # e.g. a tensor's bound method
        if _installed(origin):
            return False  # the standard library, or a package that is not a GPU library
        if isinstance(value, types.MethodType):
            return self.value(value.__func__, depth) or self.value(value.__self__, depth)
        if isinstance(value, types.FunctionType):
            return self.function(value, depth - 1)
        if isinstance(value, type):
            return self.cls(value, depth - 1)
        # An object of the notebook's own class (or a module of its own): its methods, and
        # what it keeps in its attributes.
        return self.cls(type(value), depth - 1) or any(
            self.value(item, depth - 1) for item in list(_attributes(value))[:_ITEMS])

    def _from_library(self, cls: type) -> bool:
        if getattr(cls, "__kiwi_gpu__", False) is True:
            return True  # says so itself: the stand-in GPU's arrays (standin.py)
        return any(_top(getattr(base, "__module__", None)) in self.libraries
                   for base in getattr(cls, "__mro__", (cls,)))

    def cls(self, cls: type, depth: int) -> bool:
        return any(self.value(member, depth) for member in list(vars(cls).values())
                   if isinstance(member, (types.FunctionType, staticmethod, classmethod)))

    def function(self, function: types.FunctionType, depth: int) -> bool:
        scope = function.__globals__
        for name in _code_names(function.__code__):
            if name in self.libraries or name in _OPAQUE_BUILTINS:
                return True
            if name in scope and self.value(scope[name], depth):
                return True
        cells = function.__closure__ or ()
        return any(self.value(_cell_contents(cell), depth) for cell in cells)


def _body(node: ast.AST) -> ast.Module:
    """What runs when a function this cell defines is called, or a class's methods are."""
    if isinstance(node, ast.ClassDef):
        statements = [stmt for method in node.body
                      if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef))
                      for stmt in method.body]
        return ast.Module(body=statements, type_ignores=[])
    assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    return ast.Module(body=list(node.body), type_ignores=[])


def _origin(value: Any) -> str:
    """The module a function or class comes from, or an object's class does."""
    if isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)):
        return str(getattr(value, "__module__", None) or "")
    if isinstance(value, types.MethodType):
        return _origin(value.__func__)
    return type(value).__module__


@functools.lru_cache(maxsize=512)
def _installed(module_name: str) -> bool:
    """Whether a module is the standard library's or an installed package's (not the
    notebook's, nor a module of the user's own next to it): those are not read into."""
    if module_name in ("", "__main__"):
        return False  # the notebook's own (IPython runs cells as __main__)
    if module_name == "builtins" or module_name in sys.builtin_module_names:
        return True
    module = sys.modules.get(module_name)
    if module is None:
        return True
    path = getattr(module, "__file__", None)
    if path is None:
        return True
    path = os.path.realpath(path)
    return any(path.startswith(root + os.sep) for root in _LIBRARY_ROOTS)


_LIBRARY_ROOTS = tuple({os.path.realpath(p) for key in ("stdlib", "platstdlib", "purelib",
                                                        "platlib")
                        if (p := sysconfig.get_paths().get(key))})


def _code_names(code: types.CodeType) -> Iterator[str]:
    """Global names a function's code uses, nested functions and comprehensions included."""
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_names(const)


def _cell_contents(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty closure cell
        return None


def _attributes(value: Any) -> Iterator[Any]:
    try:
        yield from vars(value).values()
    except TypeError:  # no __dict__ (slots, C types)
        return

