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
 * This file places each allocation (kept in the shim's one table, memory.c): in a slab
 * (vmm_slabs.c), a region kept for reuse (vmm_cache.c), a pending free of its own stream
 * (vmm_reuse.c) or a new region (vmm_regions.c); and ends what a context held. Frees are
 * vmm_frees.c's.
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
#include <stdlib.h>

#include "vmm.h"

/* CU_POINTER_ATTRIBUTE_BUFFER_ID of the allocations: far above the driver's own counter, so
 * that no id the driver gives another buffer of the process is ever one of these. */
static uint64_t next_buffer_id = (uint64_t)1 << 48;

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
    struct vmm_region *r = kiwi_vmm_take_cached(size, device, ctx, slab);
    if (!r)
        r = kiwi_vmm_make_region(size, granule, ctx, device, slab, back, result);
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
    return stream_ordered ? kiwi_vmm_class_bytes(size, granule) : kiwi_vmm_round_up(size, granule);
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
        struct vmm_region *slab = kiwi_vmm_slab_with_room(count, ctx, device, &first);
        if (!slab) {
            first = 0;
            slab = region_for(granule, granule, ctx, device, true, back, &result);
        }
        if (!slab)
            return result;
        a->first_unit = first;
        a->unit_count = count;
        kiwi_vmm_mark_units(slab, first, a->unit_count, true);
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
    kiwi_vmm_pending_finish();
}

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
    kiwi_vmm_unpend(a);
    kiwi_vmm_event_give(a->event_ctx, a->event);
    kiwi_vmm_count_in_pool(a->pool, 0, -(int64_t)a->size);
    *a = (struct vmm_allocation){.ptr = a->ptr, .region = a->region,
                                 .first_unit = a->first_unit, .unit_count = a->unit_count};
    return a;
}

/* Under kiwi_vmm_lock: where the memory of a placed allocation is. */
enum kiwi_vmm_backing backing_of(const struct vmm_allocation *a)
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
        if (kiwi_vmm_pending())
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
        /* Into the one table (the working set grows), under this lock, so that no question
         * about the address finds it placed and not yet recorded. */
        if (!kiwi_memory_track_placement(a->ptr, size, ctx, device, a)) {
            kiwi_vmm_release(a); /* frees a */
            a = NULL;
            result = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    if (result == CUDA_SUCCESS) {
        *backing = backing_of(a);
        if (*backing != KIWI_VMM_BACKED)
            atomic_store(&kiwi_vmm_all_backed, false);
        kiwi_vmm_count_in_pool(a->pool, (int64_t)size, (int64_t)size);
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

void kiwi_vmm_forget_context(CUcontext ctx)
{
    pthread_mutex_lock(&kiwi_vmm_lock);
    /* Its allocations went with it: their memory goes too (the driver frees cuMemAlloc'd
     * memory with its context; VMM memory outlives contexts, so the shim frees it itself). */
    kiwi_vmm_allocations_forget(ctx);
    kiwi_vmm_pending_forget(ctx);
    kiwi_vmm_cache_forget(ctx);
    kiwi_vmm_contexts_forget(ctx);
    kiwi_vmm_recount_backed();
    pthread_mutex_unlock(&kiwi_vmm_lock);
}

void kiwi_vmm_after_fork(void)
{
    /* A forked child owns none of its parent's device memory, and no thread of its: what the
     * parent's lists hold is left behind unfreed, as memory.c leaves its records. */
    pthread_mutex_init(&kiwi_vmm_lock, NULL);
    kiwi_vmm_regions_after_fork();
    kiwi_vmm_slabs_after_fork();
    kiwi_vmm_cache_after_fork();
    kiwi_vmm_frees_after_fork();
    kiwi_vmm_reuse_after_fork();
    kiwi_vmm_contexts_after_fork();
    kiwi_vmm_pools_after_fork();
    kiwi_vmm_index_after_fork();
    kiwi_vmm_builder_after_fork();
    kiwi_vmm_chunks_after_fork();
}
