/* The vmm evictor's allocations: device memory the shim maps itself, so that an eviction can
 * take it off the card for real and a restore can put it back at the same addresses.
 *
 * Each cuMemAlloc (pitched and stream-ordered ones too) of 1 MiB or more gets a region: address
 * space of its own (cuMemAddressReserve, whole granules), backed by physical handles
 * (vmm_chunks.c): one handle up to VMM_CHUNK_MAX, and a larger allocation cut into chunks of 64
 * to 256 MiB, so that a move can take it piece by piece (map and unmap cost grows with the
 * number of handles: PyTorch's note on expandable segments). Smaller allocations share slabs of
 * one granule, in units of VMM_UNIT. The addresses stay reserved for the allocation's life, so
 * pointers, tensors and captured CUDA graphs stay valid across evictions.
 *
 * A free waits for the GPU first: work queued before it may still use the memory, and an unmap
 * under a running kernel is an illegal address (cudaFree synchronizes for the same reason). A
 * stream-ordered free records an event on its stream instead, and the memory is reclaimed once
 * the event has completed: at later allocations, frees and evictions. While a graph capture is
 * open nothing can be waited for (a synchronization would invalidate the capture), and the
 * memory waits for the next release, which synchronizes everything. A region freed whole (or
 * a slab left empty) is kept mapped for the next allocation of its size (up to CACHE_BYTES), and
 * the cache is trimmed before each eviction and when the card runs out.
 *
 * While an eviction's memory is away (kiwi_vmm_evicted), a new allocation only reserves its
 * addresses: the card is another process's now, and the restore on the next grant backs it,
 * before any work may touch it (every launch, copy and memset waits at the gate). So does one
 * that finds the card full (other processes' memory on it, its own cache already given back)
 * where it may wait for room (room_wait.c): its caller then waits until the daemon has made
 * room and the restore on the grant has mapped it.
 *
 * Host shadows are made by a thread of the vmm evictor's own, ahead of time, as chunks appear
 * (vmm_shadows.c says why), and kept with their chunk across evictions; a freed chunk's shadow
 * is kept as a spare for the next chunk of its size, up to SPARE_BYTES.
 *
 * A region whose physical handle was handed out (cuMemRetainAllocationHandle: an export, an
 * NCCL registration) stays where it is: a handle held elsewhere keeps the memory alive, and a
 * restore into new memory would part the two. It is counted and reported as not evictable.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "vmm.h"

#define BUCKETS 4096
#define MAX_CONTEXTS 16
#define SPARE_EVENTS 64
#define MAX_POOLS 16
#define CACHE_BYTES ((uint64_t)512 << 20)
#define SPARE_BYTES ((uint64_t)1 << 30)

pthread_mutex_t kiwi_vmm_lock = PTHREAD_MUTEX_INITIALIZER;
bool kiwi_vmm_evicted;
/* Whether every chunk is on the card: none away after an eviction, none waiting for room.
 * Written under kiwi_vmm_lock, read without it (a move holds the lock for seconds). */
static atomic_bool all_backed = true;

static struct vmm_region *first_region, *last_region;
static struct vmm_region *slabs, *cache; /* (side lists) slabs in use; regions kept for reuse */
static uint64_t next_serial = 1;
static struct vmm_allocation *allocations[BUCKETS];
static struct vmm_allocation *pending_first, *pending_last;
static uint64_t cached_bytes;

/* Per context: a second stream for moves, and spare events. */
struct vmm_context {
    CUcontext ctx;
    CUstream stream;
    CUevent spare[SPARE_EVENTS];
    int spare_count;
};
static struct vmm_context contexts[MAX_CONTEXTS];
static int context_count;

/* Stream-ordered allocations by pool, for cuMemPoolGetAttribute. */
struct pool_counts {
    CUmemoryPool pool;
    uint64_t used, used_high, reserved, reserved_high;
};
static struct pool_counts pools[MAX_POOLS];
static int pool_count;

/* Shadows of chunks freed, kept for the next chunk of their size. */
struct spare {
    struct spare *next;
    struct vmm_shadow shadow;
};
static struct spare *spares;
static uint64_t spare_bytes;

static pthread_cond_t shadow_work = PTHREAD_COND_INITIALIZER;
static bool builder_started, builder_stalled;
static double seconds_pinning;

struct vmm_region *kiwi_vmm_regions(void)
{
    return first_region;
}

static size_t round_up(size_t value, size_t granule)
{
    return (value + granule - 1) / granule * granule;
}

static size_t bucket(CUdeviceptr ptr)
{
    return (size_t)((ptr * 0x9E3779B97F4A7C15ull) >> 52) % BUCKETS;
}

/* ---- per context ----------------------------------------------------------------------- */

static struct vmm_context *context_of(CUcontext ctx, bool make)
{
    for (int i = 0; i < context_count; i++)
        if (contexts[i].ctx == ctx)
            return &contexts[i];
    if (!make || context_count == MAX_CONTEXTS)
        return NULL;
    contexts[context_count] = (struct vmm_context){.ctx = ctx};
    return &contexts[context_count++];
}

CUstream kiwi_vmm_second_stream(CUcontext ctx)
{
    struct vmm_context *c = context_of(ctx, true);
    if (c && !c->stream &&
        kiwi_pager_driver.stream_create(&c->stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
        c->stream = NULL;
    return c ? c->stream : NULL;
}

CUevent kiwi_vmm_event_take(CUcontext ctx)
{
    struct vmm_context *c = context_of(ctx, true);
    if (c && c->spare_count)
        return c->spare[--c->spare_count];
    CUevent event = NULL;
    if (kiwi_vmm_driver.event_create(&event, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
        return NULL;
    return event;
}

void kiwi_vmm_event_give(CUcontext ctx, CUevent event)
{
    struct vmm_context *c = context_of(ctx, true);
    if (c && c->spare_count < SPARE_EVENTS)
        c->spare[c->spare_count++] = event;
    else
        kiwi_vmm_driver.event_destroy(event);
}

/* ---- pools' counters ------------------------------------------------------------------- */

static struct pool_counts *counts_of(CUmemoryPool pool, bool make)
{
    if (!pool)
        return NULL;
    for (int i = 0; i < pool_count; i++)
        if (pools[i].pool == pool)
            return &pools[i];
    if (!make || pool_count == MAX_POOLS)
        return NULL;
    pools[pool_count] = (struct pool_counts){.pool = pool};
    return &pools[pool_count++];
}

static void count_in_pool(CUmemoryPool pool, int64_t used, int64_t reserved)
{
    struct pool_counts *c = counts_of(pool, used > 0);
    if (!c)
        return;
    c->used += (uint64_t)used;
    c->reserved += (uint64_t)reserved;
    if (c->used > c->used_high)
        c->used_high = c->used;
    if (c->reserved > c->reserved_high)
        c->reserved_high = c->reserved;
}

bool kiwi_vmm_pool_attribute(CUmemoryPool pool, int attribute, uint64_t *value)
{
    pthread_mutex_lock(&kiwi_vmm_lock);
    struct pool_counts *c = counts_of(pool, false);
    bool known = c != NULL;
    if (c) {
        switch (attribute) {
        case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
            *value = c->reserved;
            break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
            *value = c->reserved_high;
            break;
        case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
            *value = c->used;
            break;
        case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
            *value = c->used_high;
            break;
        default:
            known = false; /* the pool's settings are the driver's */
        }
    }
    pthread_mutex_unlock(&kiwi_vmm_lock);
    return known;
}

bool kiwi_vmm_pool_reset(CUmemoryPool pool, int attribute)
{
    pthread_mutex_lock(&kiwi_vmm_lock);
    struct pool_counts *c = counts_of(pool, false);
    bool known = c && (attribute == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH ||
                       attribute == CU_MEMPOOL_ATTR_USED_MEM_HIGH);
    if (known && attribute == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
        c->reserved_high = c->reserved;
    else if (known)
        c->used_high = c->used;
    pthread_mutex_unlock(&kiwi_vmm_lock);
    return known;
}

/* ---- shadows' spares ------------------------------------------------------------------- */

/* Under kiwi_vmm_lock: a spare shadow of exactly size bytes, or none. */
static struct vmm_shadow spare_take(size_t size)
{
    for (struct spare **s = &spares; *s; s = &(*s)->next) {
        if ((*s)->shadow.size != size)
            continue;
        struct spare *found = *s;
        *s = found->next;
        struct vmm_shadow shadow = found->shadow;
        spare_bytes -= shadow.size;
        free(found);
        return shadow;
    }
    return (struct vmm_shadow){NULL, 0, SHADOW_NONE};
}

/* Under kiwi_vmm_lock: keeps a shadow no chunk has for the next chunk of its size, or frees it
 * past SPARE_BYTES. */
static void spare_put(struct vmm_shadow *shadow)
{
    if (shadow->kind == SHADOW_NONE)
        return;
    struct spare *s = spare_bytes + shadow->size <= SPARE_BYTES ? malloc(sizeof *s) : NULL;
    if (!s) {
        kiwi_vmm_shadow_free(shadow);
        return;
    }
    s->shadow = *shadow;
    s->next = spares;
    spares = s;
    spare_bytes += shadow->size;
    *shadow = (struct vmm_shadow){NULL, 0, SHADOW_NONE};
}

/* ---- regions --------------------------------------------------------------------------- */

static void side_link(struct vmm_region **head, struct vmm_region *r);

static void link_region(struct vmm_region *r)
{
    if (r->slab)
        side_link(&slabs, r);
    r->serial = next_serial++;
    r->prev = last_region;
    r->next = NULL;
    if (last_region)
        last_region->next = r;
    else
        first_region = r;
    last_region = r;
}

static void side_link(struct vmm_region **head, struct vmm_region *r)
{
    r->side_prev = NULL;
    r->side_next = *head;
    if (*head)
        (*head)->side_prev = r;
    *head = r;
}

static void side_unlink(struct vmm_region **head, struct vmm_region *r)
{
    if (r->side_prev)
        r->side_prev->side_next = r->side_next;
    else
        *head = r->side_next;
    if (r->side_next)
        r->side_next->side_prev = r->side_prev;
    r->side_next = r->side_prev = NULL;
}

static void unlink_region(struct vmm_region *r)
{
    if (r->cached)
        side_unlink(&cache, r);
    else if (r->slab)
        side_unlink(&slabs, r);
    if (r->prev)
        r->prev->next = r->next;
    else
        first_region = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        last_region = r->prev;
}

/* How size bytes (whole granules) are cut into chunks: one up to VMM_CHUNK_MAX, else n equal
 * ones of whole granules and a last one with the rest. Returns the count; *each: their size. */
static int chunk_layout(size_t size, size_t granule, size_t *each)
{
    if (size <= VMM_CHUNK_MAX) {
        *each = size;
        return 1;
    }
    size_t n = (size + VMM_CHUNK_MAX - 1) / VMM_CHUNK_MAX;
    *each = round_up((size + n - 1) / n, granule);
    return (int)((size + *each - 1) / *each);
}

/* A region of size bytes at va (reserved), its chunks laid out, none resident yet. */
static struct vmm_region *region_new(CUdeviceptr va, size_t size, size_t granule, CUcontext ctx,
                                     CUdevice device, bool slab)
{
    struct vmm_region *r = calloc(1, sizeof *r);
    size_t each;
    int count = chunk_layout(size, granule, &each);
    if (r)
        r->chunks = calloc((size_t)count, sizeof *r->chunks);
    if (r && slab) {
        r->unit_count = size / VMM_UNIT;
        r->units = calloc((r->unit_count + 63) / 64, sizeof *r->units);
    }
    if (!r || !r->chunks || (slab && !r->units)) {
        if (r) {
            free(r->chunks);
            free(r->units);
        }
        free(r);
        return NULL;
    }
    r->va = va;
    r->size = size;
    r->ctx = ctx;
    r->device = device;
    r->slab = slab;
    r->chunk_count = count;
    for (int i = 0; i < count; i++) {
        r->chunks[i].offset = (size_t)i * each;
        r->chunks[i].size = i + 1 < count ? each : size - (size_t)i * each;
    }
    return r;
}

/* Maps every chunk of r that is not resident; on a failure unmaps what it mapped. */
static CUresult back_region(struct vmm_region *r)
{
    for (int i = 0; i < r->chunk_count; i++) {
        if (r->chunks[i].resident)
            continue;
        CUresult result = kiwi_vmm_map_chunk(r->va, &r->chunks[i], r->device);
        if (result != CUDA_SUCCESS) {
            while (i-- > 0)
                kiwi_vmm_unmap_chunk(r->va, &r->chunks[i]);
            return result;
        }
    }
    return CUDA_SUCCESS;
}

/* Takes r off the card and out of the address space: its memory, its shadows (as spares),
 * its addresses. (After its context ended the driver may have taken them already.) */
static void destroy_region(struct vmm_region *r)
{
    for (int i = 0; i < r->chunk_count; i++) {
        struct vmm_chunk *c = &r->chunks[i];
        if (c->resident && kiwi_vmm_unmap_chunk(r->va, c) != CUDA_SUCCESS)
            kiwi_log("unmapping %zu bytes at 0x%llx failed", c->size,
                     (unsigned long long)(r->va + c->offset));
        spare_put(&c->shadow);
        free(c->pieces);
    }
    CUresult result = kiwi_vmm_driver.address_free(r->va, r->size);
    if (result != CUDA_SUCCESS)
        kiwi_log("freeing the addresses at 0x%llx failed (CUDA error %d)",
                 (unsigned long long)r->va, result);
    if (r->cached)
        cached_bytes -= r->size;
    unlink_region(r);
    free(r->chunks);
    free(r->units);
    free(r);
    if (!atomic_load(&all_backed))
        kiwi_vmm_recount_backed(); /* perhaps the last one that waited for room */
}

void kiwi_vmm_recount_backed(void)
{
    bool backed = !kiwi_vmm_evicted;
    for (struct vmm_region *r = first_region; backed && r; r = r->next)
        for (int i = 0; backed && i < r->chunk_count; i++)
            backed = r->chunks[i].resident;
    atomic_store(&all_backed, backed);
}

/* A region whose last allocation went: kept mapped for the next allocation of its size, or
 * the next small one for a slab (one chunk, all of it on the card, room in the cache), else
 * destroyed. */
static void let_go(struct vmm_region *r)
{
    bool keep = !r->pinned && !kiwi_vmm_evicted && r->chunk_count == 1 &&
                r->chunks[0].resident && cached_bytes + r->size <= CACHE_BYTES;
    if (!keep) {
        destroy_region(r);
        return;
    }
    if (r->slab)
        side_unlink(&slabs, r);
    side_link(&cache, r);
    r->cached = true;
    cached_bytes += r->size;
}

void kiwi_vmm_trim_cache(void)
{
    while (cache)
        destroy_region(cache);
}

static void uncache(struct vmm_region *r, CUcontext ctx)
{
    side_unlink(&cache, r);
    if (r->slab)
        side_link(&slabs, r);
    r->cached = false;
    r->ctx = ctx;
    cached_bytes -= r->size;
}

/* A cached region (a slab, or not) of exactly size bytes on device, taken out of the cache; or
 * NULL. */
static struct vmm_region *take_cached(size_t size, CUdevice device, CUcontext ctx, bool slab)
{
    for (struct vmm_region *r = cache; r; r = r->side_next) {
        if (r->slab != slab || r->size != size || r->device != device)
            continue;
        uncache(r, ctx);
        return r;
    }
    return NULL;
}

/* ---- allocations ------------------------------------------------------------------------ */

static void insert(struct vmm_allocation *a)
{
    size_t b = bucket(a->ptr);
    a->next = allocations[b];
    allocations[b] = a;
}

/* The live allocation at ptr, taken out of the table; NULL when none. */
static struct vmm_allocation *take(CUdeviceptr ptr)
{
    for (struct vmm_allocation **p = &allocations[bucket(ptr)]; *p; p = &(*p)->next) {
        if ((*p)->ptr != ptr)
            continue;
        struct vmm_allocation *a = *p;
        *p = a->next;
        a->next = NULL;
        return a;
    }
    return NULL;
}

/* In a slab: the first of count free units, or unit_count when there is no such run. */
static size_t free_run(const struct vmm_region *slab, size_t count)
{
    size_t run = 0;
    for (size_t i = 0; i < slab->unit_count; i++) {
        if (!(i & 63) && slab->units[i / 64] == ~0ull && i + 64 <= slab->unit_count) {
            run = 0;
            i += 63; /* a word wholly in use */
            continue;
        }
        run = slab->units[i / 64] >> (i & 63) & 1 ? 0 : run + 1;
        if (run == count)
            return i + 1 - count;
    }
    return slab->unit_count;
}

static void mark_units(struct vmm_region *slab, size_t first, size_t count, bool used)
{
    for (size_t i = first, end = first + count; i < end;) {
        size_t bit = i & 63, n = end - i < 64 - bit ? end - i : 64 - bit;
        uint64_t mask = (n == 64 ? ~0ull : (1ull << n) - 1) << bit;
        if (used)
            slab->units[i / 64] |= mask;
        else
            slab->units[i / 64] &= ~mask;
        i += n;
    }
    slab->units_used = used ? slab->units_used + count : slab->units_used - count;
}

/* The memory of an allocation goes: its units, or its region. */
static void release_allocation(struct vmm_allocation *a)
{
    struct vmm_region *r = a->region;
    if (r->slab)
        mark_units(r, a->first_unit, a->unit_count, false);
    if (--r->allocations == 0)
        let_go(r);
    free(a);
}

/* Reserves and (when back, and unless the memory is away) backs a new region; NULL with
 * *result on failure. */
static struct vmm_region *make_region(size_t size, size_t granule, CUcontext ctx,
                                      CUdevice device, bool slab, bool back, CUresult *result)
{
    CUdeviceptr va = 0;
    *result = kiwi_vmm_driver.reserve(&va, size, granule, 0, 0);
    if (*result != CUDA_SUCCESS)
        return NULL;
    struct vmm_region *r = region_new(va, size, granule, ctx, device, slab);
    if (!r) {
        kiwi_vmm_driver.address_free(va, size);
        *result = CUDA_ERROR_OUT_OF_MEMORY;
        return NULL;
    }
    *result = kiwi_vmm_evicted || !back ? CUDA_SUCCESS : back_region(r);
    if (*result != CUDA_SUCCESS) {
        kiwi_vmm_driver.address_free(va, size);
        free(r->chunks);
        free(r->units);
        free(r);
        return NULL;
    }
    link_region(r);
    return r;
}

/* A slab of ctx on device with count free units in a row; first: where. */
static struct vmm_region *slab_with_room(size_t count, CUcontext ctx, CUdevice device,
                                         size_t *first)
{
    for (struct vmm_region *r = slabs; r; r = r->side_next) {
        if (r->pinned || r->ctx != ctx || r->device != device ||
            r->unit_count - r->units_used < count)
            continue;
        *first = free_run(r, count);
        if (*first < r->unit_count)
            return r;
    }
    return NULL;
}

/* Under kiwi_vmm_lock: the memory for one allocation, in a slab or a region of its own; a new
 * one backed only when back. */
static CUresult place(struct vmm_allocation *a, size_t granule, CUcontext ctx, CUdevice device,
                      bool back)
{
    CUresult result = CUDA_SUCCESS;
    if (a->size < VMM_SLAB_LIMIT) {
        size_t count = (a->size + VMM_UNIT - 1) / VMM_UNIT, first = 0;
        struct vmm_region *slab = slab_with_room(count ? count : 1, ctx, device, &first);
        if (!slab) {
            first = 0;
            slab = take_cached(granule, device, ctx, true);
        }
        if (!slab)
            slab = make_region(granule, granule, ctx, device, true, back, &result);
        if (!slab)
            return result;
        a->first_unit = first;
        a->unit_count = count ? count : 1;
        mark_units(slab, first, a->unit_count, true);
        a->region = slab;
        a->ptr = slab->va + first * VMM_UNIT;
    } else {
        size_t size = round_up(a->size, granule);
        struct vmm_region *r = take_cached(size, device, ctx, false);
        if (!r)
            r = make_region(size, granule, ctx, device, false, back, &result);
        if (!r)
            return result;
        a->region = r;
        a->ptr = r->va;
    }
    a->region->allocations++;
    return CUDA_SUCCESS;
}

/* Under kiwi_vmm_lock: what can go to make room on the card: the cache, and the pending frees
 * (waiting for their events). */
static void make_room(void)
{
    kiwi_vmm_trim_cache();
    for (struct vmm_allocation *a = pending_first; a; a = a->next)
        if (a->event)
            kiwi_vmm_driver.event_synchronize(a->event);
    kiwi_vmm_reclaim(false);
}

static void start_builder(void);

/* Under kiwi_vmm_lock: where the memory of a placed allocation is. */
static enum kiwi_vmm_backing backing_of(const struct vmm_allocation *a)
{
    const struct vmm_region *r = a->region;
    for (int i = 0; i < r->chunk_count; i++)
        if (!r->chunks[i].resident)
            return kiwi_vmm_evicted ? KIWI_VMM_AWAY : KIWI_VMM_WAITS;
    return KIWI_VMM_BACKED;
}

CUresult kiwi_vmm_allocate(CUdeviceptr *dptr, size_t size, CUcontext ctx, CUdevice device,
                           CUmemoryPool pool, bool may_wait, enum kiwi_vmm_backing *backing)
{
    if (!kiwi_vmm_resolve())
        return CUDA_ERROR_NOT_INITIALIZED;
    size_t granule = kiwi_vmm_granularity(device);
    if (!granule)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (!dptr || !size)
        return CUDA_ERROR_INVALID_VALUE;
    if (size > SIZE_MAX - granule)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct vmm_allocation *a = calloc(1, sizeof *a);
    if (!a)
        return CUDA_ERROR_OUT_OF_MEMORY;
    a->size = size;
    a->pool = pool;
    pthread_mutex_lock(&kiwi_vmm_lock);
    if (pending_first)
        kiwi_vmm_reclaim(false);
    CUresult result = place(a, granule, ctx, device, true);
    if (result == CUDA_ERROR_OUT_OF_MEMORY) {
        make_room();
        result = place(a, granule, ctx, device, true);
    }
    if (result == CUDA_ERROR_OUT_OF_MEMORY && may_wait) {
        /* The card is full of other processes' memory: the addresses now, the memory once the
         * daemon has made room (the caller waits). */
        result = place(a, granule, ctx, device, false);
    }
    if (result == CUDA_SUCCESS) {
        *backing = backing_of(a);
        if (*backing != KIWI_VMM_BACKED)
            atomic_store(&all_backed, false);
        insert(a);
        count_in_pool(pool, (int64_t)size, (int64_t)size);
        *dptr = a->ptr;
        builder_stalled = false;
        pthread_cond_signal(&shadow_work);
    }
    pthread_mutex_unlock(&kiwi_vmm_lock);
    if (result != CUDA_SUCCESS) {
        free(a);
        return result;
    }
    start_builder();
    kiwi_log("vmm allocation of %zu bytes at 0x%llx", size, (unsigned long long)*dptr);
    return CUDA_SUCCESS;
}

/* ---- frees ------------------------------------------------------------------------------- */

static void pend(struct vmm_allocation *a)
{
    a->next = NULL;
    if (pending_last)
        pending_last->next = a;
    else
        pending_first = a;
    pending_last = a;
}

void kiwi_vmm_reclaim(bool synchronized)
{
    struct vmm_allocation **p = &pending_first, *last = NULL;
    bool in_order = true; /* events complete in order: stop at the first that has not */
    while (*p) {
        struct vmm_allocation *a = *p;
        bool done;
        if (a->event)
            done = synchronized ||
                   (in_order && kiwi_vmm_driver.event_query(a->event) == CUDA_SUCCESS);
        else
            done = synchronized;
        if (!done) {
            in_order = in_order && !a->event;
            last = a;
            p = &a->next;
            continue;
        }
        *p = a->next;
        if (a->event)
            kiwi_vmm_event_give(a->event_ctx, a->event);
        count_in_pool(a->pool, 0, -(int64_t)a->size);
        release_allocation(a);
    }
    pending_last = last;
}

/* The allocation at ptr, out of the table; or NULL. */
static struct vmm_allocation *take_locked(CUdeviceptr ptr)
{
    pthread_mutex_lock(&kiwi_vmm_lock);
    struct vmm_allocation *a = take(ptr);
    if (!a)
        pthread_mutex_unlock(&kiwi_vmm_lock);
    return a; /* locked when found */
}

/* Waits for the work queued in ctx (made current meanwhile, when it is not). */
static CUresult synchronize(CUcontext ctx)
{
    CUcontext current = NULL;
    kiwi_pager_driver.ctx_get(&current);
    if (ctx && current != ctx && kiwi_pager_driver.ctx_set(ctx) != CUDA_SUCCESS)
        return kiwi_pager_driver.ctx_sync(); /* gone: what runs is in the current one */
    CUresult result = kiwi_pager_driver.ctx_sync();
    if (ctx && current != ctx)
        kiwi_pager_driver.ctx_set(current);
    return result;
}

CUresult kiwi_vmm_free(struct allocation *record)
{
    CUdeviceptr ptr = (CUdeviceptr)record->key;
    bool capturing = kiwi_capture_open() > 0;
    if (!capturing) {
        CUresult result = synchronize(record->ctx);
        if (result != CUDA_SUCCESS) {
            kiwi_memory_end_free(record, result);
            return result;
        }
    }
    struct vmm_allocation *a = take_locked(ptr);
    if (!a) { /* the shim's table had it, this one not: its context went meanwhile */
        kiwi_memory_end_free(record, CUDA_SUCCESS);
        return CUDA_SUCCESS;
    }
    count_in_pool(a->pool, -(int64_t)a->size, capturing ? 0 : -(int64_t)a->size);
    if (capturing) {
        pend(a); /* no event: freed after the next release's synchronization */
        kiwi_log("free of 0x%llx during graph capture: done at the next release",
                 (unsigned long long)ptr);
    } else {
        release_allocation(a);
    }
    pthread_mutex_unlock(&kiwi_vmm_lock);
    kiwi_memory_end_free(record, CUDA_SUCCESS);
    return CUDA_SUCCESS;
}

CUresult kiwi_vmm_free_async(struct allocation *record, CUstream stream, bool capturing)
{
    CUdeviceptr ptr = (CUdeviceptr)record->key;
    CUcontext ctx = NULL;
    kiwi_pager_driver.ctx_get(&ctx);
    struct vmm_allocation *a = take_locked(ptr);
    if (!a) {
        kiwi_memory_end_free(record, CUDA_SUCCESS);
        return CUDA_SUCCESS;
    }
    CUevent event = NULL;
    if (!capturing) {
        event = kiwi_vmm_event_take(ctx);
        if (event && kiwi_vmm_driver.event_record(event, stream) != CUDA_SUCCESS) {
            kiwi_vmm_event_give(ctx, event);
            event = NULL;
        }
    }
    count_in_pool(a->pool, -(int64_t)a->size, 0);
    CUresult result = CUDA_SUCCESS;
    if (event || capturing) {
        a->event = event;
        a->event_ctx = ctx;
        pend(a);
        kiwi_vmm_reclaim(false);
    } else {
        /* No event to wait on: wait for the stream itself (with the lock let go). */
        pthread_mutex_unlock(&kiwi_vmm_lock);
        result = kiwi_pager_driver.stream_sync(stream);
        pthread_mutex_lock(&kiwi_vmm_lock);
        if (result == CUDA_SUCCESS) {
            count_in_pool(a->pool, 0, -(int64_t)a->size);
            release_allocation(a);
        } else {
            count_in_pool(a->pool, (int64_t)a->size, 0);
            insert(a);
        }
    }
    pthread_mutex_unlock(&kiwi_vmm_lock);
    kiwi_memory_end_free(record, result);
    return result;
}

void kiwi_vmm_free_deferred(void)
{
    pthread_mutex_lock(&kiwi_vmm_lock);
    kiwi_vmm_reclaim(true);
    pthread_mutex_unlock(&kiwi_vmm_lock);
}

/* ---- what stays where it is -------------------------------------------------------------- */

/* Under kiwi_vmm_lock: the region holding ptr, or NULL. */
static struct vmm_region *region_at(CUdeviceptr ptr)
{
    for (struct vmm_region *r = first_region; r; r = r->next)
        if (ptr - r->va < r->size && !r->cached)
            return r;
    return NULL;
}

bool kiwi_vmm_owns(CUdeviceptr ptr)
{
    pthread_mutex_lock(&kiwi_vmm_lock);
    bool owned = region_at(ptr) != NULL;
    pthread_mutex_unlock(&kiwi_vmm_lock);
    return owned;
}

void kiwi_vmm_retained(CUdeviceptr ptr)
{
    pthread_mutex_lock(&kiwi_vmm_lock);
    struct vmm_region *r = region_at(ptr);
    if (r && !r->pinned) {
        r->pinned = true;
        for (size_t b = 0; b < BUCKETS; b++)
            for (struct vmm_allocation *a = allocations[b]; a; a = a->next)
                if (a->region == r)
                    kiwi_memory_pin(a->ptr);
        kiwi_log("a handle of the memory at 0x%llx was handed out: its %zu bytes stay on the "
                 "card", (unsigned long long)r->va, r->size);
    }
    pthread_mutex_unlock(&kiwi_vmm_lock);
}

void kiwi_vmm_peer_enabled(CUcontext peer)
{
    if (!kiwi_vmm_resolve() || !kiwi_pager_driver.ctx_device)
        return;
    CUdevice accessor = -1, owner = -1;
    CUcontext current = NULL;
    kiwi_pager_driver.ctx_get(&current);
    kiwi_pager_driver.ctx_device(&accessor);
    if (kiwi_pager_driver.ctx_set(peer) == CUDA_SUCCESS)
        kiwi_pager_driver.ctx_device(&owner);
    kiwi_pager_driver.ctx_set(current);
    if (!kiwi_vmm_peer_note(owner, accessor))
        return;
    pthread_mutex_lock(&kiwi_vmm_lock);
    for (struct vmm_region *r = first_region; r; r = r->next) {
        for (int i = 0; r->device == owner && i < r->chunk_count; i++)
            if (r->chunks[i].resident)
                kiwi_vmm_set_access(r->va + r->chunks[i].offset, r->chunks[i].size, owner);
    }
    pthread_mutex_unlock(&kiwi_vmm_lock);
    kiwi_log("device %d may reach device %d's memory: every mapping there says so", accessor,
             owner);
}

/* ---- where the memory is ---------------------------------------------------------------- */

/* The figures last counted under kiwi_vmm_lock. A move (an eviction or a restore) holds that
 * lock for as long as it moves memory (seconds for tens of GiB): a reader then gets these, as
 * fresh as the move's last count, instead of waiting (the stats, %kiwi status). Any other holder
 * of the lock (an allocation, the shadow builder) is brief: a reader waits for it, so the figures
 * after a move (what `evicted` and the restore's report tell the daemon) are never older than it. */
static pthread_mutex_t last_counted_lock = PTHREAD_MUTEX_INITIALIZER;
static struct kiwi_residency last_counted;
static atomic_bool moving;

void kiwi_vmm_residency(struct kiwi_residency *out)
{
    if (pthread_mutex_trylock(&kiwi_vmm_lock) != 0) {
        if (atomic_load(&moving)) {
            pthread_mutex_lock(&last_counted_lock);
            *out = last_counted;
            pthread_mutex_unlock(&last_counted_lock);
            return;
        }
        pthread_mutex_lock(&kiwi_vmm_lock);
    }
    kiwi_vmm_residency_locked(out);
    pthread_mutex_unlock(&kiwi_vmm_lock);
}

void kiwi_vmm_moving(bool now)
{
    atomic_store(&moving, now);
}

static void count_residency(struct kiwi_residency *out);

void kiwi_vmm_residency_locked(struct kiwi_residency *out)
{
    count_residency(out);
    pthread_mutex_lock(&last_counted_lock);
    last_counted = *out;
    pthread_mutex_unlock(&last_counted_lock);
}

static void count_residency(struct kiwi_residency *out)
{
    *out = (struct kiwi_residency){0};
    for (struct vmm_region *r = first_region; r; r = r->next) {
        for (int i = 0; i < r->chunk_count; i++) {
            const struct vmm_chunk *c = &r->chunks[i];
            if (c->resident)
                out->resident += c->size;
            for (size_t p = 0; !c->resident && p < c->piece_count; p++)
                out->host += c->pieces[p].size;
            out->shadow += c->shadow.size;
            if (kiwi_vmm_shadow_pinned(&c->shadow))
                out->shadow_pinned += c->shadow.size;
        }
    }
    for (struct spare *s = spares; s; s = s->next) {
        out->shadow += s->shadow.size;
        if (kiwi_vmm_shadow_pinned(&s->shadow))
            out->shadow_pinned += s->shadow.size;
    }
    out->seconds_pinning = seconds_pinning;
}

bool kiwi_vmm_movable(void)
{
    bool movable = false;
    pthread_mutex_lock(&kiwi_vmm_lock);
    for (struct vmm_region *r = first_region; r && !movable; r = r->next)
        for (int i = 0; !r->pinned && i < r->chunk_count && !movable; i++)
            movable = r->chunks[i].resident;
    pthread_mutex_unlock(&kiwi_vmm_lock);
    return movable;
}

bool kiwi_vmm_away(void)
{
    return !atomic_load(&all_backed);
}

/* ---- the shadow builder ----------------------------------------------------------------- */

/* Under kiwi_vmm_lock: a chunk that wants a shadow: none yet, or a pageable one an eviction
 * took in a hurry while the chunk is back on the card (its bytes are not needed then). */
static bool next_work(struct vmm_region **region, int *index)
{
    bool pin = kiwi_cfg.shadow != KIWI_SHADOW_PAGEABLE;
    for (struct vmm_region *r = first_region; r; r = r->next) {
        if (r->pinned || r->cached)
            continue;
        for (int i = 0; i < r->chunk_count; i++) {
            const struct vmm_chunk *c = &r->chunks[i];
            if (c->shadow.kind == SHADOW_NONE ||
                (pin && c->shadow.kind == SHADOW_PAGEABLE && c->resident)) {
                *region = r;
                *index = i;
                return true;
            }
        }
    }
    return false;
}

static struct vmm_region *region_with_serial(uint64_t serial)
{
    for (struct vmm_region *r = first_region; r; r = r->next)
        if (r->serial == serial)
            return r;
    return NULL;
}

static void *build_shadows(void *unused)
{
    (void)unused;
    pthread_mutex_lock(&kiwi_vmm_lock);
    for (;;) {
        struct vmm_region *r;
        int index;
        if (builder_stalled || !next_work(&r, &index)) {
            pthread_cond_wait(&shadow_work, &kiwi_vmm_lock);
            continue;
        }
        uint64_t serial = r->serial;
        size_t size = r->chunks[index].size;
        CUcontext ctx = r->ctx;
        bool upgrade = r->chunks[index].shadow.kind == SHADOW_PAGEABLE;
        struct vmm_shadow shadow = spare_take(size);
        if (shadow.kind == SHADOW_NONE || (upgrade && !kiwi_vmm_shadow_pinned(&shadow))) {
            spare_put(&shadow);
            pthread_mutex_unlock(&kiwi_vmm_lock);
            double started = kiwi_now();
            kiwi_pager_driver.ctx_set(ctx); /* pinned memory is registered in a context */
            shadow = kiwi_vmm_shadow_make(size);
            double took = kiwi_now() - started;
            pthread_mutex_lock(&kiwi_vmm_lock);
            seconds_pinning += took;
            if (shadow.kind == SHADOW_NONE || (upgrade && !kiwi_vmm_shadow_pinned(&shadow))) {
                builder_stalled = true; /* host memory ran out: wait for the next change */
                kiwi_warn("no host memory for a shadow of %zu bytes: an eviction copies it to "
                          "memory made then", size);
                spare_put(&shadow);
                continue;
            }
        }
        r = region_with_serial(serial);
        struct vmm_chunk *c = r && index < r->chunk_count ? &r->chunks[index] : NULL;
        bool wanted = c && !r->pinned &&
                      (c->shadow.kind == SHADOW_NONE ||
                       (c->shadow.kind == SHADOW_PAGEABLE && c->resident &&
                        kiwi_vmm_shadow_pinned(&shadow)));
        if (!wanted) {
            spare_put(&shadow);
            continue;
        }
        if (c->shadow.kind != SHADOW_NONE)
            kiwi_vmm_shadow_free(&c->shadow); /* the pageable one: its bytes are on the card */
        c->shadow = shadow;
    }
    return NULL;
}

static void start_builder(void)
{
    pthread_mutex_lock(&kiwi_vmm_lock);
    bool start = !builder_started;
    builder_started = true;
    pthread_mutex_unlock(&kiwi_vmm_lock);
    if (start && !kiwi_thread_start(build_shadows))
        kiwi_warn("no thread to build host shadows: evictions copy to memory made then");
}

void kiwi_vmm_shadows_changed(void)
{
    builder_stalled = false;
    pthread_cond_signal(&shadow_work);
}

/* ---- contexts and forks ------------------------------------------------------------------ */

void kiwi_vmm_forget_context(CUcontext ctx)
{
    pthread_mutex_lock(&kiwi_vmm_lock);
    /* Its allocations went with it: their memory goes too (the driver frees cuMemAlloc'd
     * memory with its context; VMM memory outlives contexts, so the shim frees it itself). */
    for (size_t b = 0; b < BUCKETS; b++) {
        struct vmm_allocation **p = &allocations[b];
        while (*p) {
            if ((*p)->region->ctx != ctx) {
                p = &(*p)->next;
                continue;
            }
            struct vmm_allocation *a = *p;
            *p = a->next;
            count_in_pool(a->pool, -(int64_t)a->size, -(int64_t)a->size);
            release_allocation(a);
        }
    }
    for (struct vmm_allocation **p = &pending_first; *p;) {
        struct vmm_allocation *a = *p;
        if (a->region->ctx != ctx && a->event_ctx != ctx) {
            p = &a->next;
            continue;
        }
        *p = a->next; /* its event went with the context */
        count_in_pool(a->pool, 0, -(int64_t)a->size);
        release_allocation(a);
    }
    pending_last = NULL;
    for (struct vmm_allocation *a = pending_first; a; a = a->next)
        pending_last = a;
    for (struct vmm_region *r = first_region; r;) {
        struct vmm_region *next = r->next;
        if (r->ctx == ctx && r->cached)
            destroy_region(r);
        r = next;
    }
    struct vmm_context *c = context_of(ctx, false);
    if (c)
        *c = contexts[--context_count]; /* its stream and events went with it */
    kiwi_vmm_recount_backed();
    pthread_mutex_unlock(&kiwi_vmm_lock);
}

void kiwi_vmm_after_fork(void)
{
    /* A forked child owns none of its parent's device memory, and no thread of its: what the
     * parent's tables hold is left behind unfreed, as memory.c leaves its records. */
    pthread_mutex_init(&kiwi_vmm_lock, NULL);
    pthread_cond_init(&shadow_work, NULL);
    first_region = last_region = slabs = cache = NULL;
    memset(allocations, 0, sizeof allocations);
    pending_first = pending_last = NULL;
    cached_bytes = 0;
    context_count = 0;
    pool_count = 0;
    spares = NULL;
    spare_bytes = 0;
    builder_started = builder_stalled = false;
    kiwi_vmm_evicted = false;
    atomic_store(&all_backed, true);
    seconds_pinning = 0;
    kiwi_vmm_chunks_after_fork();
}
