"""docs/protocol.md's tables: requests, replies, events, error codes and reasons. The prose
around them stays hand-written; ``generate.splice`` puts each block between its markers."""

from __future__ import annotations

from collections.abc import Sequence

from nodeside.protocol import document as d
from nodeside.protocol import hold
from nodeside.protocol import messages as m

_TYPE_WORDS = {"list": "list of str"}


def _field(field: m.Field) -> str:
    said = _TYPE_WORDS.get(field.type, field.type)
    if field.required:
        said += ", required"
    if field.doc:
        said += f": {field.doc}"
    return f"`{field.name}` ({said})"


def _fields(message: m.Message) -> str:
    return ", ".join(_field(f) for f in message.fields)


def _table(head: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |"
              for row in rows]
    return "\n".join(lines) + "\n"


def requests() -> str:
    return _table(("op", "fields", "reply"),
                  [(f"`{r.op}`", _fields(r), r.doc) for r in m.requests()])


def replies() -> str:
    rows = []
    for message in m.daemon_messages():
        if message.answers:
            answers = ", ".join(f"`{op}`" for op in message.answers)
            rows.append((f"`{message.op}`", _fields(message), answers, message.doc))
    return _table(("op", "fields", "answers", "meaning"), rows)


def events() -> str:
    return _table(("op", "fields", "meaning"),
                  [(f"`{e.op}`", _fields(e), e.doc) for e in m.daemon_messages()
                   if e.event and e.const != "ERROR"])


def errors() -> str:
    return _table(("code", "when", "connection"),
                  [(f"`{w.value}`", w.doc, "closed" if w.fatal else "open") for w in m.ERRORS])


def reasons() -> str:
    return _table(("reason", "meaning"), [(f"`{w.value}`", w.doc) for w in m.REASONS])


_ADDED_BY = {"evictor": "the checkpoint evictor", "server": "the Jupyter server only",
             "status_line": "only when the document had to be cut",
             "pause_watch": "the daemon where NVML samples each process",
             "memory": "the daemon where clients speak the `memory` feature",
             "tiers": "the daemon where clients speak the `tiers` feature"}


def _key(key: d.Key) -> tuple[str, ...]:
    said = key.type + (" or null" if key.nullable else "")
    if key.values:
        said += ": " + ", ".join(f"`{v}`" for v in key.values)
    notes = [key.doc] if key.doc else []
    if key.contract:
        notes.append("(contract: docs/interfaces.md)")
    if key.added_by:
        notes.append(f"(added by {_ADDED_BY[key.added_by]})")
    return (f"`{key.name}`", said, " ".join(notes))


def document() -> str:
    """One table per part of the status document, the document itself first."""
    out = []
    for part in (d.DOCUMENT, *[p for p in d.PARTS if p is not d.DOCUMENT]):
        out.append(f"{part.interface}: {part.doc}\n\n")
        out.append(_table(("key", "type", "meaning"), [_key(k) for k in part.keys]))
        out.append("\n")
    return "".join(out)[:-1]


def holds() -> str:
    """A client's hold states, then every legal move between them."""
    states = _table(("state", "meaning"), [(f"`{h.name}`", hold.MEANING[h]) for h in hold.Hold])
    moves = _table(("from", "to", "when"),
                   [(f"`{a.name}`", f"`{b.name}`", why) for (a, b), why in hold.MOVES.items()])
    return f"{states}\n{moves}"


def blocks() -> dict[str, str]:
    return {"requests": requests(), "replies": replies(), "events": events(),
            "errors": errors(), "reasons": reasons(), "document": document(),
            "holds": holds()}
