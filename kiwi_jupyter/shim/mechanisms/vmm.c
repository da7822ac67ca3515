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
 * Host shadows are pinned by a thread of the vmm evictor's own, ahead of time, as chunks appear,
 * within a budget (vmm_builder.c), and kept with their chunk across evictions; a freed chunk's
 * shadow is kept as a spare for the next chunk of its size.
 *
 * A region whose physical handle was handed out (cuMemRetainAllocationHandle: an export, an
 * NCCL registration) stays where it is: a handle held elsewhere keeps the memory alive, and a
 * restore into new memory would part the two. It is counted and reported as not evictable.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "vmm.h"

#define BUCKETS 4096
#define MAX_CONTEXTS 16
#define SPARE_EVENTS 64
#define MAX_POOLS 16
#define CACHE_BYTES ((uint64_t)512 << 20)
/* A free asks whether the pending frees are done once this much more has been freed since it
 * last asked (an allocation that finds no memory asks every time). */
#define PENDING_ASK_BYTES ((uint64_t)256 << 20)

pthread_mutex_t kiwi_vmm_lock = PTHREAD_MUTEX_INITIALIZER;
bool kiwi_vmm_evicted;
/* Whether every chunk is on the card: none away after an eviction, none waiting for room.
 * Written under kiwi_vmm_lock, read without it (a move holds the lock for seconds). */
static atomic_bool all_backed = true;

struct vmm_region *kiwi_vmm_first_region;
static struct vmm_region *last_region;
static struct vmm_region *slabs, *cache; /* (side lists) slabs in use; regions kept for reuse */
static uint64_t next_serial = 1;
static struct vmm_allocation *allocations[BUCKETS];
static struct vmm_allocation *pending_first, *pending_last;
static uint64_t cached_bytes;
/* Bytes freed and pending; and what they were when their events were last asked about. */
static uint64_t pending_bytes, pending_when_asked;
/* CU_POINTER_ATTRIBUTE_BUFFER_ID of the allocations: far above the driver's own counter, so
 * that no id the driver gives another buffer of the process is ever one of these. */
static uint64_t next_buffer_id = (uint64_t)1 << 48;

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
        kiwi_vmm_first_region = r;
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
    kiwi_vmm_index_remove(r);
    if (r->cached)
        side_unlink(&cache, r);
    else if (r->slab)
        side_unlink(&slabs, r);
    if (r->prev)
        r->prev->next = r->next;
    else
        kiwi_vmm_first_region = r->next;
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
        r->starts = calloc((r->unit_count + 63) / 64, sizeof *r->starts);
    }
    if (!r || !r->chunks || (slab && (!r->units || !r->starts))) {
        if (r) {
            free(r->chunks);
            free(r->units);
            free(r->starts);
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
 * its addresses, its export (what an importer mapped stays alive on the card until it lets it
 * go). (After its context ended the driver may have taken them already.) */
static void destroy_region(struct vmm_region *r)
{
    if (r->export) {
        for (int i = 0; i < r->chunk_count; i++)
            if (r->export->chunk_fds[i] >= 0)
                close(r->export->chunk_fds[i]);
        close(r->export->manifest);
        free(r->export);
    }
    for (int i = 0; i < r->chunk_count; i++) {
        struct vmm_chunk *c = &r->chunks[i];
        if (c->resident && kiwi_vmm_unmap_chunk(r->va, c) != CUDA_SUCCESS)
            kiwi_log("unmapping %zu bytes at 0x%llx failed", c->size,
                     (unsigned long long)(r->va + c->offset));
        kiwi_vmm_spare_put(&c->shadow);
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
    free(r->starts);
    free(r);
    if (!atomic_load(&all_backed))
        kiwi_vmm_recount_backed(); /* perhaps the last one that waited for room */
}

void kiwi_vmm_recount_backed(void)
{
    bool backed = !kiwi_vmm_evicted;
    for (struct vmm_region *r = kiwi_vmm_first_region; backed && r; r = r->next)
        for (int i = 0; backed && i < r->chunk_count; i++)
            backed = r->chunks[i].resident;
    atomic_store(&all_backed, backed);
}

/* A region whose last allocation went: kept mapped for the next allocation of its size, or
 * the next small one for a slab (one chunk, all of it on the card, room in the cache), else
 * destroyed. */
static void let_go(struct vmm_region *r)
{
    /* No longer the program's: out of the working set, and of the limit. */
    kiwi_memory_unreserve(r->size, MAPPED);
    if (r->pinned)
        kiwi_memory_pinned(-(int64_t)r->size);
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

/* The live allocation starting at ptr; NULL when none. */
static struct vmm_allocation *find(CUdeviceptr ptr)
{
    for (struct vmm_allocation *a = allocations[bucket(ptr)]; a; a = a->next)
        if (a->ptr == ptr)
            return a;
    return NULL;
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
    if (r->slab) {
        mark_units(r, a->first_unit, a->unit_count, false);
        r->starts[a->first_unit / 64] &= ~(1ull << (a->first_unit % 64));
    }
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
    if (*result == CUDA_SUCCESS && !kiwi_vmm_index_add(r)) {
        for (int i = 0; i < r->chunk_count; i++)
            if (r->chunks[i].resident)
                kiwi_vmm_unmap_chunk(r->va, &r->chunks[i]);
        *result = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (*result != CUDA_SUCCESS) {
        kiwi_vmm_driver.address_free(va, size);
        free(r->chunks);
        free(r->units);
        free(r->starts);
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

/* Under kiwi_vmm_lock: a region of size bytes for the program (a slab, or one allocation's
 * own), kept for reuse or new. Its bytes are the card's the working set counts (whole granules,
 * not the bytes asked for: what the daemon must plan with), reserved against the limit first;
 * they are given back when the region is let go. A new one is backed only when back. */
static struct vmm_region *region_for(size_t size, size_t granule, CUcontext ctx,
                                     CUdevice device, bool slab, bool back, CUresult *result)
{
    if (!kiwi_memory_reserve(size, MAPPED, device)) {
        *result = CUDA_ERROR_OUT_OF_MEMORY;
        return NULL;
    }
    struct vmm_region *r = take_cached(size, device, ctx, slab);
    if (!r)
        r = make_region(size, granule, ctx, device, slab, back, result);
    if (!r)
        kiwi_memory_unreserve(size, MAPPED);
    return r;
}

/* The units of a slab an allocation takes (0: a region of its own), and that region's bytes:
 * size classes for a stream-ordered one (vmm_reuse.c), else what it asks for. */
static size_t units_for(size_t size, bool stream_ordered)
{
    if (size >= VMM_SLAB_LIMIT)
        return 0;
    size_t units = stream_ordered ? kiwi_vmm_class_units(size) : (size + VMM_UNIT - 1) / VMM_UNIT;
    return units ? units : 1;
}

static size_t bytes_for(size_t size, size_t granule, bool stream_ordered)
{
    return stream_ordered ? kiwi_vmm_class_bytes(size, granule) : round_up(size, granule);
}

/* Under kiwi_vmm_lock: the memory for one allocation, in a slab or a region of its own; a new
 * one backed only when back. */
static CUresult place(struct vmm_allocation *a, size_t granule, CUcontext ctx, CUdevice device,
                      bool back)
{
    CUresult result = CUDA_SUCCESS;
    size_t count = units_for(a->size, a->stream_ordered);
    if (count) {
        size_t first = 0;
        struct vmm_region *slab = slab_with_room(count, ctx, device, &first);
        if (!slab) {
            first = 0;
            slab = region_for(granule, granule, ctx, device, true, back, &result);
        }
        if (!slab)
            return result;
        a->first_unit = first;
        a->unit_count = count;
        mark_units(slab, first, a->unit_count, true);
        slab->starts[first / 64] |= 1ull << (first % 64);
        a->region = slab;
        a->ptr = slab->va + first * VMM_UNIT;
    } else {
        struct vmm_region *r = region_for(bytes_for(a->size, granule, a->stream_ordered),
                                          granule, ctx, device, false, back, &result);
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

static void unpend(struct vmm_allocation *a);

/* Under kiwi_vmm_lock: a pending free of the same stream and size class, taken back for a new
 * allocation of size (stream-ordered reuse: vmm_reuse.c); NULL when there is none. Its
 * placement, and what it takes on the card, stay; what the pool counts moves over. */
static struct vmm_allocation *reuse(size_t size, size_t granule, CUcontext ctx, CUdevice device,
                                    const struct kiwi_stream_order *order)
{
    struct vmm_stream stream = kiwi_vmm_stream(ctx, order->stream);
    size_t units = units_for(size, true);
    size_t bytes = units ? units * VMM_UNIT : bytes_for(size, granule, true);
    struct vmm_allocation *a = kiwi_vmm_reuse_find(&stream, bytes, device);
    if (!a)
        return NULL;
    unpend(a);
    kiwi_vmm_event_give(a->event_ctx, a->event);
    count_in_pool(a->pool, 0, -(int64_t)a->size);
    *a = (struct vmm_allocation){.ptr = a->ptr, .region = a->region,
                                 .first_unit = a->first_unit, .unit_count = a->unit_count};
    return a;
}

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
                           const struct kiwi_stream_order *order, bool may_wait,
                           enum kiwi_vmm_backing *backing)
{
    if (!kiwi_vmm_resolve())
        return CUDA_ERROR_NOT_INITIALIZED;
    size_t granule = kiwi_vmm_granularity(device);
    if (!granule)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (!dptr || !size)
        return CUDA_ERROR_INVALID_VALUE;
    if (size > SIZE_MAX / 2 - granule)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult result = CUDA_SUCCESS;
    pthread_mutex_lock(&kiwi_vmm_lock);
    struct vmm_allocation *a = order ? reuse(size, granule, ctx, device, order) : NULL;
    bool reused = a != NULL;
    if (!a && (a = calloc(1, sizeof *a)) == NULL)
        result = CUDA_ERROR_OUT_OF_MEMORY;
    if (!reused && a) {
        a->size = size;
        a->stream_ordered = order != NULL;
        /* No memory of its own stream's to reuse: what other frees have finished may go. */
        if (pending_first)
            kiwi_vmm_reclaim(false);
        result = place(a, granule, ctx, device, true);
        if (result == CUDA_ERROR_OUT_OF_MEMORY) {
            make_room();
            result = place(a, granule, ctx, device, true);
        }
        if (result == CUDA_ERROR_OUT_OF_MEMORY && may_wait) {
            /* The card is full of other processes' memory: the addresses now, the memory once
             * the daemon has made room (the caller waits). */
            result = place(a, granule, ctx, device, false);
        }
    }
    if (result == CUDA_SUCCESS) {
        a->size = size;
        a->pool = order ? order->pool : NULL;
        a->stream_ordered = order != NULL;
        a->buffer_id = next_buffer_id++;
        *backing = backing_of(a);
        if (*backing != KIWI_VMM_BACKED)
            atomic_store(&all_backed, false);
        insert(a);
        count_in_pool(a->pool, (int64_t)size, (int64_t)size);
        *dptr = a->ptr;
        if (!reused)
            kiwi_vmm_shadows_changed();
    }
    pthread_mutex_unlock(&kiwi_vmm_lock);
    if (result != CUDA_SUCCESS) {
        free(a);
        return result;
    }
    if (!reused)
        kiwi_vmm_builder_start();
    kiwi_log("vmm allocation of %zu bytes at 0x%llx%s", size, (unsigned long long)*dptr,
             reused ? " (its stream's, reused)" : "");
    return CUDA_SUCCESS;
}

/* ---- frees ------------------------------------------------------------------------------- */

/* The list of pending frees, in the order they were made (doubly linked: stream-ordered reuse
 * takes one out of the middle). */
static void pend(struct vmm_allocation *a)
{
    a->next = NULL;
    a->prev = pending_last;
    if (pending_last)
        pending_last->next = a;
    else
        pending_first = a;
    pending_last = a;
    pending_bytes += a->size;
}

static void unpend(struct vmm_allocation *a)
{
    if (a->prev)
        a->prev->next = a->next;
    else
        pending_first = a->next;
    if (a->next)
        a->next->prev = a->prev;
    else
        pending_last = a->prev;
    a->next = a->prev = NULL;
    kiwi_vmm_reuse_unfile(a);
    pending_bytes -= a->size;
}

void kiwi_vmm_reclaim(bool synchronized)
{
    bool in_order = true; /* events complete in order: stop at the first that has not */
    pending_when_asked = pending_bytes;
    for (struct vmm_allocation *a = pending_first, *next; a; a = next) {
        next = a->next;
        bool done;
        if (a->event)
            done = synchronized ||
                   (in_order && kiwi_vmm_driver.event_query(a->event) == CUDA_SUCCESS);
        else
            done = synchronized;
        if (!done) {
            in_order = in_order && !a->event;
            continue;
        }
        unpend(a);
        if (a->event)
            kiwi_vmm_event_give(a->event_ctx, a->event);
        count_in_pool(a->pool, 0, -(int64_t)a->size);
        release_allocation(a);
    }
    pending_when_asked = pending_bytes;
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
        a->freed_on = kiwi_vmm_stream(ctx, stream);
        pend(a);
        if (event)
            kiwi_vmm_reuse_file(a); /* its stream's next allocation may have it at once */
        if (pending_bytes > pending_when_asked + PENDING_ASK_BYTES)
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
    struct vmm_region *r = kiwi_vmm_index_find(ptr);
    return r && !r->cached ? r : NULL;
}

/* In a slab: the last unit at or before unit where an allocation starts; unit_count if none. */
static size_t start_before(const struct vmm_region *slab, size_t unit)
{
    size_t word = unit / 64;
    uint64_t bits = slab->starts[word] & (~0ull >> (63 - unit % 64));
    while (!bits) {
        if (word == 0)
            return slab->unit_count;
        bits = slab->starts[--word];
    }
    return word * 64 + 63 - (size_t)__builtin_clzll(bits);
}

/* Under kiwi_vmm_lock: the live allocation holding ptr, or NULL (freed memory included). */
static struct vmm_allocation *allocation_at(CUdeviceptr ptr)
{
    struct vmm_region *r = region_at(ptr);
    if (!r)
        return NULL;
    if (!r->slab)
        return find(r->va);
    size_t unit = (ptr - r->va) / VMM_UNIT, first = start_before(r, unit);
    struct vmm_allocation *a = first < r->unit_count ? find(r->va + first * VMM_UNIT) : NULL;
    return a && unit < a->first_unit + a->unit_count && ptr - a->ptr < a->size ? a : NULL;
}

bool kiwi_vmm_facts(CUdeviceptr ptr, struct kiwi_vmm_facts *out)
{
    pthread_mutex_lock(&kiwi_vmm_lock);
    struct vmm_allocation *a = allocation_at(ptr);
    if (a) {
        const struct vmm_region *r = a->region;
        bool away = false;
        for (int i = 0; i < r->chunk_count && !away; i++) {
            const struct vmm_chunk *c = &r->chunks[i];
            away = !c->resident && c->offset < a->ptr - r->va + a->size &&
                   a->ptr - r->va < c->offset + c->size;
        }
        *out = (struct kiwi_vmm_facts){
            .base = a->ptr, .size = a->size, .ctx = a->stream_ordered ? NULL : r->ctx,
            .stream_ordered = a->stream_ordered,
            .device = r->device, .pool = a->pool, .buffer_id = a->buffer_id,
            .sync_memops = a->sync_memops, .away = away};
    }
    pthread_mutex_unlock(&kiwi_vmm_lock);
    return a != NULL;
}

bool kiwi_vmm_set_sync_memops(CUdeviceptr ptr, bool on)
{
    pthread_mutex_lock(&kiwi_vmm_lock);
    struct vmm_allocation *a = allocation_at(ptr);
    if (a)
        a->sync_memops = on;
    pthread_mutex_unlock(&kiwi_vmm_lock);
    return a != NULL;
}

bool kiwi_vmm_owns(CUdeviceptr ptr)
{
    pthread_mutex_lock(&kiwi_vmm_lock);
    bool owned = region_at(ptr) != NULL;
    pthread_mutex_unlock(&kiwi_vmm_lock);
    return owned;
}

struct vmm_region *kiwi_vmm_allocation_region(CUdeviceptr ptr, CUdeviceptr *base, size_t *size)
{
    struct vmm_allocation *a = allocation_at(ptr);
    if (!a)
        return NULL;
    *base = a->ptr;
    *size = a->size;
    return a->region;
}

void kiwi_vmm_pin(struct vmm_region *r, const char *why)
{
    if (r->pinned || r->cached)
        return;
    r->pinned = true;
    kiwi_memory_pinned((int64_t)r->size);
    for (size_t b = 0; b < BUCKETS; b++)
        for (struct vmm_allocation *a = allocations[b]; a; a = a->next)
            if (a->region == r)
                kiwi_memory_pin(a->ptr);
    kiwi_log("%s the memory at 0x%llx: its %zu bytes stay on the card", why,
             (unsigned long long)r->va, r->size);
}

void kiwi_vmm_retained(CUdeviceptr ptr, size_t size)
{
    pthread_mutex_lock(&kiwi_vmm_lock);
    struct vmm_region *const *regions;
    size_t count = kiwi_vmm_index_overlapping(ptr, size ? size : 1, &regions);
    for (size_t i = 0; i < count; i++)
        kiwi_vmm_pin(regions[i], "a handle was handed out of");
    pthread_mutex_unlock(&kiwi_vmm_lock);
}

bool kiwi_vmm_away_in(CUdeviceptr ptr, size_t size)
{
    bool away = false;
    pthread_mutex_lock(&kiwi_vmm_lock);
    struct vmm_region *const *regions;
    size_t count = kiwi_vmm_index_overlapping(ptr, size ? size : 1, &regions);
    for (size_t i = 0; i < count && !away; i++)
        for (int c = 0; c < regions[i]->chunk_count && !away; c++)
            away = !regions[i]->cached && !regions[i]->chunks[c].resident;
    pthread_mutex_unlock(&kiwi_vmm_lock);
    return away;
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
    for (struct vmm_region *r = kiwi_vmm_first_region; r; r = r->next) {
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

void kiwi_vmm_residency(struct kiwi_residency *out)
{
    if (pthread_mutex_trylock(&kiwi_vmm_lock) != 0) {
        if (kiwi_vmm_move_running()) {
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
    for (struct vmm_region *r = kiwi_vmm_first_region; r; r = r->next) {
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
    kiwi_vmm_builder_count(out);
}

bool kiwi_vmm_movable(void)
{
    bool movable = false;
    pthread_mutex_lock(&kiwi_vmm_lock);
    for (struct vmm_region *r = kiwi_vmm_first_region; r && !movable; r = r->next)
        for (int i = 0; !r->pinned && i < r->chunk_count && !movable; i++)
            movable = r->chunks[i].resident;
    pthread_mutex_unlock(&kiwi_vmm_lock);
    return movable;
}

bool kiwi_vmm_away(void)
{
    return !atomic_load(&all_backed);
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
    for (struct vmm_allocation *a = pending_first, *next; a; a = next) {
        next = a->next;
        if (a->region->ctx != ctx && a->event_ctx != ctx)
            continue;
        unpend(a); /* its event went with the context */
        count_in_pool(a->pool, 0, -(int64_t)a->size);
        release_allocation(a);
    }
    for (struct vmm_region *r = kiwi_vmm_first_region; r;) {
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
    /* Except the descriptors of what the parent shared: open here they would keep its memory
     * on the card after the parent freed it, for as long as the child lives. */
    for (struct vmm_region *r = kiwi_vmm_first_region; r; r = r->next) {
        for (int i = 0; r->export && i < r->chunk_count; i++)
            if (r->export->chunk_fds[i] >= 0)
                close(r->export->chunk_fds[i]);
        if (r->export)
            close(r->export->manifest);
    }
    kiwi_vmm_first_region = last_region = slabs = cache = NULL;
    memset(allocations, 0, sizeof allocations);
    pending_first = pending_last = NULL;
    pending_bytes = pending_when_asked = 0;
    kiwi_vmm_reuse_after_fork();
    cached_bytes = 0;
    context_count = 0;
    pool_count = 0;
    kiwi_vmm_evicted = false;
    kiwi_vmm_index_after_fork();
    kiwi_vmm_builder_after_fork();
    atomic_store(&all_backed, true);
    kiwi_vmm_chunks_after_fork();
}
