/* Regions kept for reuse: a region whose last allocation went (a slab left empty, or one
 * allocation's own) stays mapped for the next allocation of its size, up to CACHE_BYTES, so
 * that a framework that frees and allocates the same sizes does not map and unmap each time.
 * The cache is trimmed before each eviction and when the card runs out.
 */
#define _GNU_SOURCE
#include "vmm.h"

#define CACHE_BYTES ((uint64_t)512 << 20)

static struct vmm_region *cache;
static uint64_t cached_bytes;

/* Under kiwi_vmm_lock: a cached region goes for good (it stays marked cached, so that
 * unlinking it does not look for it among the slabs in use). */
static void drop(struct vmm_region *r)
{
    kiwi_vmm_side_unlink(&cache, r);
    cached_bytes -= r->size;
    kiwi_vmm_destroy_region(r);
}

/* A region whose last allocation went: kept mapped for the next allocation of its size, or
 * the next small one for a slab (one chunk, all of it on the card, room in the cache), else
 * destroyed. */
void kiwi_vmm_let_go(struct vmm_region *r)
{
    /* No longer the program's: out of the working set, and of the limit. */
    kiwi_memory_unreserve(r->size, MAPPED);
    if (r->pinned)
        kiwi_memory_pinned(-(int64_t)r->size);
    bool keep = !r->pinned && !kiwi_vmm_evicted && r->chunk_count == 1 &&
                r->chunks[0].resident && cached_bytes + r->size <= CACHE_BYTES;
    if (!keep) {
        kiwi_vmm_destroy_region(r);
        return;
    }
    if (r->slab)
        kiwi_vmm_slabs_remove(r);
    kiwi_vmm_side_link(&cache, r);
    r->cached = true;
    cached_bytes += r->size;
}

void kiwi_vmm_trim_cache(void)
{
    while (cache)
        drop(cache);
}

static void uncache(struct vmm_region *r, CUcontext ctx)
{
    kiwi_vmm_side_unlink(&cache, r);
    if (r->slab)
        kiwi_vmm_slabs_add(r);
    r->cached = false;
    r->ctx = ctx;
    cached_bytes -= r->size;
}

/* A cached region (a slab, or not) of exactly size bytes on device, taken out of the cache; or
 * NULL. */
struct vmm_region *kiwi_vmm_take_cached(size_t size, CUdevice device, CUcontext ctx, bool slab)
{
    for (struct vmm_region *r = cache; r; r = r->side_next) {
        if (r->slab != slab || r->size != size || r->device != device)
            continue;
        uncache(r, ctx);
        return r;
    }
    return NULL;
}

void kiwi_vmm_cache_forget(CUcontext ctx)
{
    for (struct vmm_region *r = cache, *next; r; r = next) {
        next = r->side_next;
        if (r->ctx == ctx)
            drop(r);
    }
}

void kiwi_vmm_cache_after_fork(void)
{
    cache = NULL;
    cached_bytes = 0;
}
