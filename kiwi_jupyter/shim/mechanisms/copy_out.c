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
 *
 * The host buffers outlive the restore: the next eviction reuses each one for a range of the
 * same context and size (a framework's allocator keeps the same segments from cell to cell), and
 * frees those it has no range for. Getting fresh host pages (zeroed by the kernel, and pinned,
 * page by page) costs about as much as the copy itself, so a buffer allocated at each eviction
 * would hand back most of what the copy gains. The price is host memory: a kernel keeps a
 * buffer as large as its last eviction while it runs, which the host had to hold while it was
 * evicted anyway. A context's buffers go with the context.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pager.h"

struct saved {
    CUcontext ctx;
    CUdeviceptr ptr;
    size_t size;
    void *host;
    bool pinned;
    bool holds_copy; /* a range's bytes, to go back at the restore; else a spare buffer */
};

/* Used by the comm thread (evictions and restores run there) and a context's end, under
 * contexts_lock. */
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

/* Drops entry i, its buffer freed or not; the last entry takes its place. */
static void drop(size_t i, bool free_buffer)
{
    if (free_buffer)
        host_free(&saved[i]);
    saved[i] = saved[--saved_count];
}

/* A spare buffer of c's for a range of `size` bytes, or SIZE_MAX: the one last used for the
 * same address if there is one, any of that size otherwise. Pinned only where asked for. */
static size_t spare_for(CUcontext ctx, CUdeviceptr ptr, size_t size)
{
    size_t found = SIZE_MAX;
    for (size_t i = 0; i < saved_count; i++) {
        struct saved *s = &saved[i];
        if (s->holds_copy || s->ctx != ctx || s->size != size ||
            (s->pinned && kiwi_cfg.evict_copy != KIWI_EVICT_COPY_PINNED))
            continue;
        if (s->ptr == ptr)
            return i;
        if (found == SIZE_MAX)
            found = i;
    }
    return found;
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
           kiwi_pager_driver.copy_to_device;
}

size_t kiwi_copy_out(struct context *c, const struct kiwi_range *ranges, size_t count,
                     bool *copied, struct move *move)
{
    size_t done = 0;
    for (size_t i = 0; i < count; i++) {
        copied[i] = false;
        if (ranges[i].ctx != c->ctx)
            continue;
        size_t at = spare_for(c->ctx, ranges[i].ptr, ranges[i].size);
        if (at == SIZE_MAX) {
            struct saved s = {.ctx = c->ctx, .size = ranges[i].size};
            if (!room_for_one() || !(s.host = host_buffer(s.size, &s.pinned)))
                continue;
            at = saved_count;
            saved[saved_count++] = s;
        }
        struct saved *s = &saved[at];
        s->ptr = ranges[i].ptr;
        if (kiwi_pager_driver.copy_to_host(s->host, s->ptr, s->size, c->stream) != CUDA_SUCCESS)
            continue; /* not queued: the buffer stays a spare */
        s->holds_copy = true;
        copied[i] = true;
        move->bytes += s->size;
        done++;
    }
    /* The spares this eviction found no range for: the working set changed shape. */
    for (size_t i = 0; i < saved_count; i++) {
        if (saved[i].ctx == c->ctx && !saved[i].holds_copy)
            drop(i--, true);
    }
    return done;
}

void kiwi_copy_out_undo(CUcontext ctx)
{
    for (size_t i = 0; i < saved_count; i++) {
        if (saved[i].ctx == ctx)
            drop(i--, true);
    }
}

void kiwi_copy_forget_context(CUcontext ctx)
{
    /* Pinned buffers were the context's and went with it; pageable ones are the shim's. */
    for (size_t i = 0; i < saved_count; i++) {
        if (saved[i].ctx == ctx) {
            bool ours = !saved[i].pinned;
            drop(i--, ours);
        }
    }
}

void kiwi_copy_back(struct context *c, const struct kiwi_range *ranges, size_t count,
                    struct move *move)
{
    for (size_t i = 0; i < saved_count; i++) {
        if (saved[i].ctx != c->ctx || !saved[i].holds_copy)
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
    /* After the streams' synchronize: the copies have read their buffers, which stay as spares
     * for the next eviction (a copy whose range was freed meanwhile is dropped with them). */
    for (size_t i = 0; i < saved_count; i++)
        saved[i].holds_copy = false;
}

void kiwi_copy_after_fork(void)
{
    /* The parent's copies are the parent's to write back: the child forgets them. */
    saved = NULL;
    saved_count = saved_capacity = 0;
}
