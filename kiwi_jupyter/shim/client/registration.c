/* The register request's fields: what the shim says of the process to the daemon. Built apart
 * from the connection (link.c) since it is the one request with fields that come from the user
 * (names, pool, pod labels) and so the one that must be quoted and bounded with care.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

static void append(char *buf, size_t size, const char *text)
{
    size_t n = strlen(buf);
    snprintf(buf + n, size - n, "%s", text);
}

/* The UUID of the process's device 0, as NVML writes it (GPU-8-4-4-4-12 hex digits), so that
 * the daemon matches the GPU by UUID; false when the driver cannot say yet. */
static bool device_uuid(char *text, size_t size)
{
    typedef CUresult (*uuid_fn)(CUuuid *, CUdevice);
    uuid_fn get = (uuid_fn)kiwi_driver_sym("cuDeviceGetUuid_v2");
    if (!get)
        get = (uuid_fn)kiwi_driver_sym("cuDeviceGetUuid");
    CUuuid uuid;
    if (!get || get(&uuid, 0) != CUDA_SUCCESS)
        return false;
    const unsigned char *b = (const unsigned char *)uuid.bytes;
    snprintf(text, size,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
    return true;
}

void kiwi_gpu_uuid(char *text, size_t size)
{
    pthread_mutex_lock(&kiwi_lock);
    snprintf(text, size, "%s", kiwi_cfg.gpu_uuid);
    pthread_mutex_unlock(&kiwi_lock);
}

/* The UUID the configuration named, or else the driver's, learnt once and kept in kiwi_cfg
 * under kiwi_lock: the statistics read it from other threads. */
static bool gpu_uuid(char *text, size_t size)
{
    kiwi_gpu_uuid(text, size);
    if (text[0])
        return true;
    if (!device_uuid(text, size))
        return false;
    pthread_mutex_lock(&kiwi_lock);
    snprintf(kiwi_cfg.gpu_uuid, sizeof kiwi_cfg.gpu_uuid, "%s", text);
    pthread_mutex_unlock(&kiwi_lock);
    return true;
}

/* Appends ,"key":"value" to fields, or nothing when it does not fit whole. */
static void append_quoted(char *fields, size_t size, const char *key, const char *value)
{
    size_t before = strlen(fields);
    char head[40];
    snprintf(head, sizeof head, ",\"%s\":", key);
    append(fields, size, head);
    if (strlen(fields) != before + strlen(head) || !kiwi_json_quote(fields, size, value))
        fields[before] = '\0';
}

/* What people see for the process (the Kiwi kernel sets its notebook's path), as the Python
 * client sends it; the name stays the key. The daemon refuses a register whose display name
 * is over 256 UTF-8 bytes or holds a control character, and closes the connection on a line
 * that is not UTF-8; so what the environment holds is made fit first: bytes that are not
 * UTF-8 become '?', control characters spaces, and a name too long keeps its end (a path's
 * file name matters most) after an ellipsis, as nodeside.names.shorten_to_bytes cuts a path. */
#define DISPLAY_NAME_BYTES 256

/* The length of the UTF-8 sequence at text (1 to 4), or 0 where none starts. */
static size_t utf8_length(const unsigned char *text)
{
    size_t length = text[0] < 0x80 ? 1 : (text[0] & 0xe0) == 0xc0 ? 2
                  : (text[0] & 0xf0) == 0xe0 ? 3 : (text[0] & 0xf8) == 0xf0 ? 4 : 0;
    for (size_t i = 1; i < length; i++)
        if ((text[i] & 0xc0) != 0x80)
            return 0;
    if ((length == 2 && text[0] < 0xc2) || (length == 3 && text[0] == 0xe0 && text[1] < 0xa0) ||
        (length == 4 && (text[0] > 0xf4 || (text[0] == 0xf0 && text[1] < 0x90))))
        return 0; /* overlong or past U+10FFFF */
    return length;
}

static void fit_display_name(char *out, size_t size, const char *raw)
{
    char clean[4096];
    size_t n = 0;
    for (const unsigned char *c = (const unsigned char *)raw; *c && n + 4 < sizeof clean;) {
        size_t length = utf8_length(c);
        bool control = *c < 0x20 || *c == 0x7f || (length == 2 && c[0] == 0xc2 && c[1] < 0xa0);
        if (!length || control) {
            clean[n++] = length ? ' ' : '?';
            c += length ? length : 1;
            continue;
        }
        memcpy(clean + n, c, length);
        n += length;
        c += length;
    }
    clean[n] = '\0';
    if (n < size) {
        memcpy(out, clean, n + 1);
        return;
    }
    static const char ellipsis[] = "\xe2\x80\xa6"; /* U+2026 */
    size_t start = n - (size - sizeof ellipsis); /* what is left fits with the ellipsis */
    while ((clean[start] & 0xc0) == 0x80)
        start++; /* not inside a character */
    snprintf(out, size, "%s%s", ellipsis, clean + start);
}

void kiwi_registration_fields(char *fields, size_t size, uint64_t working_set, bool compatible,
                              bool memory)
{
    const char *evict = kiwi_evict_proposal(compatible);
    snprintf(fields, size, "\"name\":");
    kiwi_json_quote(fields, size, kiwi_cfg.name);
    append(fields, size, ",\"pool\":");
    kiwi_json_quote(fields, size, kiwi_cfg.pool);
    append(fields, size, ",\"priority\":");
    kiwi_json_quote(fields, size, kiwi_cfg.priority);
    /* Pod and namespace label the client in the daemon's metrics, as nodeside.client does. */
    const char *pod = getenv("KIWI_POD_NAME"), *namespace = getenv("KIWI_POD_NAMESPACE");
    bool has_pod = pod && *pod, has_namespace = namespace && *namespace;
    if (has_pod || has_namespace) {
        append(fields, size, ",\"labels\":{");
        if (has_pod) {
            append(fields, size, "\"pod\":");
            kiwi_json_quote(fields, size, pod);
        }
        if (has_namespace) {
            append(fields, size, has_pod ? ",\"namespace\":" : "\"namespace\":");
            kiwi_json_quote(fields, size, namespace);
        }
        append(fields, size, "}");
    }
    const char *display = getenv("KIWI_DISPLAY_NAME");
    if (display && *display) {
        char fit[DISPLAY_NAME_BYTES + 1];
        fit_display_name(fit, sizeof fit, display);
        append_quoted(fields, size, KIWI_FIELD_DISPLAY_NAME, fit);
    }
    char uuid[sizeof kiwi_cfg.gpu_uuid];
    if (gpu_uuid(uuid, sizeof uuid)) {
        append(fields, size, ",\"gpu_uuid\":");
        kiwi_json_quote(fields, size, uuid);
    }
    size_t n = strlen(fields);
    snprintf(fields + n, size - n,
             ",\"gpu\":%d,\"kind\":\"shim\",\"working_set\":%llu,\"evict\":\"%s\","
             "\"pausable\":true",
             kiwi_cfg.gpu, (unsigned long long)working_set, evict);
    if (memory) { /* where its memory already is, so a daemon that restarted learns it */
        struct kiwi_residency where;
        kiwi_pager_residency(&where);
        kiwi_json_residency(fields, size, &where);
        if (where.disk) /* only a daemon that sent `spill` had it spilled: it knows the word */
            snprintf(fields + strlen(fields), size - strlen(fields),
                     ",\"" KIWI_FIELD_DISK "\":%llu", (unsigned long long)where.disk);
    }
}
