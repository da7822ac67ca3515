"""The shim's decoder of the daemon's lines (nvshare's one message struct, h11's typed events):
the types in ``kiwi_jupyter/shim/client/protocol.h`` (``struct kiwi_message``, one member
struct per message the daemon sends, with the fields the table gives it) and the function that
fills one from a line, ``kiwi_jupyter/shim/client/decode.c``.

A line is read once, into the struct; the client then dispatches on ``op`` and reads typed
members, never the raw line again. Each field is decoded by its type in the table: ``int`` an
integer (``int64_t``), ``number`` a ``double``, ``bool`` a ``bool``, ``str`` text for people
(escapes read, cut with "..." to fit its buffer: no word the protocol names is that long), the
one ``list`` (``features``) a bitmask of the features the table names; an ``object`` (the
status document, which the shim never asks for) is only noted present. ``has`` says which were
there. A line that is no JSON object, has no string ``op`` or carries a field of another type
than the table's is malformed: the client ignores it, and says so.
"""

from __future__ import annotations

import textwrap

from nodeside.protocol import messages as m

#: C keywords among the fields' names, and what the members are called instead.
_MEMBER = {"for": "for_name"}
#: Buffer sizes of string fields (NUL included; as the stats keep them, where they do); any
#: other string gets WORD_SIZE.
_TEXT_SIZE = {"message": 256, "warning": 256, "for": 256, "daemon": 64, "client": 32,
              "mode": 8}
WORD_SIZE = 32
_C_TYPE = {"int": "int64_t", "number": "double", "bool": "bool", "list": "unsigned"}


def _daemon_fields() -> list[str]:
    names: list[str] = []
    for message in m.daemon_messages():
        names += [f.name for f in message.fields if f.name not in names]
    return names


def _check_table() -> None:
    lists = {f.name for msg in m.daemon_messages() for f in msg.fields if f.type == "list"}
    if lists - {"features"}:
        raise ValueError(f"the C decoder reads only `features` as a list, not {lists}")
    if len(_daemon_fields()) + 1 > 64:
        raise ValueError("more fields than struct kiwi_message's `has` has bits")


def member(field: m.Field) -> str:
    return _MEMBER.get(field.name, field.name)


def _has(name: str) -> str:
    return f"KIWI_HAS_{name.upper()}"


def _struct(message: m.Message) -> list[str]:
    lines = [f"struct kiwi_msg_{message.const.lower()} {{"]
    for field in message.fields:
        if field.type == "object":
            continue
        if field.type == "str":
            size = _TEXT_SIZE.get(field.name, WORD_SIZE)
            declaration = f"    char {member(field)}[{size}];"
        else:
            declaration = f"    {_C_TYPE[field.type]} {member(field)};"
        doc = field.doc.replace("`", "")
        if doc and len(declaration) + len(doc) + 7 <= 100:
            lines.append(f"{declaration} /* {doc} */")
        elif doc:
            lines += textwrap.wrap(f"{doc} */", 96, initial_indent="    /* ",
                                   subsequent_indent="     * ")
            lines.append(declaration)
        else:
            lines.append(declaration)
    return [*lines, "};"]


def _decoded(message: m.Message) -> list[m.Field]:
    return [f for f in message.fields if f.type != "object"]


def types() -> list[str]:
    """protocol.h's part: the ops the daemon sends, the presence bits, the structs."""
    _check_table()
    lines = ["enum kiwi_daemon_op {",
             "    KIWI_DAEMON_UNKNOWN, /* an op this version does not send a client */"]
    lines += [f"    KIWI_DAEMON_{message.const}," for message in m.daemon_messages()]
    lines += ["};", "", "/* struct kiwi_message's has: the fields the line carried. */",
              f"#define {_has('seq')} (1ull << 0)"]
    for bit, name in enumerate(_daemon_fields(), 1):
        lines.append(f"#define {_has(name)} (1ull << {bit})")
    lines.append("")
    lines += ["/* The features a welcome lists, as bits of its features member. */"]
    for bit, word in enumerate(m.FEATURES):
        lines.append(f"#define KIWI_FEATURE_BIT_{word.const.split('_', 1)[1]} (1u << {bit})")
    lines.append(f"#define KIWI_FEATURE_WORDS {len(m.FEATURES)}")
    for message in m.daemon_messages():
        if _decoded(message):
            lines += ["", *_struct(message)]
    lines += ["", "/* One line from the daemon, decoded (decode.c): op, seq (-1: none), has, and "
              "the", " * members of that op's struct. */", "struct kiwi_message {",
              "    enum kiwi_daemon_op op;", f"    char op_name[{WORD_SIZE}]; /* as read */",
              "    int64_t seq;", "    uint64_t has;", "    union {"]
    for message in m.daemon_messages():
        if _decoded(message):
            name = message.const.lower()
            lines.append(f"        struct kiwi_msg_{name} {name};")
    lines += ["    };", "};", "",
              "enum kiwi_decoded {",
              "    KIWI_DECODED,",
              "    KIWI_DECODE_MALFORMED,  /* not an object, no string op, a field of another "
              "type */",
              "    KIWI_DECODE_UNKNOWN_OP, /* well formed: an op this version does not send a "
              "client */",
              "};"]
    return lines


DECODER_HEAD = """\
/* The daemon's lines, each read once into a struct kiwi_message (protocol.h): the op, the seq
 * and the fields the protocol's table gives that op, each by its type. The client dispatches on
 * the op and reads members (dispatch.c); nothing reads the raw line again.
 *
 * Generated from nodeside/protocol/messages.py by `python -m nodeside.protocol.generate`
 * (nodeside/protocol/render/c_decoder.py): edit the table there and run it, never this file (a
 * test fails while the two differ). Hand-written: the JSON walking below it (wire.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

#define TEXT(member) member, sizeof member

/* Each returns false when the field is there with another type (the line is malformed);
 * a field that is not there is fine, and its bit stays clear. */

static bool read_int(const char *line, const char *key, int64_t *out, uint64_t *has,
                     uint64_t bit)
{
    struct kiwi_json_value value;
    if (!kiwi_json_get(line, key, &value))
        return true;
    char digits[24];
    if (value.kind != 'n' || value.length >= sizeof digits)
        return false;
    memcpy(digits, value.start, value.length);
    digits[value.length] = '\\0';
    char *end;
    errno = 0;
    long long number = strtoll(digits, &end, 10);
    if (errno || end != digits + value.length)
        return false;
    *out = number;
    *has |= bit;
    return true;
}

static bool read_number(const char *line, const char *key, double *out, uint64_t *has,
                        uint64_t bit)
{
    struct kiwi_json_value value;
    if (!kiwi_json_get(line, key, &value))
        return true;
    if (!kiwi_json_number(line, key, out))
        return false;
    *has |= bit;
    return true;
}

static bool read_bool(const char *line, const char *key, bool *out, uint64_t *has,
                      uint64_t bit)
{
    struct kiwi_json_value value;
    if (!kiwi_json_get(line, key, &value))
        return true;
    if (value.kind != 't' && value.kind != 'f')
        return false;
    *out = value.kind == 't';
    *has |= bit;
    return true;
}

static bool read_text(const char *line, const char *key, char *out, size_t size,
                      uint64_t *has, uint64_t bit)
{
    struct kiwi_json_value value;
    if (!kiwi_json_get(line, key, &value))
        return true;
    if (value.kind != 's' || !kiwi_json_text(line, key, out, size))
        return false;
    *has |= bit;
    return true;
}

@FEATURE_WORDS@

/* The features a list names, as bits; a feature this version does not know is left out. */
static bool read_features(const char *line, const char *key, unsigned *out, uint64_t *has,
                          uint64_t bit)
{
    struct kiwi_json_value value;
    if (!kiwi_json_get(line, key, &value))
        return true;
    if (value.kind != 'o' || value.start[0] != '[')
        return false;
    *out = kiwi_json_words(value.start, value.length, feature_words, KIWI_FEATURE_WORDS);
    *has |= bit;
    return true;
}
"""


def _reader(field: m.Field) -> str:
    target = f"m->{member(field)}"
    key, bit = f'"{field.name}"', _has(field.name)
    if field.type == "str":
        return f"read_text(line, {key}, TEXT({target}), has, {bit})"
    if field.type == "list":
        return f"read_features(line, {key}, &{target}, has, {bit})"
    return f"read_{field.type}(line, {key}, &{target}, has, {bit})"


def _statement(reader: str) -> list[str]:
    line = f"        typed = typed && {reader};"
    if len(line) <= 100:
        return [line]
    head, tail = reader.split(", TEXT(", 1) if ", TEXT(" in reader else reader.split(", &", 1)
    joint = ", TEXT(" if ", TEXT(" in reader else ", &"
    return [f"        typed = typed && {head},", f"                         {joint[2:]}{tail};"]


def render() -> str:
    """decode.c."""
    _check_table()
    words = ["/* The words of the list field, in the order of the KIWI_FEATURE_BIT_ bits. */",
             "static const char *const feature_words[KIWI_FEATURE_WORDS] = {",
             *(f"    KIWI_{word.const}," for word in m.FEATURES), "};"]
    lines = [DECODER_HEAD.rstrip("\n").replace("@FEATURE_WORDS@", "\n".join(words)), "",
             "enum kiwi_decoded kiwi_message_decode(const char *line, struct kiwi_message *out)",
             "{",
             "    memset(out, 0, sizeof *out);",
             "    out->seq = -1;",
             "    struct kiwi_json_value op;",
             "    if (!kiwi_json_object(line) || !kiwi_json_get(line, KIWI_FIELD_OP, &op) ||",
             "        op.kind != 's' ||",
             "        !kiwi_json_text(line, KIWI_FIELD_OP, out->op_name, sizeof out->op_name))",
             "        return KIWI_DECODE_MALFORMED;",
             f"    if (!read_int(line, KIWI_FIELD_SEQ, &out->seq, &out->has, {_has('seq')}) ||",
             f"        ((out->has & {_has('seq')}) && out->seq < 0))",
             "        return KIWI_DECODE_MALFORMED;",
              "    uint64_t *has = &out->has;",
             "    bool typed = true;"]
    first = True
    for message in m.daemon_messages():
        keyword = "if" if first else "} else if"
        first = False
        lines.append(f"    {keyword} (strcmp(out->op_name, KIWI_OP_{message.const}) == 0) {{")
        lines.append(f"        out->op = KIWI_DAEMON_{message.const};")
        if _decoded(message):
            lines.append(f"        struct kiwi_msg_{message.const.lower()} *m = "
                         f"&out->{message.const.lower()};")
        for field in _decoded(message):
            lines += _statement(_reader(field))
        objects = [f for f in message.fields if f.type == "object"]
        for field in objects:
            lines.append(f'        if (kiwi_json_get(line, "{field.name}", &op))')
            lines.append(f"            *has |= {_has(field.name)};")
    lines += ["    } else {",
              "        return KIWI_DECODE_UNKNOWN_OP;",
              "    }",
              "    return typed ? KIWI_DECODED : KIWI_DECODE_MALFORMED;",
              "}"]
    return "\n".join(lines) + "\n"
