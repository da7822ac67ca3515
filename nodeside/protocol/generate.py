"""Writes every file the protocol's table makes, or checks that none differs from it.

    python -m nodeside.protocol.generate           # write them
    python -m nodeside.protocol.generate --check   # exit 1, naming each stale file

Whole files (the Python names, the C header and decoder, the panel's status types) are written
entire. A Markdown file keeps its prose: only the text between a pair of markers is replaced,

    <!-- generated: NAME (python -m nodeside.protocol.generate; edit nodeside/protocol/...) -->
    ...
    <!-- end generated: NAME -->

where NAME is one of the blocks ``render.markdown.blocks`` makes. ``make lint`` runs the check,
and so does a test.

The package imports ``names.py`` itself, so a change to the table that ``wire`` needs before the
names exist (a new entry of ``names.REQUEST_FIELDS``'s kind) is generated in two steps: add the
entry, generate, then use the new name.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from nodeside.protocol.render import c, c_decoder, markdown, python, typescript

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Target:
    #: Relative to the repository's root.
    path: str
    render: Callable[[str], str]
    """From the file's current text (empty when it does not exist) to what it must read."""


def _whole(make: Callable[[], str]) -> Callable[[str], str]:
    return lambda current: make()


_BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w-]+) [^\n]*-->\n)(?P<body>.*?)"
                    r"(<!-- end generated: (?P=name) -->)", re.DOTALL)


def splice(current: str, blocks: dict[str, str]) -> str:
    """``current`` with each marked block's body replaced by ``blocks[name]``."""
    def body(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in blocks:
            raise KeyError(f"no generated block called {name!r}")
        return match.group(1) + blocks[name] + match.group(4)
    return _BLOCK.sub(body, current)


TARGETS: tuple[Target, ...] = (
    Target("nodeside/protocol/names.py", _whole(python.render)),
    Target("docs/protocol.md", lambda current: splice(current, markdown.blocks())),
    Target("kiwi_jupyter/shim/client/protocol.h", _whole(c.render)),
    Target("kiwi_jupyter/shim/client/decode.c", _whole(c_decoder.render)),
    Target("labextension/src/document.ts", _whole(typescript.render)),
)


def stale(root: Path = ROOT) -> list[tuple[Target, str]]:
    """The targets whose file differs from what the table makes, each with what it should
    read."""
    found = []
    for target in TARGETS:
        path = root / target.path
        current = path.read_text() if path.exists() else ""
        wanted = target.render(current)
        if wanted != current:
            found.append((target, wanted))
    return found


def main(argv: Sequence[str] = ()) -> int:
    check = "--check" in argv
    differ = stale()
    for target, wanted in differ:
        if check:
            print(f"{target.path} differs from what nodeside/protocol's table makes; run "
                  f"python -m nodeside.protocol.generate", file=sys.stderr)
            continue
        path = ROOT / target.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(wanted)
        print(f"wrote {target.path}")
    return 1 if check and differ else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
