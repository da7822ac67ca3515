"""How clients are named to people: the display name with its user, cut to fit a column.

A kernel registers under its Jupyter kernel id (the key the panel finds it by) and shows its
notebook's path as its display name. Every text view (the waiting line, ``%kiwi status``,
``kiwictl status``) names a client with ``who``, which shows a notebook path too long for the
view as its folder and file name (``shorten_path``); the panel cuts with CSS
(``text-overflow: ellipsis``), which also never hides a cut. The status document always carries
the whole display name.
"""

from __future__ import annotations

import re
from typing import Any

ELLIPSIS = "…"

#: A Jupyter kernel id: a kernel with no notebook (started outside a Jupyter session) registers
#: under it alone, and its first group is enough to tell kernels apart (the panel does the same).
_KERNEL_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.I)

#: Where a name may be cut: after a path separator or between words.
_BOUNDARIES = " /\\-_."


def shorten(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters; a cut is always shown with an ellipsis.

    A path keeps its end (the file name matters most): ``…/runs/train.ipynb``. Other text keeps
    its start, cut at a word boundary: ``Training the large…``. Only a single word too long for
    the width is cut inside the word, and then the ellipsis says so.
    """
    if width < 1:
        raise ValueError("width must be at least 1")
    if len(text) <= width:
        return text
    room = width - len(ELLIPSIS)
    if room <= 0:
        return ELLIPSIS[:width]
    if "/" in text.rstrip("/"):
        tail = _path_tail(text, room)
        if tail:
            return ELLIPSIS + tail
    head = text[:room]
    cut = max(head.rfind(c) for c in _BOUNDARIES)
    if text[room] in _BOUNDARIES:
        cut = room  # the cut falls exactly between two words
    if cut > room // 2:
        head = head[:cut]
    head = head.rstrip(_BOUNDARIES) or text[:room]
    return head + ELLIPSIS


def _path_tail(text: str, room: int) -> str:
    """The longest end of the path, starting at a separator, that fits in ``room``."""
    best = ""
    for index, char in enumerate(text):
        if char == "/" and len(text) - index <= room:
            best = text[index:]
            break
    return best


def shorten_path(path: str, width: int) -> str:
    """A notebook's path for a text view, in at most ``width`` characters: whole when it fits,
    else its folder and file name, ``…/experiments/train.ipynb``, whatever the view's width, so
    that a notebook reads the same in every view; then ``…/train.ipynb``; then the start of a
    file name too long even alone (``…/Fine-tuning a large…``), never the start of the path,
    which says least. Text that is not a path is cut as ``shorten`` cuts it."""
    parts = path.rstrip("/").split("/")
    if len(path) <= width or len(parts) <= 2:  # no folder to leave out but ~ or the root
        return shorten(path, width)
    for kept in (parts[-2:], parts[-1:]):
        if len(kept) < len(parts) and all(kept):
            tail = ELLIPSIS + "/" + "/".join(kept)
            if len(tail) <= width:
                return tail
    room = width - len(ELLIPSIS + "/")
    if room < len(ELLIPSIS) + 3:  # too narrow for a recognisable start: cut as any text
        return shorten(path, width)
    return ELLIPSIS + "/" + shorten(parts[-1], room)


def shorten_to_bytes(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` UTF-8 bytes, cut as ``shorten`` cuts (for bounds that count
    bytes, like the daemon's on names)."""
    width = len(text)
    while width > 1 and len(shorten(text, width).encode("utf-8", "surrogatepass")) > limit:
        width -= 1
    return shorten(text, width)


#: A kernel known only by its Jupyter id is shown as this and the id's first characters.
KERNEL_ID_PREFIX = "kernel "
KERNEL_ID_SHOWN = 8


def shown_name(name: str, display: str | None) -> str:
    """What people call a client: its display name (a notebook's path), else its name, a bare
    kernel id as ``kernel 3f2a9c1e``."""
    if display and display != name:
        return display
    return KERNEL_ID_PREFIX + name[:KERNEL_ID_SHOWN] if _KERNEL_ID.match(name) else name


def label(name: str, display: str | None, user: str | None, viewer: str | None = None) -> str:
    """A client as every view names it (kiwictl, ``%kiwi``, the waiting line, the daemon's
    log and the panel, which has the same rule in TypeScript): ``shown_name``, with its user in
    brackets unless that is the viewer's own (``train.ipynb (alice)`` to bob; to alice, and in
    every one of her views, ``train.ipynb``). The daemon's log has no viewer: always the user."""
    shown = shown_name(name, display)
    return f"{shown} ({user})" if user and user != viewer else shown


#: [name, display name, user, viewer] -> ``label``: the panel's spec checks its own rule on
#: these (nodeside/formats.py writes them for it).
LABEL_EXAMPLES: tuple[tuple[str, str | None, str | None, str | None], ...] = (
    ("3f2a9c1e-0b7d-4e55-9a61-5d2f7c8e9a01", "kiwi-demo.ipynb", "ada", "ada"),
    ("3f2a9c1e-0b7d-4e55-9a61-5d2f7c8e9a01", "kiwi-demo.ipynb", "ada", "bob"),
    ("3f2a9c1e-0b7d-4e55-9a61-5d2f7c8e9a01", "3f2a9c1e-0b7d-4e55-9a61-5d2f7c8e9a01", "ada",
     None),
    ("3f2a9c1e-0b7d-4e55-9a61-5d2f7c8e9a01", None, None, None),
    ("trainer", None, "root", None),
    ("trainer", "trainer", None, None),
    ("worker-7", "runs/forecast.ipynb", "root", "root"),
)


def display_name(client: dict[str, Any]) -> str:
    """``shown_name`` of a client of the status document."""
    name = str(client.get("name") or client.get("id") or "?")
    shown = client.get("display_name")
    return shown_name(name, str(shown) if shown else None)


def who(client: dict[str, Any], width: int | None = None, viewer: str | None = None) -> str:
    """``label`` of a client of the status document, cut to ``width`` if given; the user part
    is kept whole while there is room for a name beside it."""
    name, user = display_name(client), client.get("user")
    suffix = f" ({user})" if user and user != viewer else ""
    if width is None:
        return name + suffix
    if len(suffix) > width // 2:
        return shorten(name + suffix, width)
    return shorten_path(name, width - len(suffix)) + suffix


def state_word(client: dict[str, Any]) -> str:
    """A client's state for a text view: ``paused`` for a holder waiting for its turn (taking
    turns), else the status document's ``idle``, ``waiting`` or ``holding``."""
    return "paused" if client.get("paused") else client.get("state", "")


def names_by_id(document: dict[str, Any], width: int | None = None,
                viewer: str | None = None) -> dict[str, str]:
    """Client id -> ``who`` for every client of a status document."""
    return {c["id"]: who(c, width, viewer) for c in document.get("clients", [])}


def current_user() -> str | None:
    """Who looks at a text view: this process's user, whose own clients need no "(user)"."""
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a uid with no name (a container's)
        return None
