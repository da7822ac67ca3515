"""``nodeside/protocol/names.py``: each op, error code, feature and reason as a ``Final``
constant, so that code names them (and mypyc inlines them) instead of spelling strings."""

from __future__ import annotations

import textwrap

from nodeside.protocol import messages as m

HEADER = '''"""The protocol's names, generated from ``messages.py`` by ``python -m
nodeside.protocol.generate``: edit the table there and run it, never this file."""

from __future__ import annotations

from typing import Final
'''


def _comment(text: str, indent: str = "") -> list[str]:
    return textwrap.wrap(text, 100 - len(indent) - 4, initial_indent=f"{indent}#: ",
                         subsequent_indent=f"{indent}#: ")


def _literal(value: int | str) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value)


def _constant(const: str, value: int | str, doc: str) -> list[str]:
    return [*_comment(doc), f"{const}: Final = {_literal(value)}"]


def _rule(title: str) -> list[str]:
    head = f"# -- {title} "
    return ["", head + "-" * (100 - len(head)), ""]


def answered(message: m.Message) -> str:
    """Who sends it and when, in words: "Reply to acquire, release; and event"."""
    if message.sender == "request":
        return "Request"
    every = {r.op for r in m.requests()}
    said = "any request" if set(message.answers) == every else ", ".join(message.answers)
    reply = f"Reply to {said}" if message.answers else ""
    if message.event:
        return f"{reply}; and event" if reply else "Event"
    return reply


def _group(title: str, words: tuple[m.Word, ...], set_name: str, set_doc: str,
           members: tuple[m.Word, ...] | None = None) -> list[str]:
    """The words' constants, then the set of them (or of ``members``) as ``set_name``."""
    lines = _rule(title)
    for word in words:
        lines += _constant(word.const, word.value, word.doc)
    listed = ", ".join(w.const for w in (words if members is None else members))
    lines += _comment(set_doc)
    lines += _wrapped(f"{set_name}: Final = frozenset({{", listed, "})")
    return lines


def _wrapped(head: str, items: str, tail: str) -> list[str]:
    one = f"{head}{items}{tail}"
    if len(one) <= 100:
        return [one]
    body = textwrap.wrap(items, 96, initial_indent="    ", subsequent_indent="    ")
    return [head, *body, tail]


def _values(const: str, values: tuple[str, ...], doc: str) -> list[str]:
    # Typed out: mypyc's type check cannot infer them through the scheduler's import cycle.
    listed = ", ".join(_literal(v) for v in values)
    return [*_comment(doc), f"{const}: Final[tuple[str, ...]] = ({listed})"]


def render() -> str:
    names: list[str] = []
    lines = [HEADER.rstrip("\n"), ""]
    for constant in m.CONSTANTS:
        lines += _constant(constant.const, constant.value, constant.doc)
        names.append(constant.const)
    lines += _values("MODES", m.MODES, "The scheduler's modes (``set_mode``).")
    lines += _values("PRIORITIES", m.PRIORITIES, "A client's priorities (``register``), "
                                                  "highest first.")
    lines += _values("EVICTORS", m.EVICTORS, "How a client's memory leaves the GPU "
                                             "(``register``'s ``evict``).")
    names += ["MODES", "PRIORITIES", "EVICTORS"]

    requests = m.requests()
    lines += _rule("requests a client sends")
    lines += textwrap.wrap("Each may carry an integer \"seq\"; the reply to it carries the same "
                           "\"seq\", so a client can match replies to requests while events "
                           "arrive in between.", 96, initial_indent="# ", subsequent_indent="# ")
    lines.append("")
    for message in requests:
        lines += _constant(message.const, message.op, f"Answered with {message.doc}")
    lines += _wrapped("REQUESTS: Final = frozenset({", ", ".join(r.const for r in requests),
                      "})")
    lines += _comment("Each request's fields as (name, type, required), the types those of "
                      "messages.TYPES: what wire.check_request checks.")
    lines.append("REQUEST_FIELDS: Final[dict[str, tuple[tuple[str, str, bool], ...]]] = {")
    for message in requests:
        if not message.fields:
            continue
        fields = [f'("{f.name}", "{f.type}", {f.required})' for f in message.fields]
        one = f"    {message.const}: ({', '.join(fields)}{',' if len(fields) == 1 else ''}),"
        if len(one) <= 100:
            lines.append(one)
        else:
            lines += [f"    {message.const}: (", *(f"        {f}," for f in fields), "    ),"]
    lines.append("}")
    lines += _rule("what the daemon sends: replies (with the request's seq), events (without)")
    for message in m.daemon_messages():
        lines += _constant(message.const, message.op, f"{answered(message)}: {message.doc}.")
    names += [msg.const for msg in m.MESSAGES] + ["REQUESTS", "REQUEST_FIELDS"]

    lines += _group("error codes", m.ERRORS, "FATAL_ERRORS",
                    "The codes after which the daemon closes the connection: the peer is not "
                    "speaking this protocol and nothing it sends next can be trusted.",
                    tuple(w for w in m.ERRORS if w.fatal))
    lines += _group("features a client asks for in hello", m.FEATURES, "FEATURES",
                    "Every feature; a client that asks for none hears nothing new.")
    lines += _group("why a holder is asked to drop the GPU (drop, revoked)", m.REASONS,
                    "REASONS", "Every reason.")
    names += [w.const for w in (*m.ERRORS, *m.FEATURES, *m.REASONS)]
    names += ["FATAL_ERRORS", "FEATURES", "REASONS"]

    exported = ", ".join(f'"{name}"' for name in sorted(set(names)))
    lines += ["", *_wrapped("__all__ = [", exported, "]")]
    return "\n".join(lines) + "\n"
