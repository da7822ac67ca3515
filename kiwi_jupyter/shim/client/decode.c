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
    digits[value.length] = '\0';
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

/* The words of the list field, in the order of the KIWI_FEATURE_BIT_ bits. */
static const char *const feature_words[KIWI_FEATURE_WORDS] = {
    KIWI_FEATURE_POSITION,
    KIWI_FEATURE_CHANGES,
    KIWI_FEATURE_MEMORY,
    KIWI_FEATURE_TIERS,
};

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

enum kiwi_decoded kiwi_message_decode(const char *line, struct kiwi_message *out)
{
    memset(out, 0, sizeof *out);
    out->seq = -1;
    struct kiwi_json_value op;
    if (!kiwi_json_object(line) || !kiwi_json_get(line, KIWI_FIELD_OP, &op) ||
        op.kind != 's' ||
        !kiwi_json_text(line, KIWI_FIELD_OP, out->op_name, sizeof out->op_name))
        return KIWI_DECODE_MALFORMED;
    if (!read_int(line, KIWI_FIELD_SEQ, &out->seq, &out->has, KIWI_HAS_SEQ) ||
        ((out->has & KIWI_HAS_SEQ) && out->seq < 0))
        return KIWI_DECODE_MALFORMED;
    uint64_t *has = &out->has;
    bool typed = true;
    if (strcmp(out->op_name, KIWI_OP_WELCOME) == 0) {
        out->op = KIWI_DAEMON_WELCOME;
        struct kiwi_msg_welcome *m = &out->welcome;
        typed = typed && read_int(line, "version", &m->version, has, KIWI_HAS_VERSION);
        typed = typed && read_text(line, "daemon", TEXT(m->daemon), has, KIWI_HAS_DAEMON);
        typed = typed && read_int(line, "max_message", &m->max_message, has, KIWI_HAS_MAX_MESSAGE);
        typed = typed && read_text(line, "mode", TEXT(m->mode), has, KIWI_HAS_MODE);
        typed = typed && read_number(line, "tq", &m->tq, has, KIWI_HAS_TQ);
        typed = typed && read_features(line, "features", &m->features, has, KIWI_HAS_FEATURES);
    } else if (strcmp(out->op_name, KIWI_OP_REGISTERED) == 0) {
        out->op = KIWI_DAEMON_REGISTERED;
        struct kiwi_msg_registered *m = &out->registered;
        typed = typed && read_text(line, "client", TEXT(m->client), has, KIWI_HAS_CLIENT);
        typed = typed && read_int(line, "gpu", &m->gpu, has, KIWI_HAS_GPU);
        typed = typed && read_text(line, "mode", TEXT(m->mode), has, KIWI_HAS_MODE);
        typed = typed && read_number(line, "tq", &m->tq, has, KIWI_HAS_TQ);
        typed = typed && read_text(line, "evict", TEXT(m->evict), has, KIWI_HAS_EVICT);
        typed = typed && read_text(line, "pool", TEXT(m->pool), has, KIWI_HAS_POOL);
        typed = typed && read_text(line, "priority", TEXT(m->priority), has, KIWI_HAS_PRIORITY);
        typed = typed && read_text(line, "warning", TEXT(m->warning), has, KIWI_HAS_WARNING);
        typed = typed && read_int(line, "pin_budget", &m->pin_budget, has, KIWI_HAS_PIN_BUDGET);
    } else if (strcmp(out->op_name, KIWI_OP_GRANT) == 0) {
        out->op = KIWI_DAEMON_GRANT;
        struct kiwi_msg_grant *m = &out->grant;
        typed = typed && read_int(line, "gpu", &m->gpu, has, KIWI_HAS_GPU);
        typed = typed && read_number(line, "quantum", &m->quantum, has, KIWI_HAS_QUANTUM);
    } else if (strcmp(out->op_name, KIWI_OP_WAITING) == 0) {
        out->op = KIWI_DAEMON_WAITING;
        struct kiwi_msg_waiting *m = &out->waiting;
        typed = typed && read_int(line, "position", &m->position, has, KIWI_HAS_POSITION);
    } else if (strcmp(out->op_name, KIWI_OP_RELEASED) == 0) {
        out->op = KIWI_DAEMON_RELEASED;
        struct kiwi_msg_released *m = &out->released;
        typed = typed && read_bool(line, "evict", &m->evict, has, KIWI_HAS_EVICT);
    } else if (strcmp(out->op_name, KIWI_OP_DROP) == 0) {
        out->op = KIWI_DAEMON_DROP;
        struct kiwi_msg_drop *m = &out->drop;
        typed = typed && read_int(line, "gpu", &m->gpu, has, KIWI_HAS_GPU);
        typed = typed && read_text(line, "reason", TEXT(m->reason), has, KIWI_HAS_REASON);
        typed = typed && read_bool(line, "evict", &m->evict, has, KIWI_HAS_EVICT);
        typed = typed && read_number(line, "grace", &m->grace, has, KIWI_HAS_GRACE);
    } else if (strcmp(out->op_name, KIWI_OP_REVOKED) == 0) {
        out->op = KIWI_DAEMON_REVOKED;
        struct kiwi_msg_revoked *m = &out->revoked;
        typed = typed && read_int(line, "gpu", &m->gpu, has, KIWI_HAS_GPU);
        typed = typed && read_text(line, "reason", TEXT(m->reason), has, KIWI_HAS_REASON);
    } else if (strcmp(out->op_name, KIWI_OP_PAUSE) == 0) {
        out->op = KIWI_DAEMON_PAUSE;
        struct kiwi_msg_pause *m = &out->pause;
        typed = typed && read_int(line, "gpu", &m->gpu, has, KIWI_HAS_GPU);
    } else if (strcmp(out->op_name, KIWI_OP_RESUME) == 0) {
        out->op = KIWI_DAEMON_RESUME;
        struct kiwi_msg_resume *m = &out->resume;
        typed = typed && read_int(line, "gpu", &m->gpu, has, KIWI_HAS_GPU);
    } else if (strcmp(out->op_name, KIWI_OP_EVICT) == 0) {
        out->op = KIWI_DAEMON_EVICT;
        struct kiwi_msg_evict *m = &out->evict;
        typed = typed && read_int(line, "gpu", &m->gpu, has, KIWI_HAS_GPU);
        typed = typed && read_int(line, "bytes", &m->bytes, has, KIWI_HAS_BYTES);
        typed = typed && read_text(line, "for", TEXT(m->for_name), has, KIWI_HAS_FOR);
    } else if (strcmp(out->op_name, KIWI_OP_SPILL) == 0) {
        out->op = KIWI_DAEMON_SPILL;
        struct kiwi_msg_spill *m = &out->spill;
        typed = typed && read_int(line, "gpu", &m->gpu, has, KIWI_HAS_GPU);
        typed = typed && read_int(line, "bytes", &m->bytes, has, KIWI_HAS_BYTES);
    } else if (strcmp(out->op_name, KIWI_OP_FETCH) == 0) {
        out->op = KIWI_DAEMON_FETCH;
        struct kiwi_msg_fetch *m = &out->fetch;
        typed = typed && read_int(line, "gpu", &m->gpu, has, KIWI_HAS_GPU);
        typed = typed && read_text(line, "tier", TEXT(m->tier), has, KIWI_HAS_TIER);
    } else if (strcmp(out->op_name, KIWI_OP_PIN_BUDGET) == 0) {
        out->op = KIWI_DAEMON_PIN_BUDGET;
        struct kiwi_msg_pin_budget *m = &out->pin_budget;
        typed = typed && read_int(line, "pin_budget", &m->pin_budget, has, KIWI_HAS_PIN_BUDGET);
    } else if (strcmp(out->op_name, KIWI_OP_CHANGED) == 0) {
        out->op = KIWI_DAEMON_CHANGED;
    } else if (strcmp(out->op_name, KIWI_OP_MODE) == 0) {
        out->op = KIWI_DAEMON_MODE;
        struct kiwi_msg_mode *m = &out->mode;
        typed = typed && read_text(line, "mode", TEXT(m->mode), has, KIWI_HAS_MODE);
        typed = typed && read_number(line, "tq", &m->tq, has, KIWI_HAS_TQ);
    } else if (strcmp(out->op_name, KIWI_OP_OK) == 0) {
        out->op = KIWI_DAEMON_OK;
        struct kiwi_msg_ok *m = &out->ok;
        typed = typed && read_text(line, "mode", TEXT(m->mode), has, KIWI_HAS_MODE);
        typed = typed && read_number(line, "tq", &m->tq, has, KIWI_HAS_TQ);
    } else if (strcmp(out->op_name, KIWI_OP_PONG) == 0) {
        out->op = KIWI_DAEMON_PONG;
    } else if (strcmp(out->op_name, KIWI_OP_STATUS_REPLY) == 0) {
        out->op = KIWI_DAEMON_STATUS_REPLY;
        if (kiwi_json_get(line, "status", &op))
            *has |= KIWI_HAS_STATUS;
    } else if (strcmp(out->op_name, KIWI_OP_ERROR) == 0) {
        out->op = KIWI_DAEMON_ERROR;
        struct kiwi_msg_error *m = &out->error;
        typed = typed && read_text(line, "code", TEXT(m->code), has, KIWI_HAS_CODE);
        typed = typed && read_text(line, "message", TEXT(m->message), has, KIWI_HAS_MESSAGE);
    } else {
        return KIWI_DECODE_UNKNOWN_OP;
    }
    return typed ? KIWI_DECODED : KIWI_DECODE_MALFORMED;
}
