/* Protocol lines (docs/protocol.md): the daemon's messages are flat JSON objects, one per line,
 * whose values are strings, numbers or booleans. This reads them without a JSON library: it
 * walks the top-level keys, skipping over any nested value, so a key inside a string or a
 * nested object is never mistaken for a field; decode.c, generated from the protocol's table,
 * reads each line once through it into a typed message. It writes the few values a request
 * carries that are more than a number: a quoted string, and the memory feature's figures.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

static const char *skip_space(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
        p++;
    return p;
}

/* p at an opening quote; returns the position after the closing one, or NULL. */
static const char *skip_string(const char *p)
{
    for (p++; *p; p++) {
        if (*p == '\\') {
            if (!*++p)
                return NULL;
        } else if (*p == '"') {
            return p + 1;
        }
    }
    return NULL;
}

/* Skips one value of any kind; returns the position after it, or NULL when malformed. */
static const char *skip_value(const char *p)
{
    if (*p == '"')
        return skip_string(p);
    if (*p == '{' || *p == '[') {
        int depth = 0;
        while (*p) {
            if (*p == '"') {
                p = skip_string(p);
                if (!p)
                    return NULL;
                continue;
            }
            if (*p == '{' || *p == '[')
                depth++;
            else if (*p == '}' || *p == ']')
                depth--;
            p++;
            if (depth == 0)
                return p;
        }
        return NULL;
    }
    const char *start = p;
    while (*p && *p != ',' && *p != '}' && *p != ' ')
        p++;
    return p > start ? p : NULL;
}

bool kiwi_json_get(const char *line, const char *key, struct kiwi_json_value *out)
{
    size_t key_length = strlen(key);
    const char *p = skip_space(line);
    if (*p++ != '{')
        return false;
    for (;;) {
        p = skip_space(p);
        if (*p != '"')
            return false;
        const char *name = p + 1;
        const char *after = skip_string(p);
        if (!after)
            return false;
        bool match = (size_t)(after - 1 - name) == key_length &&
                     memcmp(name, key, key_length) == 0;
        p = skip_space(after);
        if (*p++ != ':')
            return false;
        p = skip_space(p);
        const char *end = skip_value(p);
        if (!end)
            return false;
        if (match) {
            out->kind = *p == '"' ? 's' : *p == '{' || *p == '[' ? 'o'
                      : *p == 't' ? 't' : *p == 'f' ? 'f' : *p == 'n' ? 'z' : 'n';
            out->start = out->kind == 's' ? p + 1 : p;
            out->length = (size_t)(end - p) - (out->kind == 's' ? 2 : 0);
            return true;
        }
        p = skip_space(end);
        if (*p++ != ',')
            return false;
    }
}

bool kiwi_json_object(const char *line)
{
    const char *p = skip_space(line);
    if (*p++ != '{')
        return false;
    p = skip_space(p);
    if (*p == '}')
        return *skip_space(p + 1) == '\0';
    for (;;) {
        if (*p != '"' || !(p = skip_string(p)))
            return false;
        p = skip_space(p);
        if (*p++ != ':')
            return false;
        if (!(p = skip_value(skip_space(p))))
            return false;
        p = skip_space(p);
        if (*p == '}')
            return *skip_space(p + 1) == '\0';
        if (*p++ != ',')
            return false;
        p = skip_space(p);
    }
}

unsigned kiwi_json_words(const char *list, size_t length, const char *const *words, int count)
{
    unsigned found = 0;
    const char *p = list + 1, *end = list + length;
    while (p < end) {
        p = skip_space(p);
        if (*p != '"') {
            p++; /* a comma, the closing bracket, or a value that is no word */
            continue;
        }
        const char *after = skip_string(p);
        if (!after || after > end)
            break;
        size_t word_length = (size_t)(after - p - 2);
        for (int i = 0; i < count; i++)
            if (strlen(words[i]) == word_length && memcmp(p + 1, words[i], word_length) == 0)
                found |= 1u << i;
        p = after;
    }
    return found;
}

static unsigned hex_digit(char c)
{
    return c >= '0' && c <= '9' ? (unsigned)(c - '0')
           : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
           : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10) : 0;
}

/* One character of a JSON string at *p (an escape read whole), for people to read; moves *p. */
static char readable(const char **p, const char *end)
{
    char c = *(*p)++;
    if (c == '\\' && *p < end) {
        char escaped = *(*p)++;
        if (escaped != 'u')
            return escaped == 'n' || escaped == 't' || escaped == 'r' ? ' ' : escaped;
        unsigned code = 0;
        for (int digit = 0; digit < 4 && *p < end; digit++)
            code = code * 16 + hex_digit(*(*p)++);
        return code >= 0x20 && code < 0x7f ? (char)code : '?';
    }
    return (unsigned char)c < 0x20 ? ' ' : c;
}

bool kiwi_json_text(const char *line, const char *key, char *buf, size_t size)
{
    struct kiwi_json_value value;
    if (size < 4 || !kiwi_json_get(line, key, &value) || value.kind != 's')
        return false;
    const char *p = value.start, *end = value.start + value.length;
    size_t n = 0;
    while (p < end && n + 1 < size)
        buf[n++] = readable(&p, end);
    if (p < end) { /* cut short: say so */
        n = size - 4;
        memcpy(buf + n, "...", 3);
        n += 3;
    }
    buf[n] = '\0';
    return true;
}

bool kiwi_json_number(const char *line, const char *key, double *out)
{
    struct kiwi_json_value value;
    if (!kiwi_json_get(line, key, &value) || value.kind != 'n')
        return false;
    char *end;
    *out = strtod(value.start, &end);
    return end == value.start + value.length;
}

bool kiwi_json_quote(char *buf, size_t size, const char *text)
{
    size_t n = strlen(buf);
    const char *hex = "0123456789abcdef";
    if (n + 1 >= size)
        return false;
    buf[n++] = '"';
    for (const unsigned char *c = (const unsigned char *)text; *c; c++) {
        char escaped[7] = {0};
        if (*c == '"' || *c == '\\') {
            escaped[0] = '\\';
            escaped[1] = (char)*c;
        } else if (*c < 0x20) {
            memcpy(escaped, "\\u00", 4);
            escaped[4] = hex[*c >> 4];
            escaped[5] = hex[*c & 15];
        } else {
            escaped[0] = (char)*c;
        }
        size_t length = strlen(escaped);
        if (n + length + 2 > size)
            return false;
        memcpy(buf + n, escaped, length);
        n += length;
    }
    buf[n++] = '"';
    buf[n] = '\0';
    return true;
}

void kiwi_json_tiers(char *fields, size_t size, const struct kiwi_residency *where)
{
    size_t n = strlen(fields);
    snprintf(fields + n, size - n, ",\"" KIWI_FIELD_DISK "\":%llu,\"" KIWI_FIELD_PINNED "\":%llu",
             (unsigned long long)where->disk,
             (unsigned long long)(where->shadow_pinned + where->staging));
}

void kiwi_json_residency(char *fields, size_t size, const struct kiwi_residency *where)
{
    size_t n = strlen(fields);
    snprintf(fields + n, size - n,
             "%s\"" KIWI_FIELD_RESIDENT "\":%llu,\"" KIWI_FIELD_HOST "\":%llu,\""
             KIWI_FIELD_SHADOW "\":%llu", n ? "," : "", (unsigned long long)where->resident,
             (unsigned long long)where->host, (unsigned long long)where->shadow);
}
