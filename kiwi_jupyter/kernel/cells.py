"""What a cell is to Kiwi: which cells wait for the GPU, where the wait goes, what they say.

The wait goes in the cell's code as its first statement (see ``extension`` for why not in a
hook); ``GateInserter`` puts it there. A cell of housekeeping magics never waits.
"""

from __future__ import annotations

import ast
import os
import re
from typing import Protocol, TypedDict

from nodeside.formats import seconds

#: The module whose ``gate()`` the inserted statement calls.
GATE_MODULE = "kiwi_jupyter.kernel.extension"


class Gated(Protocol):
    def wants_gate_inserted(self) -> bool:
        """True once per gated cell: the cell being compiled needs its gate()."""

    def interactivity(self) -> str:
        """The shell's ``ast_node_interactivity`` now: which statements display their value."""


class GateInserter(ast.NodeTransformer):
    """Puts ``gate()`` first in a cell's code, once per cell (not in %timeit's inner loops).

    IPython compiles and runs a cell's top-level statements one by one, and each costs as much
    as a trivial cell's own code (a tenth of a millisecond or more on a small machine). So the
    gate joins the first statement instead of adding one: ``S`` becomes
    ``if not gate(): S`` (``gate()`` returns None), which runs ``S`` exactly as before, after
    the GPU is held. Only a statement whose value IPython would display stays apart from the
    gate, since IPython decides that from the statement's own kind.
    """

    def __init__(self, extension: Gated) -> None:
        self.extension = extension

    def visit_Module(self, node: ast.Module) -> ast.Module:
        if not self.extension.wants_gate_inserted() or not node.body:
            return node
        # `from __future__` imports must stay first in the module.
        at = next((i for i, stmt in enumerate(node.body)
                   if not (isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__")),
                  len(node.body))
        if at < len(node.body) and not _may_display(node.body[at], at == len(node.body) - 1,
                                                    self.extension.interactivity()):
            first = node.body[at]
            node.body[at] = ast.copy_location(
                ast.If(test=ast.UnaryOp(ast.Not(), _gate_call(first).value), body=[first],
                       orelse=[]), first)
            return node
        call = _gate_call(node.body[min(at, len(node.body) - 1)])
        node.body.insert(at, call)
        return node


def _may_display(statement: ast.stmt, last: bool, interactivity: str) -> bool:
    """Whether IPython may show this top-level statement's value (``ast_node_interactivity``:
    ``last_expr`` by default, also ``none``, ``last``, ``last_expr_or_assign``, ``all``)."""
    if interactivity == "none":
        return False
    if interactivity == "all":
        return True
    if not last:
        return False
    if interactivity == "last_expr":
        return isinstance(statement, ast.Expr)
    return True


#: Line magics that configure or inspect the kernel and never run user code; a cell made only of
#: these (and comments) is not gated. %time, %timeit and %run are not here: they run code.
HOUSEKEEPING_MAGICS = frozenset({
    "kiwi", "config", "load_ext", "unload_ext", "reload_ext", "pip", "conda", "cd", "pwd",
    "env", "who", "whos", "who_ls", "lsmagic", "history", "magic",
})


class _Span(TypedDict):
    """Where a built node says it sits in the cell (ast's position attributes). Typed by key, not
    as a plain dict: a dict of ints could, to a type checker, also fill a node's other keyword
    parameters (``ast.Constant``'s ``kind``, a string)."""
    lineno: int
    col_offset: int
    end_lineno: int
    end_col_offset: int


def _gate_call(anchor: ast.stmt) -> ast.Expr:
    """``__import__("kiwi_jupyter.kernel.extension", fromlist=["gate"]).gate()``, placed on the
    anchor's line. Built node by node: parsing the text anew for every cell costs 10x more."""
    where: _Span = {"lineno": anchor.lineno, "col_offset": anchor.col_offset,
                    "end_lineno": anchor.lineno, "end_col_offset": anchor.col_offset}
    module = ast.Call(
        func=ast.Name("__import__", ast.Load(), **where),
        args=[ast.Constant(GATE_MODULE, **where)],
        keywords=[ast.keyword("fromlist", ast.List([ast.Constant("gate", **where)], ast.Load(),
                                                   **where), **where)],
        **where)
    call = ast.Call(func=ast.Attribute(module, "gate", ast.Load(), **where), args=[],
                    keywords=[], **where)
    return ast.Expr(call, **where)


#: Commands of Kiwi's own that a cell may run with ``!`` without the GPU: they ask the scheduler
#: and touch no GPU, and a cell that took the GPU to ask who holds it would see itself.
HOUSEKEEPING_COMMANDS = frozenset({"kiwictl"})
#: What would let a ``!`` line run more than the one command (a pipe, a list, a substitution).
_SHELL_JOINS = re.compile(r"[;&|`\n]|\$\(|[<>]\(")


def needs_no_gpu(cell: str) -> bool:
    """A cell of housekeeping line magics and ``!kiwictl`` commands (asking for the status must
    not wait for the GPU), or of comments only (nothing runs: asking for the GPU would be a
    wasted round trip)."""
    lines = [line.strip() for line in cell.splitlines()]
    code = [line for line in lines if line and not line.startswith("#")]
    return all(_housekeeping_magic(line) or _housekeeping_command(line) for line in code)


def _housekeeping_magic(line: str) -> bool:
    return (line.startswith("%") and not line.startswith("%%")
            and line[1:].split(maxsplit=1)[0].rstrip("?") in HOUSEKEEPING_MAGICS)


def _housekeeping_command(line: str) -> bool:
    """``!kiwictl status`` (or ``!.venv/bin/kiwictl ...``): one of Kiwi's own commands, alone."""
    if not line.startswith("!") or line.startswith("!!"):
        return False
    command = line[1:].strip()
    words = command.split(maxsplit=1)
    return bool(words) and os.path.basename(words[0]) in HOUSEKEEPING_COMMANDS and \
        not _SHELL_JOINS.search(command)


#: Why the scheduler wanted the GPU back, for the closing lines of a cell (a drop's reason).
DROP_WHY = {"quantum": "this kernel's quantum ended with others waiting",
            "preempt": "preempted by a non-preemptible request",
            "room": "another notebook needed the room",
            "maximum": "its pool reached its maximum share",
            "mode": "the scheduler was turned on"}


def handed_back_sentence(times: int, reason: str | None, waited: float) -> str:
    """The closing line of a cell that gave the GPU back mid-cell when asked, and waited for it
    again: the stand-in GPU does so at its next operation, as the CUDA shim at a GPU call."""
    why = DROP_WHY.get(reason or "", reason or "the scheduler asked for it")
    count = "once" if times == 1 else f"{times} times"
    return (f"this cell gave the GPU back {count} ({why}) and waited {seconds(waited)} in all "
            "to get it again")


def drop_sentence(reason: str | None) -> str:
    """The closing line of a cell that kept the GPU past the scheduler's request for it."""
    if reason is None or reason == "":
        return "the connection to the scheduler was lost during this cell, and the GPU with it"
    if reason == "grace":
        return ("the scheduler took the GPU back during this cell: it had asked for it and "
                "the cell kept it past the grace period")
    why = DROP_WHY.get(reason, reason)
    return (f"the scheduler asked for the GPU back during this cell ({why}); it was given back "
            "when the cell ended")
