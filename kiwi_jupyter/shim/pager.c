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

#include "shim.h"

#define MAX_CONTEXTS 16

struct context {
    CUcontext ctx;
    CUdevice device;
    CUstream stream; /* the pager's own, created on first use */
};

static pthread_mutex_t contexts_lock = PTHREAD_MUTEX_INITIALIZER;
static struct context contexts[MAX_CONTEXTS];
static int context_count;

typedef CUresult (*ctx_get_fn)(CUcontext *);
typedef CUresult (*ctx_set_fn)(CUcontext);
typedef CUresult (*ctx_device_fn)(CUdevice *);
typedef CUresult (*sync_fn)(void);
typedef CUresult (*stream_create_fn)(CUstream *, unsigned int);
typedef CUresult (*stream_sync_fn)(CUstream);
typedef CUresult (*prefetch_fn)(CUdeviceptr, size_t, CUdevice, CUstream);
/* CUDA 12.2 added cuMemPrefetchAsync_v2, which names the destination with a CUmemLocation;
 * CUDA 13 headers map cuMemPrefetchAsync to it. The driver exports both (the CUDA 13 runtime
 * still asks for v1 by version 8000); v1 is preferred. */
typedef CUresult (*prefetch_v2_fn)(CUdeviceptr, size_t, CUmemLocation, unsigned int, CUstream);
/* CUDA 13: many ranges in one call, one driver round trip for the whole working set. */
typedef CUresult (*prefetch_batch_fn)(CUdeviceptr *, size_t *, size_t, CUmemLocation *, size_t *,
                                      size_t, unsigned long long, CUstream);
/* CUDA 13: drops the pages of many ranges at once; their contents become undefined. */
typedef CUresult (*discard_batch_fn)(CUdeviceptr *, size_t *, size_t, unsigned long long, CUstream);

static struct {
    ctx_get_fn ctx_get;
    ctx_set_fn ctx_set;
    ctx_device_fn ctx_device;
    sync_fn ctx_sync;
    stream_create_fn stream_create;
    stream_sync_fn stream_sync;
    prefetch_fn prefetch;
    prefetch_v2_fn prefetch_v2;
    prefetch_batch_fn prefetch_batch;
    discard_batch_fn discard_batch;
} driver;
/* Set when the driver said it cannot batch (CUDA_ERROR_NOT_SUPPORTED): ask no more. */
static atomic_bool no_batches;
/* Likewise for discards (a GPU without concurrent managed access refuses them). */
static atomic_bool no_discards;

/* Resolved on first use, and again until the driver is loaded (a process may allocate
 * through a driver it has not opened yet from the shim's point of view). */
static bool resolve(void)
{
    static pthread_mutex_t resolve_lock = PTHREAD_MUTEX_INITIALIZER;
    static atomic_bool resolved;
    if (atomic_load(&resolved))
        return true;
    pthread_mutex_lock(&resolve_lock);
    if (!driver.ctx_get) {
        driver.ctx_device = (ctx_device_fn)kiwi_driver_sym("cuCtxGetDevice");
        driver.ctx_set = (ctx_set_fn)kiwi_driver_sym("cuCtxSetCurrent");
        driver.ctx_sync = (sync_fn)kiwi_driver_sym("cuCtxSynchronize");
        driver.stream_create = (stream_create_fn)kiwi_driver_sym("cuStreamCreate");
        driver.stream_sync = (stream_sync_fn)kiwi_driver_sym("cuStreamSynchronize");
        driver.prefetch = (prefetch_fn)kiwi_driver_sym("cuMemPrefetchAsync");
        driver.prefetch_v2 = (prefetch_v2_fn)kiwi_driver_sym("cuMemPrefetchAsync_v2");
        driver.prefetch_batch = (prefetch_batch_fn)kiwi_driver_sym("cuMemPrefetchBatchAsync");
        driver.discard_batch = (discard_batch_fn)kiwi_driver_sym("cuMemDiscardBatchAsync");
        driver.ctx_get = (ctx_get_fn)kiwi_driver_sym("cuCtxGetCurrent");
    }
    bool found = driver.ctx_get != NULL;
    atomic_store(&resolved, found);
    pthread_mutex_unlock(&resolve_lock);
    return found;
}

CUcontext kiwi_pager_note_context(CUdevice *device)
{
    if (!resolve())
        return NULL;
    CUcontext ctx = NULL;
    if (driver.ctx_get(&ctx) != CUDA_SUCCESS || !ctx)
        return NULL;
    CUdevice dev = -1;
    pthread_mutex_lock(&contexts_lock);
    int i = 0;
    while (i < context_count && contexts[i].ctx != ctx)
        i++;
    if (i < context_count) {
        dev = contexts[i].device;
    } else if (driver.ctx_device && driver.ctx_device(&dev) == CUDA_SUCCESS &&
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
    if (!resolve() || !driver.ctx_set || !driver.ctx_sync)
        return true; /* no driver: nothing was queued */
    bool synchronized = true;
    pthread_mutex_lock(&contexts_lock);
    for (int i = 0; i < context_count; i++) {
        CUresult result = driver.ctx_set(contexts[i].ctx);
        if (result == CUDA_SUCCESS)
            result = driver.ctx_sync();
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

struct move {
    bool to_host;
    uint64_t bytes;
    uint64_t discarded;
    int failures;
};

static CUmemLocation location_of(CUdevice device)
{
    bool host = device == CU_DEVICE_CPU;
    CUmemLocation where = {.type = host ? CU_MEM_LOCATION_TYPE_HOST : CU_MEM_LOCATION_TYPE_DEVICE,
                           .id = host ? 0 : device};
    return where;
}

static CUresult prefetch(CUdeviceptr ptr, size_t size, CUdevice device, CUstream stream)
{
    if (driver.prefetch)
        return driver.prefetch(ptr, size, device, stream);
    if (driver.prefetch_v2)
        return driver.prefetch_v2(ptr, size, location_of(device), 0, stream);
    return CUDA_ERROR_NOT_FOUND;
}

/* A context's ranges as the batch calls take them: two arrays, and their bytes. */
struct batch {
    CUdeviceptr *ptrs;
    size_t *sizes;
    size_t count; /* 0 when out of host memory */
    uint64_t bytes;
};

static struct batch batch_of(const struct kiwi_range *ranges, size_t count, CUcontext ctx)
{
    struct batch b = {.ptrs = malloc(count * sizeof *b.ptrs),
                      .sizes = malloc(count * sizeof *b.sizes)};
    for (size_t i = 0; b.ptrs && b.sizes && i < count; i++) {
        if (ranges[i].ctx == ctx) {
            b.ptrs[b.count] = ranges[i].ptr;
            b.sizes[b.count++] = ranges[i].size;
            b.bytes += ranges[i].size;
        }
    }
    return b;
}

static void batch_free(struct batch *b)
{
    free(b->ptrs);
    free(b->sizes);
}

/* One cuMemPrefetchBatchAsync for all of a context's ranges; false when the driver cannot. */
static bool prefetch_batch(const struct kiwi_range *ranges, size_t count, CUcontext ctx,
                           CUdevice to, CUstream stream, struct move *move)
{
    if (!driver.prefetch_batch || atomic_load(&no_batches) || count < 2)
        return false;
    struct batch b = batch_of(ranges, count, ctx);
    CUmemLocation where = location_of(to);
    size_t first = 0; /* the one location applies from the first range on */
    CUresult result = b.count ? driver.prefetch_batch(b.ptrs, b.sizes, b.count, &where, &first,
                                                      1, 0, stream)
                              : CUDA_ERROR_OUT_OF_MEMORY;
    batch_free(&b);
    if (result == CUDA_ERROR_NOT_SUPPORTED)
        atomic_store(&no_batches, true);
    if (result != CUDA_SUCCESS)
        return false;
    move->bytes += b.bytes;
    return true;
}

/* Discards a context's free ranges in one call, on the stream the prefetches use (so the two
 * never run at once on one page: they are disjoint, and in stream order anyway). */
static void discard(const struct kiwi_range *free_ranges, size_t count, CUcontext ctx,
                    CUstream stream, struct move *move)
{
    if (!driver.discard_batch || atomic_load(&no_discards) || !count)
        return;
    struct batch b = batch_of(free_ranges, count, ctx);
    CUresult result =
        b.count ? driver.discard_batch(b.ptrs, b.sizes, b.count, 0, stream) : CUDA_SUCCESS;
    batch_free(&b);
    if (result == CUDA_ERROR_NOT_SUPPORTED) {
        atomic_store(&no_discards, true);
        kiwi_log("the driver cannot discard; free ranges are left out of evictions instead");
    }
    if (result == CUDA_SUCCESS)
        move->discarded += b.bytes;
}

/* Moves the live ranges of one context: in one batch where the driver can, else one by one;
 * on the way out, discards its free ranges first. Returns how many live ranges are its. */
static size_t move_context(struct context *c, const struct kiwi_range *ranges, size_t count,
                           const struct kiwi_range *free_ranges, size_t free_count,
                           struct move *move)
{
    size_t mine = 0, mine_free = 0;
    for (size_t i = 0; i < count; i++)
        mine += ranges[i].ctx == c->ctx;
    for (size_t i = 0; move->to_host && i < free_count; i++)
        mine_free += free_ranges[i].ctx == c->ctx;
    if (!mine && !mine_free)
        return 0;
    if (driver.ctx_set(c->ctx) != CUDA_SUCCESS ||
        (!c->stream && driver.stream_create(&c->stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)) {
        c->stream = NULL;
        move->failures += (int)mine;
        return mine;
    }
    if (mine_free)
        discard(free_ranges, free_count, c->ctx, c->stream, move);
    if (!mine)
        return 0;
    CUdevice to = move->to_host ? CU_DEVICE_CPU : c->device;
    if (prefetch_batch(ranges, count, c->ctx, to, c->stream, move))
        return mine;
    for (size_t i = 0; i < count; i++) {
        if (ranges[i].ctx != c->ctx)
            continue;
        if (prefetch(ranges[i].ptr, ranges[i].size, to, c->stream) == CUDA_SUCCESS)
            move->bytes += ranges[i].size;
        else
            move->failures++;
    }
    return mine;
}

static void move_working_set(bool to_host, struct kiwi_transfer *moved)
{
    *moved = (struct kiwi_transfer){0};
    if (!resolve() || !driver.ctx_set || !driver.stream_create || !driver.stream_sync)
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
        known += move_context(&contexts[i], moving, live, free_ranges, free_count, &move);
    move.failures += (int)(live - known);
    for (int i = 0; i < context_count; i++) {
        if (contexts[i].stream && driver.ctx_set(contexts[i].ctx) == CUDA_SUCCESS)
            driver.stream_sync(contexts[i].stream);
    }
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
             "(%llu discarded)", (unsigned long long)move.bytes,
             to_host ? "to host memory" : "to the GPU", moved->seconds,
             (unsigned long long)skipped, (unsigned long long)move.discarded);
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
    pthread_mutex_unlock(&contexts_lock);
}

void kiwi_pager_after_fork(void)
{
    pthread_mutex_init(&contexts_lock, NULL);
    memset(contexts, 0, sizeof contexts);
    context_count = 0;
}
