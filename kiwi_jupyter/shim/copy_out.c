/* KIWI_EVICT_COPY=pinned|pageable: the managed evictor's way out without page migration. Off by
 * default until a GPU run measures it (benchmarks/evict_variants.py, docs/shim.md).
 *
 * A migration of managed memory to the CPU is done by the driver 2 MiB at a time, with the host
 * side (page allocation, mappings) in the calling thread; the first H100 run measured 0.06 of a
 * pinned memcpy. Here an eviction copies each live range into a host buffer of its own with
 * cuMemcpyDtoHAsync, at copy-engine speed, and then discards the ranges (CUDA 13's
 * cuMemDiscardBatchAsync), so the driver drops their GPU pages without migrating them. The
 * restore prefetches the ranges back to the GPU as before (a discarded range has nothing to
 * migrate: fresh pages are populated) and then copies each buffer back in, on the same stream.
 *
 * A copy is only written back to a range of the same context, address and size that is still
 * allocated; one freed meanwhile is dropped. A range freed and allocated again at the same place
 * gets the old bytes, which a new allocation may hold anyway (its contents are undefined).
 * Where the driver cannot discard, the ranges are prefetched as without this setting.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "pager.h"

struct saved {
    CUcontext ctx;
    CUdeviceptr ptr;
    size_t size;
    void *host;
    bool pinned;
};

/* Used by the comm thread only (evictions and restores run there), under contexts_lock. */
static struct saved *saved;
static size_t saved_count, saved_capacity;

static void *host_buffer(size_t size, bool *pinned)
{
    *pinned = kiwi_cfg.evict_copy == KIWI_EVICT_COPY_PINNED && kiwi_pager_driver.host_alloc;
    void *host = NULL;
    if (*pinned && kiwi_pager_driver.host_alloc(&host, size) == CUDA_SUCCESS)
        return host;
    *pinned = false; /* the host would not pin that much: pageable memory still works */
    return malloc(size);
}

static void host_free(struct saved *s)
{
    if (s->pinned)
        kiwi_pager_driver.host_free(s->host);
    else
        free(s->host);
}

/* Room for one more copy, made before its copy is queued: a buffer the driver is writing to
 * must never be freed for want of a place to note it. */
static bool room_for_one(void)
{
    if (saved_count == saved_capacity) {
        size_t capacity = saved_capacity ? 2 * saved_capacity : 16;
        struct saved *grown = realloc(saved, capacity * sizeof *grown);
        if (!grown)
            return false;
        saved = grown;
        saved_capacity = capacity;
    }
    return true;
}

bool kiwi_copy_out_usable(void)
{
    return kiwi_cfg.evict_copy != KIWI_EVICT_COPY_OFF && kiwi_pager_driver.copy_to_host &&
           kiwi_pager_driver.copy_to_device && kiwi_pager_discards();
}

size_t kiwi_copy_out(struct context *c, const struct kiwi_range *ranges, size_t count,
                     bool *copied, struct move *move)
{
    size_t done = 0;
    for (size_t i = 0; i < count; i++) {
        copied[i] = false;
        if (ranges[i].ctx != c->ctx)
            continue;
        struct saved s = {.ctx = c->ctx, .ptr = ranges[i].ptr, .size = ranges[i].size};
        if (!room_for_one() || !(s.host = host_buffer(s.size, &s.pinned)))
            continue;
        if (kiwi_pager_driver.copy_to_host(s.host, s.ptr, s.size, c->stream) != CUDA_SUCCESS) {
            host_free(&s); /* not queued: nothing reads it */
            continue;
        }
        saved[saved_count++] = s;
        copied[i] = true;
        move->bytes += s.size;
        done++;
    }
    return done;
}

void kiwi_copy_out_undo(CUcontext ctx)
{
    for (size_t i = 0; i < saved_count; i++) {
        if (saved[i].ctx == ctx) {
            host_free(&saved[i]);
            saved[i--] = saved[--saved_count];
        }
    }
}

void kiwi_copy_back(struct context *c, const struct kiwi_range *ranges, size_t count,
                    struct move *move)
{
    for (size_t i = 0; i < saved_count; i++) {
        if (saved[i].ctx != c->ctx)
            continue;
        for (size_t j = 0; j < count; j++) {
            if (ranges[j].ctx != c->ctx || ranges[j].ptr != saved[i].ptr ||
                ranges[j].size != saved[i].size)
                continue;
            CUresult result = kiwi_pager_driver.copy_to_device(saved[i].ptr, saved[i].host,
                                                               saved[i].size, c->stream);
            if (result == CUDA_SUCCESS) {
                move->copied_back += saved[i].size;
            } else {
                /* Its GPU pages were discarded: what the range held is lost. Say so loudly. */
                kiwi_warn("copying %zu bytes back to 0x%llx failed (CUDA error %d): their "
                          "contents are lost", saved[i].size, (unsigned long long)saved[i].ptr,
                          result);
                move->failures++;
            }
            break;
        }
    }
}

void kiwi_copy_back_done(void)
{
    /* After the streams' synchronize: the copies have read their buffers. */
    for (size_t i = 0; i < saved_count; i++)
        host_free(&saved[i]);
    saved_count = 0;
}

void kiwi_copy_after_fork(void)
{
    /* The parent's copies are the parent's to write back: the child forgets them. */
    saved = NULL;
    saved_count = saved_capacity = 0;
}
