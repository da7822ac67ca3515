"""The shim's tiers, read from its C sources: which file calls which, and who writes the hold.

The call graph is the compiler's own: each C file is compiled with GCC's ``-fcallgraph-info``
(macros expanded, static functions told apart), which writes every direct call a function makes.
A call from one file to a function defined in another is an edge between the files. Calls
through function pointers are not edges: they are how a lower tier is handed work from above
(the client registers itself with the mechanisms at load time, the link is given the handler
for the lines it reads).

The rules (docs/shim.md, "Layout"):

- every C file lives in one of the three tiers, ``interpose/``, ``client/`` and ``mechanisms/``;
- calls only go down: the entry points and the client call the mechanisms, the mechanisms call
  neither, and neither of the two upper tiers calls the other;
- no file outside the client names the client's handle or functions (``kiwi_client``,
  ``kiwi_comm_*``): a plain text check, beside the call graph;
- no two files call each other, however indirectly;
- the hold is written in one place only, ``kiwi_hold_move``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import graphs

TIERS = ("interpose", "client", "mechanisms")
#: The tiers each tier may call, besides its own.
MAY_CALL = {"interpose": {"mechanisms"}, "client": {"mechanisms"}, "mechanisms": set()}
#: The one function that may write the hold.
HOLD_WRITER = "kiwi_hold_move"

_NODE = re.compile(r'^node: \{ title: "([^"]+)" label: "[^"]*"( shape : ellipse)? \}$')
_EDGE = re.compile(r'^edge: \{ sourcename: "([^"]+)" targetname: "([^"]+)" label: "([^"]*)" \}$')
_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_CLIENT_NAME = re.compile(r"\bkiwi_(comm|client)(_\w+)?\b")
_HOLD_WRITE = re.compile(r"(\.|->)\s*hold\s*=(?!=)")


class NoCallGraph(RuntimeError):
    """The compiler here cannot write call graphs (GCC 10 or later can)."""


@dataclass(frozen=True)
class Call:
    caller: str  # file, relative to the shim's directory
    callee: str
    function: str
    where: str   # file:line:column of the call

    def __str__(self) -> str:
        return f"{self.caller} -> {self.callee} ({self.function} at {self.where})"


def c_files(shim: Path) -> list[str]:
    return sorted(p.relative_to(shim).as_posix() for p in shim.rglob("*.c"))


def tier_of(path: str) -> str | None:
    top = path.split("/", 1)[0]
    return top if top in TIERS and "/" in path else None


def copy_sources(shim: Path, target: Path) -> Path:
    """The shim's C sources copied to target, to put a fault into (what a check must find)."""
    shutil.copytree(shim, target, ignore=shutil.ignore_patterns("*.so", "*.py", "__pycache__",
                                                               "*.sources-sha256"))
    return target


def code_of(path: Path) -> str:
    """The source without its comments (their line breaks kept)."""
    return _COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), path.read_text())


def _compile_graph(shim: Path, source: str, scratch: Path, index: int) -> str:
    gcc = shutil.which("gcc")
    if gcc is None:
        raise NoCallGraph("no gcc")
    result = subprocess.run(
        [gcc, "-std=c11", "-O0", "-fcallgraph-info", "-c", str(shim / source),
         "-o", str(scratch / f"{index}.o")], capture_output=True, text=True, check=False)
    graph = scratch / f"{index}.ci"
    if result.returncode != 0 and "callgraph-info" in result.stderr:
        raise NoCallGraph(result.stderr.strip())
    if result.returncode != 0 or not graph.is_file():
        raise AssertionError(f"{source} does not compile:\n{result.stderr}")
    return graph.read_text()


def calls_between_files(shim: Path) -> list[Call]:
    """Every direct call from a function of one C file to a function defined in another."""
    defined: dict[str, set[str]] = {}
    edges: list[tuple[str, str, str]] = []  # (file, callee's title, where)
    with tempfile.TemporaryDirectory(prefix="kiwi-tiers-") as scratch:
        for index, source in enumerate(c_files(shim)):
            for line in _compile_graph(shim, source, Path(scratch), index).splitlines():
                node = _NODE.match(line)
                if node and not node.group(2):  # not an ellipse: defined in this file
                    defined.setdefault(node.group(1), set()).add(source)
                edge = _EDGE.match(line)
                if edge:
                    edges.append((source, edge.group(2), edge.group(3)))
    calls = []
    for source, target, where in edges:
        files = defined.get(target, set())
        if source in files or len(files) != 1:
            continue  # within the file, outside the shim (libc, the driver), or ambiguous
        (callee,) = files
        calls.append(Call(source, callee, target, where.rsplit("/", 1)[-1]))
    return calls


def files_outside_tiers(shim: Path) -> list[str]:
    return [path for path in c_files(shim) if tier_of(path) is None]


def upward_calls(calls: list[Call]) -> list[Call]:
    """Calls from a tier to one it may not call."""
    wrong = []
    for call in calls:
        caller, callee = tier_of(call.caller), tier_of(call.callee)
        if caller is None or callee is None:
            continue  # reported by files_outside_tiers
        if caller != callee and callee not in MAY_CALL[caller]:
            wrong.append(call)
    return wrong


def client_names_below(shim: Path) -> list[str]:
    """Where a file of the entry points or the mechanisms names the client's state or
    functions: path:line and the name."""
    found = []
    for path in sorted(shim.rglob("*")):
        relative = path.relative_to(shim).as_posix()
        if path.suffix not in (".c", ".h") or tier_of(relative) == "client":
            continue
        if tier_of(relative) is None and path.suffix == ".c":
            continue
        for number, line in enumerate(code_of(path).splitlines(), 1):
            found += [f"{relative}:{number}: {m.group(0)}" for m in _CLIENT_NAME.finditer(line)]
    return found


def cycles(calls: list[Call]) -> list[list[str]]:
    """The groups of files that call each other, directly or around a loop."""
    graph: dict[str, set[str]] = {}
    for call in calls:
        graph.setdefault(call.caller, set()).add(call.callee)
        graph.setdefault(call.callee, set())
    return graphs.cycles(graph)


def _body_spans(code: str, function: str) -> list[tuple[int, int]]:
    """Where the definitions of function begin and end in code (braces matched)."""
    spans = []
    for match in re.finditer(rf"\b{function}\s*\([^;{{]*\)\s*\{{", code):
        depth, at = 0, match.end() - 1
        for at in range(match.end() - 1, len(code)):
            depth += {"{": 1, "}": -1}.get(code[at], 0)
            if depth == 0:
                break
        spans.append((match.start(), at))
    return spans


def hold_writes_elsewhere(shim: Path) -> list[str]:
    """Writes of a ``hold`` member anywhere but inside kiwi_hold_move: path:line."""
    found = []
    for path in sorted(shim.rglob("*")):
        if path.suffix not in (".c", ".h"):
            continue
        code = code_of(path)
        allowed = _body_spans(code, HOLD_WRITER)
        for m in _HOLD_WRITE.finditer(code):
            if not any(start <= m.start() <= end for start, end in allowed):
                line = code.count("\n", 0, m.start()) + 1
                found.append(f"{path.relative_to(shim).as_posix()}:{line}")
    return found
