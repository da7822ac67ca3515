"""docs/shim.md stays a reference a reader can finish: under 500 lines, its file layout made from
the shim sources' own opening comments (tests/shim_layout.py), never a list written by hand."""

from __future__ import annotations

from pathlib import Path

import pytest
import shim_layout

#: A reference a reader finishes in one sitting; the stories live in docs/decisions/.
MOST_LINES = 500


def test_the_shim_reference_stays_under_500_lines() -> None:
    assert len(shim_layout.DOC.read_text().splitlines()) < MOST_LINES


def test_the_layout_in_the_docs_is_the_one_the_sources_make() -> None:
    assert shim_layout.main(["--check"]) == 0


def test_every_shim_source_is_in_the_layout() -> None:
    table = shim_layout.layout()
    sources = [path for pattern in shim_layout.SOURCES
               for path in shim_layout.SHIM.rglob(pattern)]
    assert sources
    assert [path.name for path in sources if f"`{path.name}` |" not in table] == []


def test_a_tier_folder_of_its_own_is_listed_by_its_path_in_the_tier(tmp_path: Path) -> None:
    (tmp_path / "mechanisms" / "vmm").mkdir(parents=True)
    (tmp_path / "mechanisms" / "vmm" / "regions.c").write_text("/* Regions of addresses. */\n")
    assert "| `vmm/regions.c` | Regions of addresses |" in shim_layout.layout(tmp_path)


def test_a_file_is_described_by_its_first_sentence_without_its_asides(tmp_path: Path) -> None:
    source = tmp_path / "ring.c"
    source.write_text("/* Copies through a ring of pinned buffers (see pager.c; a note).\n"
                      " * More about it, which the table leaves out.\n */\nint x;\n")
    assert shim_layout.head(shim_layout.opening_paragraph(source)) == \
        "Copies through a ring of pinned buffers"


def test_a_list_under_the_opening_sentence_ends_its_paragraph(tmp_path: Path) -> None:
    source = tmp_path / "release.c"
    source.write_text("/* The release sequence, whatever asked for it:\n"
                      " *   1. close the gate (no new work);\n *   2. synchronize.\n */\n")
    assert shim_layout.head(shim_layout.opening_paragraph(source)) == \
        "The release sequence, whatever asked for it"


def test_a_long_sentence_is_cut_at_its_first_semicolon(tmp_path: Path) -> None:
    source = tmp_path / "transfer.py"
    source.write_text('"""One context\'s share of a move: its ranges prefetched; on the way out, '
                      'its free ranges discarded first."""\n')
    assert shim_layout.head(shim_layout.opening_paragraph(source)) == \
        "One context's share of a move: its ranges prefetched"


def test_a_source_without_an_opening_comment_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "bare.c"
    source.write_text("#include <stddef.h>\nint x;\n")
    with pytest.raises(shim_layout.NoOpeningComment, match="bare.c"):
        shim_layout.opening_paragraph(source)


def test_a_pipe_in_a_head_does_not_split_the_table(tmp_path: Path) -> None:
    (tmp_path / "copy_out.c").write_text("/* KIWI_EVICT_COPY=pinned|pageable: copies. */\n")
    assert r"pinned\|pageable" in shim_layout.layout(tmp_path)
