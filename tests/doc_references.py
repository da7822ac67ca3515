"""Every path the docs name exists: README.md, BENCHMARKS.md and docs/**/*.md.

A doc names a path in a link (``[x](docs/lab.md)``, relative to the doc) or in code
(```nodeside/ctl.py```, relative to the repository, with a ``:line`` or ``#anchor`` after it
at times). Checked are the names that start with one of the repository's own top-level
folders or files, and bare file names of a doc (``lab.md``, ``CONTRACT.md``), which must be
found beside the doc or at the top; in plain text, paths under the repository's folders and
paths out of it (``../shared/...``: nobody reading the repository has them). Code blocks are
examples and are not read. Paths of a machine (``/var/run/kiwi/scheduler.sock``),
of a user's home (``~/...``), patterns (``*``, ``<id>``) and module names
(``nodeside.names``) are not paths in the repository and are left alone.

    python tests/doc_references.py           # list the dead references, exit 1 if any
    python tests/doc_references.py --check   # the same (``make lint`` runs it)
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: What a reference in code looks like: no spaces, no pattern characters.
_CODE = re.compile(r"`([^`\s]+)`")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_PATTERN = re.compile(r"[*?<>{}$|\\]")
_BARE_DOC = re.compile(r"^[\w.-]+\.(md|toml)$")
#: In plain text: a path out of the repository, or a top-level document's name.
_OUTSIDE = re.compile(r"(?<![\w/.])\.\./[\w./-]*\w")
_TOP_DOC = re.compile(r"(?<![\w/.`-])[A-Z][A-Z_]+\.md\b")


def docs(root: Path = REPO) -> list[Path]:
    found = [root / "README.md", root / "BENCHMARKS.md", *sorted((root / "docs").rglob("*.md"))]
    return [path for path in found if path.exists()]


def _tracked_tops(root: Path) -> set[str]:
    """The repository's top-level names, as git knows them (built outputs are not)."""
    listed = subprocess.run(["git", "ls-files"], capture_output=True, text=True, cwd=root,
                            check=True).stdout.split()
    return {name.split("/", 1)[0] for name in listed}


def references(text: str, tops: set[str] = frozenset()) -> Iterator[tuple[int, str, bool]]:
    """(line, reference, is a link) for every candidate in ``text``: links, code, and in plain
    text the paths that start with one of ``tops`` (folders), go out of the repository, or name
    a top-level document."""
    plain = re.compile(rf"(?<![\w/.`-])(?:{'|'.join(map(re.escape, sorted(tops)))})/[\w./-]*\w") \
        if tops else None
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.startswith(("    ", "\t")):
            continue  # an example (a command line, a file's text), not a reference
        for match in _LINK.finditer(line):
            yield number, match.group(1), True
        for match in _CODE.finditer(line):
            yield number, match.group(1), False
        prose = _CODE.sub(" ", _LINK.sub(" ", line))
        for pattern in (plain, _OUTSIDE, _TOP_DOC):
            for match in pattern.finditer(prose) if pattern is not None else ():
                yield number, match.group(0), False


def _clean(reference: str) -> str:
    reference = reference.split("#", 1)[0]
    reference = re.sub(r":\d+(-\d+)?(,\d+(-\d+)?)*$", "", reference)  # file.py:49, :49-57
    return reference.rstrip(".,;:)")


def dead(root: Path = REPO) -> list[str]:
    """``doc:line: reference`` for every path a doc names that does not exist."""
    tops = _tracked_tops(root)
    folders = {top for top in tops if (root / top).is_dir()}
    found = []
    for doc in docs(root):
        for number, raw, link in references(doc.read_text(), folders):
            if "://" in raw or raw.startswith(("mailto:", "#")):
                continue
            reference = _clean(raw)
            if reference.startswith("../") and not link:
                found.append(f"{doc.relative_to(root)}:{number}: {raw} (outside the repository)")
                continue
            if not reference or _PATTERN.search(reference) or reference.startswith(("/", "~")):
                continue
            first = reference.split("/", 1)[0]
            if link:
                candidates = [doc.parent / reference]
            elif first in tops and (first != reference or "." in reference):
                candidates = [root / reference]
            elif _BARE_DOC.match(reference):
                candidates = [doc.parent / reference, root / reference]
            else:
                continue
            if not any(path.exists() for path in candidates):
                found.append(f"{doc.relative_to(root)}:{number}: {raw}")
    return found


def main(argv: list[str]) -> int:
    missing = dead()
    for line in missing:
        print(f"{line}: no such file in the repository", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
