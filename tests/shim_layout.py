"""docs/shim.md's file layout, made from each shim source's opening comment, or checked.

    python tests/shim_layout.py           # rewrite the layout in docs/shim.md
    python tests/shim_layout.py --check   # exit 1 when it differs from the sources (make lint)

The table lists every C file, header and Python module under kiwi_jupyter/shim/, tier by tier
(a file in a tier's own subfolder by its path in the tier), each with the head of its opening
comment (a C file's first ``/* ... */``, a module's docstring): the first sentence of its first
paragraph, asides in parentheses left out, cut at its first semicolon. So a file added, moved or
renamed shows in the docs as its own comment says it, and a file without an opening comment
fails the check. Only the text between the markers is replaced:

    <!-- generated: layout (python tests/shim_layout.py; edit the files' opening comments) -->
    ...
    <!-- end generated: layout -->
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHIM = REPO / "kiwi_jupyter" / "shim"
DOC = REPO / "docs" / "shim.md"
SOURCES = ("*.c", "*.h", "*.py")
#: Each tier with what it is for (the top folder holds what every tier includes, and Python).
TIERS = {
    "": "",
    "interpose": "the driver's entry points, and nothing else",
    "client": "the daemon client: its thread, the hold, the C API",
    "mechanisms": "what the tiers above stand on; calls nothing above",
}
BEGIN = "<!-- generated: layout (python tests/shim_layout.py; edit the files' opening comments) -->"
END = "<!-- end generated: layout -->"
_C_COMMENT = re.compile(r"\s*/\*(.*?)\*/", re.DOTALL)
_SENTENCE_END = re.compile(r"(?<=[^.\s][.])(?:\s|$)")


class NoOpeningComment(ValueError):
    """A source file that does not open with a comment saying what it holds."""


def opening_paragraph(path: Path) -> str:
    """The first paragraph of the file's opening comment, on one line. A paragraph ends at a
    blank line, or at an indented line (a list or a diagram under the paragraph's head)."""
    text = path.read_text()
    if path.suffix == ".py":
        docstring = ast.get_docstring(ast.parse(text)) or ""
        lines = docstring.splitlines()
    else:
        comment = _C_COMMENT.match(text)
        lines = [re.sub(r"^\s*\*? ?", "", line) for line in comment.group(1).splitlines()] \
            if comment else []
    paragraph: list[str] = []
    for line in lines:
        if not line.strip() or (paragraph and line.startswith(" ")):
            if paragraph:
                break
            continue
        paragraph.append(line.strip())
    if not paragraph:
        where = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        raise NoOpeningComment(f"{where} has no opening comment saying what it holds")
    return " ".join(" ".join(paragraph).split())


def head(paragraph: str) -> str:
    """What a file holds, in one line: the paragraph's first sentence without its asides."""
    sentence = _SENTENCE_END.split(paragraph, maxsplit=1)[0]
    while True:  # innermost first, so nested parentheses go too
        shorter = re.sub(r"\s*\([^()]*\)", "", sentence)
        if shorter == sentence:
            break
        sentence = shorter
    sentence = sentence.split("; ", 1)[0]
    return sentence.rstrip(" .:,")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def layout(shim: Path = SHIM) -> str:
    """The generated block: one table, tier by tier, files in name order."""
    rows = ["| file | what it holds |", "| --- | --- |"]
    for tier, purpose in TIERS.items():
        folder = shim / tier if tier else shim
        find = folder.rglob if tier else folder.glob  # a tier may grow folders of its own
        files = sorted({path for pattern in SOURCES for path in find(pattern)})
        if tier and files:
            rows.append(f"| **`{tier}/`** | **{purpose}** |")
        rows += [f"| `{path.relative_to(folder).as_posix()}` | "
                 f"{_cell(head(opening_paragraph(path)))} |" for path in files]
    return "\n".join(rows)


def rewritten(text: str, block: str) -> str:
    start, end = text.index(BEGIN), text.index(END)
    return f"{text[:start + len(BEGIN)]}\n{block}\n{text[end:]}"


def main(argv: list[str]) -> int:
    text = DOC.read_text()
    if BEGIN not in text or END not in text:
        print(f"{DOC.relative_to(REPO)} has no layout markers", file=sys.stderr)
        return 1
    try:
        wanted = rewritten(text, layout())
    except NoOpeningComment as error:
        print(error, file=sys.stderr)
        return 1
    if "--check" in argv:
        if wanted != text:
            print(f"{DOC.relative_to(REPO)}: the layout differs from the sources' opening "
                  "comments; run python tests/shim_layout.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
