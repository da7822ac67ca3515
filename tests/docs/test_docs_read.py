"""The docs a newcomer reads (README.md, BENCHMARKS.md and docs/*.md) can be finished: each page
opens with a summary that fits on one screen, cites no tracker ("issue 16") the reader cannot see,
speaks to users, not to the project's own developers, and names no path that does not exist (the
same check `make lint` runs: tests/doc_references.py)."""

from __future__ import annotations

import re
from pathlib import Path

import doc_references
import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", REPO / "BENCHMARKS.md", *sorted((REPO / "docs").glob("*.md"))]
#: A screen: what a reader sees before scrolling, at about 100 characters a line.
SCREEN_LINES = 30
#: What only the project's own developers would read (their sessions, their tools).
FOR_DEVELOPERS = re.compile(r"device tool|GPU sessions?\b|session lent|the project's own",
                            re.IGNORECASE)


def test_every_path_a_doc_names_exists() -> None:
    assert doc_references.dead() == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_each_page_opens_with_a_summary_that_fits_on_one_screen(page: Path) -> None:
    lines = page.read_text().splitlines()
    assert lines[0].startswith("# ")
    first_section = next((i for i, line in enumerate(lines) if line.startswith("## ")),
                         len(lines))
    prose = [line for line in lines[1:first_section]
             if line.strip() and not line.startswith(("    ", "```", "|", "!["))]
    assert len(prose) >= 3, "no summary before the first section"
    assert first_section <= SCREEN_LINES, f"the opening takes {first_section} lines"


@pytest.mark.parametrize("page", [*PAGES, *sorted((REPO / "docs" / "decisions").glob("*.md"))],
                         ids=lambda p: p.name)
def test_no_page_cites_a_tracker_the_reader_cannot_see(page: Path) -> None:
    cited = [line for line in page.read_text().splitlines()
             if re.search(r"\bissues? \d+", line, re.IGNORECASE) and "nvshare" not in line]
    assert cited == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_page_speaks_to_the_projects_own_developers(page: Path) -> None:
    assert FOR_DEVELOPERS.findall(page.read_text()) == []
