"""``kiwi_jupyter/shim/client/protocol.h``: the protocol's names for the shim's C client, and
the client-side hold table its ``kiwi_hold_move`` checks every move against.

Only macros and ``static inline`` functions: a header included by many files may define no
object (an unused ``static const`` table warns under the shim's ``-Wall``)."""

from __future__ import annotations

import textwrap

from nodeside.protocol import hold
from nodeside.protocol import messages as m
from nodeside.protocol.render import c_decoder

HEADER = """\
/* The Kiwi wire protocol's names and the client's hold table, for the CUDA shim.
 *
 * Generated from nodeside/protocol/messages.py and hold.py by
 * `python -m nodeside.protocol.generate`: edit the table there and run it, never this file (a
 * test fails while the two differ). docs/protocol.md says what each message means.
 */
#ifndef KIWI_PROTOCOL_H
#define KIWI_PROTOCOL_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>
"""


def _comment(text: str) -> list[str]:
    return textwrap.wrap(text, 96, initial_indent="/* ", subsequent_indent=" * ") \
        if len(text) <= 90 else \
        ["/*", *textwrap.wrap(text, 96, initial_indent=" * ", subsequent_indent=" * "), " */"]


def _close(lines: list[str]) -> list[str]:
    if lines[-1] == " */":
        return lines
    lines[-1] += " */"
    return lines


def _section(title: str) -> list[str]:
    return ["", f"/* ---- {title} " + "-" * (88 - len(title)) + " */", ""]


def _define(name: str, value: int | str) -> str:
    literal = f'"{value}"' if isinstance(value, str) else str(value)
    return f"#define {name} {literal}"


def _constants() -> list[str]:
    names = {"VERSION": "KIWI_PROTOCOL_VERSION"}
    lines = _section("limits and defaults")
    for constant in m.CONSTANTS:
        lines += _close(_comment(constant.doc.replace("``", "")))
        lines.append(_define(names.get(constant.const, f"KIWI_{constant.const}"),
                             constant.value))
    return lines


def _ops() -> list[str]:
    lines = _section("ops: what a client sends, then what the daemon sends")
    for message in m.MESSAGES:
        said = " and ".join(message.directions)
        lines.append(f"{_define(f'KIWI_OP_{message.const}', message.op)} /* {said} */")
    return lines


def _fields() -> list[str]:
    names = sorted({"op", "seq", *(f.name for message in m.MESSAGES for f in message.fields)})
    lines = _section("field names (every message has an op; requests and replies may have a seq)")
    lines += [_define(f"KIWI_FIELD_{name.upper()}", name) for name in names]
    return lines


def _values() -> list[str]:
    lines = _section("the values of mode, priority and evict")
    for prefix, values in (("MODE", m.MODES), ("PRIORITY", m.PRIORITIES),
                           ("EVICT", m.EVICTORS)):
        lines += [_define(f"KIWI_{prefix}_{value.upper()}", value) for value in values]
    return lines


def _words(title: str, prefix: str, words: tuple[m.Word, ...]) -> list[str]:
    lines = _section(title)
    for word in words:
        lines.append(_define(f"KIWI_{word.const}" if prefix == "" else
                             f"KIWI_{prefix}{word.const.split('_', 1)[1]}", word.value))
    return lines


def _fatal() -> list[str]:
    fatal = [w for w in m.ERRORS if w.fatal]
    tests = " ||\n           ".join(f"strcmp(code, KIWI_{w.const}) == 0" for w in fatal)
    return ["", "/* The daemon closes the connection after these errors. */",
            "static inline bool kiwi_error_fatal(const char *code)", "{",
            f"    return {tests};", "}"]


def _holds() -> list[str]:
    states = list(hold.Hold)
    lines = _section("the client's hold (nodeside/protocol/hold.py)")
    lines.append("enum kiwi_hold_state {")
    for state in states:
        meaning = hold.MEANING[state].replace("`", "") + " */"
        lines += textwrap.wrap(meaning, 92, initial_indent="    /* ",
                               subsequent_indent="     * ")
        lines.append(f"    KIWI_HOLD_{state.name},")
    lines += ["};", f"#define KIWI_HOLD_STATES {len(states)}", ""]
    lines += ["static inline const char *kiwi_hold_state_name(enum kiwi_hold_state state)", "{",
              "    switch (state) {"]
    for state in states:
        lines.append(f'    case KIWI_HOLD_{state.name}: return "{state.name}";')
    lines += ["    }", '    return "?";', "}", ""]
    lines += ["/* Every legal move of the hold; anything else is a bug in the client. */",
              "static inline bool kiwi_hold_legal(enum kiwi_hold_state from, "
              "enum kiwi_hold_state to)", "{", "    switch (from) {"]
    for before in states:
        targets = [after for after in states if hold.legal(before, after)]
        if not targets:
            continue
        lines.append(f"    case KIWI_HOLD_{before.name}:")
        for after in targets:
            lines += textwrap.wrap(f"-> {after.name}: {hold.MOVES[(before, after)]} */", 92,
                                   initial_indent="        /* ",
                                   subsequent_indent="         * ")
        test = " ||\n               ".join(f"to == KIWI_HOLD_{after.name}" for after in targets)
        lines.append(f"        return {test};")
    lines += ["    }", "    return false;", "}"]
    return lines


def render() -> str:
    lines = [HEADER.rstrip("\n")]
    lines += _constants()
    lines += _ops()
    lines += _fields()
    lines += _values()
    lines += _words("error codes", "E_", m.ERRORS)
    lines += _fatal()
    lines += _words("features a client may ask for in hello", "FEATURE_", m.FEATURES)
    lines += _words("why a holder is asked to drop the GPU", "REASON_", m.REASONS)
    lines += _holds()
    lines += _section("the daemon's messages, decoded (decode.c)")
    lines += c_decoder.types()
    lines += ["", "#endif"]
    return "\n".join(lines) + "\n"
