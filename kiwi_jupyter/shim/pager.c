/* Paging: giving the GPU's memory back, and taking it again.
 *
 * nvshare leaves this to page faults: the next holder faults its pages in one by one and the
 * driver evicts the previous holder's pages to make room, at a fraction of the link's speed.
 * The shim moves the whole working set with cuMemPrefetchAsync instead: out to host memory
 * before it releases the GPU (only when the daemon says the next holder needs the room), and
 * back to the GPU when a grant arrives, before any work resumes. Prefetches run on streams of
 * the pager's own, one per context, so they never wait behind (or hold up) the process's
 * streams, and they are bulk copies at link speed.
 *
 * Blocks the framework's cache holds free (free_ranges.c) are not moved either way: an eviction
 * discards them where the driver can (CUDA 13's cuMemDiscardBatchAsync: their pages are dropped,
 * nothing is copied, and the next holder gets the room at once) and else just leaves them out of
 * the prefetch, so the driver moves them only if the next holder's pages need their room; a
 * restore leaves them to be faulted in when the framework hands them out again.
 *
 * All of this runs on the comm thread, which is not a thread CUDA knows: it makes each
 * context current itself before it synchronizes or prefetches in it.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "pager.h"

#define MAX_CONTEXTS 16

static pthread_mutex_t contexts_lock = PTHREAD_MUTEX_INITIALIZER;
static struct context contexts[MAX_CONTEXTS];
static int context_count;

struct pager_driver kiwi_pager_driver;

/* Resolved on first use, and again until the driver is loaded (a process may allocate
 * through a driver it has not opened yet from the shim's point of view). */
static bool resolve(void)
{
    static pthread_mutex_t resolve_lock = PTHREAD_MUTEX_INITIALIZER;
    static atomic_bool resolved;
    if (atomic_load(&resolved))
        return true;
    pthread_mutex_lock(&resolve_lock);
    if (!kiwi_pager_driver.ctx_get) {
        kiwi_pager_driver.ctx_device = (ctx_device_fn)kiwi_driver_sym("cuCtxGetDevice");
        kiwi_pager_driver.ctx_set = (ctx_set_fn)kiwi_driver_sym("cuCtxSetCurrent");
        kiwi_pager_driver.ctx_sync = (sync_fn)kiwi_driver_sym("cuCtxSynchronize");
        kiwi_pager_driver.stream_create = (stream_create_fn)kiwi_driver_sym("cuStreamCreate");
        kiwi_pager_driver.stream_sync = (stream_sync_fn)kiwi_driver_sym("cuStreamSynchronize");
        kiwi_pager_driver.prefetch = (prefetch_fn)kiwi_driver_sym("cuMemPrefetchAsync");
        kiwi_pager_driver.prefetch_v2 = (prefetch_v2_fn)kiwi_driver_sym("cuMemPrefetchAsync_v2");
        kiwi_pager_driver.prefetch_batch =
            (prefetch_batch_fn)kiwi_driver_sym("cuMemPrefetchBatchAsync");
        kiwi_pager_driver.discard_batch =
            (discard_batch_fn)kiwi_driver_sym("cuMemDiscardBatchAsync");
        kiwi_pager_driver.copy_to_host =
            (copy_to_host_fn)kiwi_driver_sym("cuMemcpyDtoHAsync_v2");
        kiwi_pager_driver.copy_to_device =
            (copy_to_device_fn)kiwi_driver_sym("cuMemcpyHtoDAsync_v2");
        kiwi_pager_driver.host_alloc = (host_alloc_fn)kiwi_driver_sym("cuMemAllocHost_v2");
        kiwi_pager_driver.host_free = (host_free_fn)kiwi_driver_sym("cuMemFreeHost");
        kiwi_pager_driver.ctx_get = (ctx_get_fn)kiwi_driver_sym("cuCtxGetCurrent");
    }
    bool found = kiwi_pager_driver.ctx_get != NULL;
    atomic_store(&resolved, found);
    pthread_mutex_unlock(&resolve_lock);
    return found;
}

CUcontext kiwi_pager_note_context(CUdevice *device)
{
    if (!resolve())
        return NULL;
    CUcontext ctx = NULL;
    if (kiwi_pager_driver.ctx_get(&ctx) != CUDA_SUCCESS || !ctx)
        return NULL;
    CUdevice dev = -1;
    pthread_mutex_lock(&contexts_lock);
    int i = 0;
    while (i < context_count && contexts[i].ctx != ctx)
        i++;
    if (i < context_count) {
        dev = contexts[i].device;
    } else if (kiwi_pager_driver.ctx_device &&
               kiwi_pager_driver.ctx_device(&dev) == CUDA_SUCCESS &&
               context_count < MAX_CONTEXTS) {
        contexts[context_count++] = (struct context){.ctx = ctx, .device = dev};
    }
    pthread_mutex_unlock(&contexts_lock);
    if (device)
        *device = dev;
    return ctx;
}

bool kiwi_pager_synchronize(void)
{
    if (!resolve() || !kiwi_pager_driver.ctx_set || !kiwi_pager_driver.ctx_sync)
        return true; /* no driver: nothing was queued */
    bool synchronized = true;
    pthread_mutex_lock(&contexts_lock);
    for (int i = 0; i < context_count; i++) {
        CUresult result = kiwi_pager_driver.ctx_set(contexts[i].ctx);
        if (result == CUDA_SUCCESS)
            result = kiwi_pager_driver.ctx_sync();
        if (result == CUDA_ERROR_INVALID_CONTEXT || result == CUDA_ERROR_CONTEXT_IS_DESTROYED) {
            /* Ended by a path the shim does not see: no work of it can still run. */
            kiwi_log("context %p is gone; forgetting it", (void *)contexts[i].ctx);
            contexts[i--] = contexts[--context_count];
        } else if (result != CUDA_SUCCESS) {
            kiwi_warn("synchronizing before release failed: CUDA error %d", result);
            synchronized = false;
        }
    }
    pthread_mutex_unlock(&contexts_lock);
    return synchronized;
}

static void move_working_set(bool to_host, struct kiwi_transfer *moved)
{
    *moved = (struct kiwi_transfer){0};
    if (!resolve() || !kiwi_pager_driver.ctx_set || !kiwi_pager_driver.stream_create ||
        !kiwi_pager_driver.stream_sync)
        return;
    double started = kiwi_now();
    struct move move = {.to_host = to_host};
    /* A copy of the list, so that allocating threads never wait for the transfer; frees do
     * wait (kiwi_memory_paging_begin), so that no address in the copy is freed meanwhile. */
    struct kiwi_range *ranges;
    size_t count = kiwi_memory_paging_begin(&ranges);
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
    pthread_mutex_lock(&contexts_lock);
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
    pthread_mutex_unlock(&contexts_lock);
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

void kiwi_pager_evict(struct kiwi_transfer *moved)
{
    move_working_set(true, moved);
}

void kiwi_pager_restore(struct kiwi_transfer *moved)
{
    move_working_set(false, moved);
}

void kiwi_pager_forget_context(CUcontext ctx)
{
    pthread_mutex_lock(&contexts_lock);
    for (int i = 0; i < context_count; i++) {
        if (contexts[i].ctx == ctx) {
            /* Its stream went with it. Order does not matter: move the last one here. */
            contexts[i] = contexts[--context_count];
            break;
        }
    }
    kiwi_copy_forget_context(ctx);
    pthread_mutex_unlock(&contexts_lock);
}

void kiwi_pager_after_fork(void)
{
    pthread_mutex_init(&contexts_lock, NULL);
    memset(contexts, 0, sizeof contexts);
    context_count = 0;
    kiwi_copy_after_fork();
}
