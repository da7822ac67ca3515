"""Names people recognise: display names with their user, cut with an ellipsis, never silently."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodeside.names import (
    ELLIPSIS,
    names_by_id,
    shorten,
    shorten_path,
    shorten_to_bytes,
    who,
)


def test_a_name_that_fits_is_left_whole() -> None:
    assert shorten("analysis.ipynb", 14) == "analysis.ipynb"


def test_a_path_keeps_its_end_from_a_separator() -> None:
    assert shorten("~/projects/vision/experiments/train-resnet.ipynb", 34) == \
        "…/experiments/train-resnet.ipynb"


def test_words_are_cut_between_words() -> None:
    assert shorten("Training the large language model", 20) == "Training the large…"


def test_one_word_too_long_is_cut_inside_it_with_an_ellipsis() -> None:
    assert shorten("supercalifragilistic", 8) == "superca…"


def test_a_file_name_longer_than_the_room_is_cut_with_an_ellipsis() -> None:
    cut = shorten("/data/an-extremely-long-notebook-name.ipynb", 16)
    assert len(cut) <= 16 and cut.endswith(ELLIPSIS)


@given(st.text(min_size=0, max_size=80), st.integers(min_value=1, max_value=60))
def test_a_cut_is_never_longer_than_asked_and_always_shows(text: str, width: int) -> None:
    cut = shorten(text, width)
    assert len(cut) <= width
    assert cut == text or ELLIPSIS in cut


@given(st.lists(st.text(st.characters(blacklist_characters="/"), max_size=30), max_size=8)
       .map("/".join), st.integers(min_value=1, max_value=60))
def test_a_cut_path_is_never_longer_than_asked_and_always_shows(path: str, width: int) -> None:
    cut = shorten_path(path, width)
    assert len(cut) <= width
    assert cut == path or ELLIPSIS in cut


@given(st.text(min_size=1, max_size=400), st.integers(min_value=4, max_value=300))
def test_a_cut_to_bytes_fits_the_byte_bound(text: str, limit: int) -> None:
    cut = shorten_to_bytes(text, limit)
    assert len(cut.encode("utf-8", "surrogatepass")) <= limit or len(cut) == 1
    assert cut == text or ELLIPSIS in cut


def test_who_prefers_the_display_name_and_adds_the_user() -> None:
    assert who({"id": "c1", "name": "3f2a-77", "display_name": "~/a.ipynb",
                "user": "alice"}) == "~/a.ipynb (alice)"
    assert who({"id": "c1", "name": "3f2a-77"}) == "3f2a-77"
    assert who({"id": "c1", "name": "3f2a-77", "display_name": None, "user": None}) == "3f2a-77"


def test_who_cuts_the_name_and_keeps_the_user_whole() -> None:
    client = {"id": "c1", "name": "k", "display_name": "~/projects/deep/notebook.ipynb",
              "user": "alice"}
    assert who(client, 24) == "…/notebook.ipynb (alice)"


NOTEBOOK = "/home/jovyan/work/projects/deep-learning/experiments/train.ipynb"


@pytest.mark.parametrize("width", [28, 36, 40, 60])
def test_a_cut_notebook_path_reads_as_its_folder_and_name_in_every_view(width: int) -> None:
    # kiwictl's holders (60) and table (36), %kiwi and the waiting line (40): one notebook reads
    # the same in each, and no view starts inside a folder name (…/jovyan/work/…).
    assert who({"id": "c1", "name": "k", "display_name": NOTEBOOK}, width) == \
        "…/experiments/train.ipynb"


def test_a_notebook_path_that_fits_is_shown_whole() -> None:
    assert who({"id": "c1", "name": "k", "display_name": "/srv/team/a.ipynb", "user": "ada"},
               40) == "/srv/team/a.ipynb (ada)"


def test_a_notebook_name_too_long_for_the_view_keeps_its_start_not_the_paths() -> None:
    client = {"id": "c1", "name": "k", "user": "ada",
              "display_name": "/home/jovyan/work/Fine-tuning a large model on tickets.ipynb"}
    assert who(client, 30) == "…/Fine-tuning a large… (ada)"


def test_text_views_leave_the_display_name_whole_without_a_width() -> None:
    assert who({"id": "c1", "name": "k", "display_name": NOTEBOOK}) == NOTEBOOK


def test_a_kernel_known_only_by_its_id_is_called_by_its_first_group() -> None:
    kernel_id = "afd00fc2-b218-4c1e-9f3a-0123456789ab"
    assert who({"id": "c1", "name": kernel_id}) == "kernel afd00fc2"
    assert who({"id": "c1", "name": kernel_id, "display_name": kernel_id}) == "kernel afd00fc2"
    assert who({"id": "c1", "name": kernel_id, "display_name": "~/a.ipynb"}) == "~/a.ipynb"


def test_names_by_id_covers_every_client() -> None:
    document = {"clients": [{"id": "c1", "name": "a"}, {"id": "c2", "name": "b", "user": "u"}]}
    assert names_by_id(document) == {"c1": "a", "c2": "b (u)"}


def test_a_width_below_one_is_refused() -> None:
    with pytest.raises(ValueError):
        shorten("x", 0)
