/* The managed evictor: allocations become managed memory (cuMemAllocManaged): their pages can
 * live on the GPU or in host memory, and a device pointer to managed memory works everywhere a
 * device pointer does, so the process cannot tell the difference. Its move: the working set, to
 * host memory and back.
 *
 * nvshare leaves this to page faults: the next holder faults its pages in one by one and the
 * driver evicts the previous holder's pages to make room, at a fraction of the link's speed.
 * The shim moves the whole working set with cuMemPrefetchAsync instead: out to host memory
 * before it releases the GPU (only when the daemon says the next holder needs the room), and
 * back to the GPU when a grant arrives, before any work resumes. Prefetches run on streams of
 * the pager's own, one per context (contexts.c), so they never wait behind (or hold up) the
 * process's streams, and they are bulk copies at link speed.
 *
 * Blocks the framework's cache holds free (free_ranges.c) are not moved either way: an eviction
 * discards them where the driver can (CUDA 13's cuMemDiscardBatchAsync: their pages are dropped,
 * nothing is copied, and the next holder gets the room at once) and else just leaves them out of
 * the prefetch, so the driver moves them only if the next holder's pages need their room; a
 * restore leaves them to be faulted in when the framework hands them out again.
 */
#define _GNU_SOURCE
#include <stdlib.h>

#include "memory.h"
#include "pager.h"

void kiwi_managed_move(enum kiwi_page_direction direction, struct kiwi_transfer *moved)
{
    bool to_host = direction == KIWI_PAGE_OUT;
    *moved = (struct kiwi_transfer){0};
    if (!kiwi_pager_resolve() || !kiwi_pager_driver.ctx_set ||
        !kiwi_pager_driver.stream_create || !kiwi_pager_driver.stream_sync)
        return;
    double started = kiwi_now();
    struct move move = {.to_host = to_host};
    /* A copy of the list, so that allocating threads never wait for the transfer; frees do
     * wait (kiwi_memory_paging_begin), so that no address in the copy is freed meanwhile. */
    struct kiwi_range *ranges;
    size_t count = kiwi_memory_paging_begin(KIWI_RANGES_MANAGED, &ranges);
    /* The framework's free blocks apart: live pieces first, then free ones. */
    struct kiwi_range *pieces;
    size_t live;
    size_t total = kiwi_free_ranges_split(ranges, count, &pieces, &live);
    const struct kiwi_range *moving = total ? pieces : ranges;
    const struct kiwi_range *free_ranges = moving + live;
    size_t free_count = total ? total - live : 0;
    uint64_t skipped = 0;
    for (size_t i = 0; i < free_count; i++)
        skipped += free_ranges[i].size;
    int context_count;
    struct context *contexts = kiwi_contexts_lock(&context_count);
    size_t known = 0; /* ranges of contexts the pager knows; the others cannot be moved */
    for (int i = 0; i < context_count; i++)
        known += kiwi_pager_move_context(&contexts[i], moving, live, free_ranges, free_count,
                                         &move);
    move.failures += (int)(live - known);
    for (int i = 0; i < context_count; i++) {
        if (contexts[i].stream && kiwi_pager_driver.ctx_set(contexts[i].ctx) == CUDA_SUCCESS)
            kiwi_pager_driver.stream_sync(contexts[i].stream);
    }
    if (!to_host)
        kiwi_copy_back_done();
    kiwi_contexts_unlock();
    free(pieces);
    kiwi_memory_paging_end(ranges);
    if (move.failures)
        kiwi_warn("%d prefetches %s failed; those pages move on demand instead", move.failures,
                  to_host ? "to host memory" : "to the GPU");
    moved->bytes = move.bytes;
    moved->skipped = skipped;
    moved->discarded = move.discarded;
    moved->seconds = kiwi_now() - started;
    kiwi_log("moved %llu bytes %s in %.6f s; %llu free in the framework's cache not moved "
             "(%llu discarded); %llu copied back", (unsigned long long)move.bytes,
             to_host ? "to host memory" : "to the GPU", moved->seconds,
             (unsigned long long)skipped, (unsigned long long)move.discarded,
             (unsigned long long)move.copied_back);
}

static void forget_context(CUcontext ctx)
{
    kiwi_copy_forget_context(ctx);
}

static void after_fork(void)
{
    kiwi_copy_after_fork();
}

/* The bytes the last way out moved to host memory, until the way in. */
static _Atomic uint64_t managed_host;

void kiwi_managed_page(enum kiwi_page_direction direction, struct kiwi_transfer *moved)
{
    kiwi_managed_move(direction, moved);
    atomic_store(&managed_host, direction == KIWI_PAGE_OUT ? moved->bytes : 0);
}

void kiwi_managed_residency(struct kiwi_residency *out)
{
    /* Managed memory moved out keeps its chunks on the card by the driver's count, but the
     * driver hands them to whoever allocates next: to the scheduler it is in host memory. A
     * checkpointed process's memory is the daemon's to tell: what was allocated. */
    struct kiwi_working_set ws;
    kiwi_memory_working_set(&ws);
    uint64_t host = atomic_load(&managed_host);
    out->host = host < ws.bytes ? host : ws.bytes;
    out->resident = ws.bytes - out->host;
}

CUresult kiwi_managed_allocate(CUdeviceptr *dptr, size_t size, unsigned int flags,
                               CUcontext ctx, CUdevice device)
{
    typedef CUresult (*alloc_managed_fn)(CUdeviceptr *, size_t, unsigned int);
    alloc_managed_fn real = (alloc_managed_fn)kiwi_real(HOOK_cuMemAllocManaged);
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!kiwi_memory_reserve(size, MANAGED, device))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult result = real(dptr, size, flags);
    if (kiwi_capture_error(result)) {
        /* The driver refuses managed memory while a graph is being captured. */
        kiwi_memory_unreserve(size, MANAGED);
        return kiwi_device_allocate_instead(dptr, size, ctx, device, result);
    }
    if (result != CUDA_SUCCESS) {
        kiwi_memory_unreserve(size, MANAGED);
        return result;
    }
    kiwi_memory_track(*dptr, size, MANAGED, ctx, device, false);
    kiwi_log("managed allocation of %zu bytes at 0x%llx", size, (unsigned long long)*dptr);
    return CUDA_SUCCESS;
}

static CUresult allocate(CUdeviceptr *dptr, size_t size, CUcontext ctx, CUdevice device,
                         const struct kiwi_stream_order *order)
{
    (void)order;
    return kiwi_managed_allocate(dptr, size, CU_MEM_ATTACH_GLOBAL, ctx, device);
}

/* A stream-ordered allocation from the device's managed pool (pools.c), where the driver has
 * managed pools, whichever pool the caller named (another pool's memory could not be paged
 * out): it stays stream-ordered, and so does its free. False when there is none. */
static bool allocate_pooled(CUdeviceptr *dptr, size_t size, CUstream stream, CUmemoryPool asked,
                            bool from_pool, CUresult *result)
{
    (void)asked;
    (void)from_pool;
    typedef CUresult (*alloc_pool_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    alloc_pool_fn real = (alloc_pool_fn)kiwi_real(HOOK_cuMemAllocFromPoolAsync);
    CUdevice device = -1;
    CUcontext ctx = kiwi_pager_note_context(&device);
    CUmemoryPool pool = real ? kiwi_pool_of(device) : NULL;
    if (!pool)
        return false;
    *result = CUDA_ERROR_OUT_OF_MEMORY;
    if (!kiwi_memory_reserve(size, MANAGED, device))
        return true;
    *result = real(dptr, size, pool, stream);
    if (*result != CUDA_SUCCESS) {
        kiwi_memory_unreserve(size, MANAGED);
        return true;
    }
    kiwi_memory_track(*dptr, size, MANAGED, ctx, device, true);
    return true;
}

const struct kiwi_evictor kiwi_managed_evictor = {
    .name = "managed",
    .allocate = allocate,
    .allocate_managed = kiwi_managed_allocate,
    .allocate_ordered = allocate_pooled,
    .move = kiwi_managed_page,
    .residency = kiwi_managed_residency,
    .forget_context = forget_context,
    .after_fork = after_fork,
    .pages_itself = true,
};
