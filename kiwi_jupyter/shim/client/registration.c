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

/* The register request's fields: the client's labels, quoted, its GPU and its working set. */
void kiwi_registration_fields(char *fields, size_t size, uint64_t working_set, bool compatible)
{
    const char *evict = kiwi_evict_proposal();
    if (compatible && strcmp(evict, "vmm") == 0)
        evict = "managed"; /* to a daemon that predates vmm: the process pages itself */
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
}
