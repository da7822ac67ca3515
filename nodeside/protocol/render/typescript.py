"""``labextension/src/document.ts``: the status document's types for the panel, from
``document.py``; ``tokens.ts`` re-exports them beside the panel's own types."""

from __future__ import annotations

import textwrap

from nodeside.protocol import document as d

HEADER = """\
/**
 * The status document (CONTRACT section 5) as the server extension returns it.
 *
 * Generated from nodeside/protocol/document.py by `python -m nodeside.protocol.generate`: edit
 * the table there and run it, never this file (a test fails while the two differ).
 */
"""

_SCALARS = {"int": "number", "number": "number", "str": "string", "bool": "boolean",
            "object": "Record<string, string>"}
#: Keys whose values have a name of their own in the panel's code.
_NAMED = {("IClientStatus", "state"): "ClientState", ("IStatusDocument", "mode"): "SchedulerMode"}


def _type(part: d.Part, key: d.Key) -> str:
    if (part.interface, key.name) in _NAMED:
        said = _NAMED[(part.interface, key.name)]
    elif key.values:
        said = " | ".join(f"'{v}'" for v in key.values)
    elif key.type.startswith("list["):
        inner = key.type[5:-1]
        said = f"{_SCALARS.get(inner, inner)}[]"
    else:
        said = _SCALARS.get(key.type, key.type)  # a part of its own: its interface
    return f"{said} | null" if key.nullable else said


def _optional(part: d.Part, key: d.Key) -> bool:
    if key.always:
        return False
    if not key.contract:
        return True
    return part.partial and key.added_by != "server"


def _doc(text: str, indent: str = "  ") -> list[str]:
    if not text:
        return []
    one = f"{indent}/** {text} */"
    if len(one) <= 100:
        return [one]
    wrapped = textwrap.wrap(text, 96 - len(indent), initial_indent=f"{indent} * ",
                            subsequent_indent=f"{indent} * ")
    return [f"{indent}/**", *wrapped, f"{indent} */"]


def _interface(part: d.Part) -> list[str]:
    lines = [*_doc(part.doc, ""), f"export interface {part.interface} {{"]
    for key in part.keys:
        lines += _doc(key.doc)
        mark = "?" if _optional(part, key) else ""
        lines.append(f"  {key.name}{mark}: {_type(part, key)};")
    return [*lines, "}"]


def render() -> str:
    states = " | ".join(f"'{s}'" for s in d.CLIENT_STATES)
    modes = " | ".join(f"'{m}'" for m in d.MODES)
    lines = [HEADER.rstrip("\n"), "",
             "/** A client's state: holding includes a holder asked to give the GPU back. */",
             f"export type ClientState = {states};", "",
             "/** The scheduler's mode. */", f"export type SchedulerMode = {modes};"]
    for part in d.PARTS:
        lines += ["", *_interface(part)]
    return "\n".join(lines) + "\n"
