/* The C API the kernel hook calls through ctypes (docs/shim.md). Kept small on purpose: the
 * hook says when a cell begins and ends, may ask for the GPU eagerly, and reads statistics;
 * everything else the shim does by itself. Every function is safe to call from any thread,
 * before or without any GPU work, and never needs the GIL.
 */
#define _GNU_SOURCE
#include <stdio.h>

#include "client.h"

/* 1 when the shim gates and pages this process's GPU work (KIWI_SHIM is not 0). */
KIWI_EXPORT int kiwi_shim_active(void)
{
    kiwi_init();
    return kiwi_cfg.enabled ? 1 : 0;
}

/* A cell begins: until kiwi_shim_release, the idle release is off (the cell's end releases). */
KIWI_EXPORT void kiwi_shim_cell_begin(void)
{
    kiwi_init();
    kiwi_comm_cell_begin();
}

/* Eager acquisition: waits until this process holds its GPU. timeout in seconds, 0 = no limit.
 * Returns 0 when GPU work may run (held, or the daemon is unreachable and the policy is open),
 * 1 on timeout, 2 when interrupted (kiwi_shim_interrupt, Ctrl-C), 3 when the scheduler could
 * not make room for it for KIWI_ROOM_TIMEOUT (the stats' room_refused says why), -1 when the
 * daemon is unreachable and the policy is closed. */
KIWI_EXPORT int kiwi_shim_acquire(double timeout)
{
    kiwi_init();
    return kiwi_comm_acquire(timeout);
}

/* A cell ends: admit no new GPU work, synchronize, release; or cancel a pending request.
 * Returns 0 once the release (with evict_first) is sent. When the daemon answers that the
 * next holder needs the room, the shim's thread moves the working set to host memory and then
 * releases plainly; the GPU changes hands only then, and the caller does not wait for it. */
KIWI_EXPORT int kiwi_shim_release(void)
{
    kiwi_init();
    return kiwi_comm_release();
}

/* Puts the shim's SIGINT handler in front of the one installed now (call it from the main
 * thread after the kernel installs its own, as each cell starts), so that Ctrl-C ends a wait
 * for the GPU in C: the waiting call returns CUDA_ERROR_SYSTEM_NOT_READY, kiwi_shim_acquire
 * returns 2, and the kernel's handler gets the signal as before. 0 on success. */
KIWI_EXPORT int kiwi_shim_catch_interrupts(void)
{
    kiwi_init();
    return kiwi_interrupt_catch();
}

/* Ends the waits for the GPU in progress now, as Ctrl-C does. */
KIWI_EXPORT void kiwi_shim_interrupt(void)
{
    kiwi_init();
    kiwi_interrupt();
}

/* 1 while this process holds its GPU. */
KIWI_EXPORT int kiwi_shim_holding(void)
{
    kiwi_init();
    struct kiwi_stats stats;
    kiwi_comm_stats(&stats);
    return stats.hold == KIWI_HOLD_HOLDING ? 1 : 0;
}

/* What the daemon cannot be reached: fail_closed 0 lets GPU work run unscheduled, 1 makes it
 * fail with CUDA_ERROR_SYSTEM_NOT_READY; either applies after timeout seconds of outage. */
KIWI_EXPORT int kiwi_shim_set_policy(int fail_closed, double timeout)
{
    kiwi_init();
    if (timeout < 0)
        return -1;
    kiwi_comm_set_policy(fail_closed != 0, timeout);
    return 0;
}

/* Before the kernel reads which blocks its framework's cache holds free (at a cell's end, before
 * kiwi_shim_release): from here on, any GPU call makes what it reads untrustworthy. */
KIWI_EXPORT void kiwi_shim_free_ranges_begin(void)
{
    kiwi_init();
    kiwi_free_ranges_begin();
}

/* The blocks the framework's cache holds free now, read since kiwi_shim_free_ranges_begin: an
 * eviction discards them (or leaves them out) instead of copying them, and a restore skips
 * them. Replaces what was said before. Only whole 2 MiB blocks inside one managed allocation
 * count; the hints end at the next grant, and are not used if any GPU call ran, or any
 * allocation came or went, since the begin. Returns the bytes believed, or -1 without a begin
 * or with a null array. */
KIWI_EXPORT long long kiwi_shim_set_free_ranges(const unsigned long long *ptrs,
                                                const unsigned long long *sizes, size_t count)
{
    kiwi_init();
    return kiwi_free_ranges_set(ptrs, sizes, count);
}

/* text as a JSON string into buf, or null when it is empty. */
static void quote_or_null(char *buf, size_t size, const char *text)
{
    buf[0] = '\0';
    if (!text[0] || !kiwi_json_quote(buf, size, text))
        snprintf(buf, size, "null");
}

/* The shim's statistics as one JSON object, written like snprintf: returns the length the
 * whole document needs (excluding the NUL), so a caller whose buffer was too small can retry. */
KIWI_EXPORT int kiwi_shim_stats_json(char *buffer, size_t size)
{
    kiwi_init();
    struct kiwi_stats s;
    kiwi_comm_stats(&s);
    struct kiwi_working_set ws;
    kiwi_memory_working_set(&ws);
    struct kiwi_residency where;
    kiwi_pager_residency(&where);
    char client[40] = "null", mode[16] = "null";
    if (s.client[0])
        snprintf(client, sizeof client, "\"%s\"", s.client);
    if (s.mode[0])
        snprintf(mode, sizeof mode, "\"%s\"", s.mode);
    char refused[sizeof s.room_refused * 2 + 8], last_refusal[sizeof refused];
    quote_or_null(refused, sizeof refused, s.room_refused);
    quote_or_null(last_refusal, sizeof last_refusal, s.room_last_refusal);
    char known[sizeof kiwi_cfg.gpu_uuid], uuid[sizeof known + 8] = "null";
    kiwi_gpu_uuid(known, sizeof known);
    if (known[0]) {
        uuid[0] = '\0';
        kiwi_json_quote(uuid, sizeof uuid, known);
    }
    return snprintf(
        buffer, size,
        "{\"version\":\"%s\",\"active\":%s,\"connected\":%s,\"failed_open\":%s,"
        "\"failed_closed\":%s,\"state\":\"%s\",\"in_cell\":%s,\"client\":%s,\"mode\":%s,"
        "\"queue_position\":%d,\"position_live\":%s,\"quantum\":%.3f,\"working_set\":%llu,"
        "\"evictable\":%llu,\"allocations\":%llu,\"memory_limit\":%llu,\"evicted\":%s,"
        "\"grants\":%llu,\"drops\":%llu,\"revokes\":%llu,\"releases\":%llu,\"evictions\":%llu,"
        "\"bytes_evicted\":%llu,\"bytes_skipped\":%llu,\"bytes_discarded\":%llu,"
        "\"free_in_cache\":%llu,\"seconds_evicting\":%.6f,\"restores\":%llu,"
        "\"bytes_restored\":%llu,\"seconds_restoring\":%.6f,\"seconds_waiting\":%.6f,"
        "\"last_grant_at\":%.6f,\"in_flight\":%d,\"gpu\":%d,\"gpu_uuid\":%s,\"evict\":\"%s\","
        "\"paused\":%s,\"pauses\":%llu,\"resident\":%llu,\"host\":%llu,\"host_shadow\":%llu,"
        "\"host_shadow_pinned\":%llu,\"host_staging\":%llu,\"pin_budget\":%llu,"
        "\"seconds_pinning\":%.6f,\"restore_failures\":%llu,"
        "\"room_refusals\":%llu,\"room_refused\":%s,\"room_retry_in\":%.3f,"
        "\"room_last_refusal\":%s,\"room_requeues\":%llu}",
        KIWI_SHIM_VERSION, kiwi_cfg.enabled ? "true" : "false", s.connected ? "true" : "false",
        s.failed_open ? "true" : "false", s.failed_closed ? "true" : "false",
        kiwi_hold_word(s.hold), s.in_cell ? "true" : "false", client, mode, s.queue_position,
        s.position_live ? "true" : "false", s.quantum, (unsigned long long)ws.bytes,
        (unsigned long long)ws.evictable, (unsigned long long)ws.allocations,
        (unsigned long long)kiwi_memory_limit(), s.evicted ? "true" : "false",
        (unsigned long long)s.grants,
        (unsigned long long)s.drops, (unsigned long long)s.revokes,
        (unsigned long long)s.releases, (unsigned long long)s.evictions,
        (unsigned long long)s.bytes_evicted, (unsigned long long)s.bytes_skipped,
        (unsigned long long)s.bytes_discarded, (unsigned long long)kiwi_free_ranges_bytes(),
        s.seconds_evicting,
        (unsigned long long)s.restores, (unsigned long long)s.bytes_restored,
        s.seconds_restoring, s.seconds_waiting, s.last_grant_at, kiwi_gate_in_flight(),
        kiwi_cfg.gpu, uuid, kiwi_pager_evictor()->name, s.paused ? "true" : "false",
        (unsigned long long)s.pauses, (unsigned long long)where.resident,
        (unsigned long long)where.host, (unsigned long long)where.shadow,
        (unsigned long long)where.shadow_pinned, (unsigned long long)where.staging,
        (unsigned long long)where.pin_budget, where.seconds_pinning,
        (unsigned long long)s.restore_failures, (unsigned long long)s.room_refusals, refused,
        s.room_retry_in, last_refusal, (unsigned long long)s.room_requeues);
}
