/* One context's share of moving the working set (managed.c decides when, and for which
 * contexts): its live ranges prefetched, in one cuMemPrefetchBatchAsync where the driver has it
 * and else one by one, with cuMemPrefetchAsync or its _v2; on the way out, its free ranges
 * discarded first. With KIWI_EVICT_COPY the live ranges go out by copy and discard instead
 * (copy_out.c), and come back by the same prefetch followed by the copies back. Each driver
 * variant the shim cannot use is asked once, then left alone.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdlib.h>

#include "pager.h"

/* Set when the driver said it cannot batch (CUDA_ERROR_NOT_SUPPORTED): ask no more. */
static atomic_bool no_batches;
/* Likewise for discards (a GPU without concurrent managed access refuses them). */
static atomic_bool no_discards;

static CUmemLocation location_of(CUdevice device)
{
    bool host = device == CU_DEVICE_CPU;
    CUmemLocation where = {.type = host ? CU_MEM_LOCATION_TYPE_HOST : CU_MEM_LOCATION_TYPE_DEVICE,
                           .id = host ? 0 : device};
    return where;
}

static CUresult prefetch(CUdeviceptr ptr, size_t size, CUdevice device, CUstream stream)
{
    if (kiwi_pager_driver.prefetch)
        return kiwi_pager_driver.prefetch(ptr, size, device, stream);
    if (kiwi_pager_driver.prefetch_v2)
        return kiwi_pager_driver.prefetch_v2(ptr, size, location_of(device), 0, stream);
    return CUDA_ERROR_NOT_FOUND;
}

/* A context's ranges as the batch calls take them: two arrays, and their bytes. */
struct batch {
    CUdeviceptr *ptrs;
    size_t *sizes;
    size_t count; /* 0 when out of host memory */
    uint64_t bytes;
};

/* ctx's ranges; with `only`, just those i where only[i]. */
static struct batch batch_of(const struct kiwi_range *ranges, size_t count, CUcontext ctx,
                             const bool *only)
{
    struct batch b = {.ptrs = malloc(count * sizeof *b.ptrs),
                      .sizes = malloc(count * sizeof *b.sizes)};
    for (size_t i = 0; b.ptrs && b.sizes && i < count; i++) {
        if (ranges[i].ctx == ctx && (!only || only[i])) {
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

/* Can the driver discard? False once it said it cannot (a GPU without concurrent managed
 * access). */
static bool discards(void)
{
    return kiwi_pager_driver.discard_batch && !atomic_load(&no_discards);
}

/* Each of ctx's ranges prefetched on its own call; with `skip`, not those i where skip[i]. */
static void prefetch_each(const struct kiwi_range *ranges, size_t count, CUcontext ctx,
                          CUdevice to, CUstream stream, const bool *skip, struct move *move)
{
    for (size_t i = 0; i < count; i++) {
        if (ranges[i].ctx != ctx || (skip && skip[i]))
            continue;
        if (prefetch(ranges[i].ptr, ranges[i].size, to, stream) == CUDA_SUCCESS)
            move->bytes += ranges[i].size;
        else
            move->failures++;
    }
}

/* One cuMemPrefetchBatchAsync for all of a context's ranges; false when the driver cannot. */
static bool prefetch_batch(const struct kiwi_range *ranges, size_t count, CUcontext ctx,
                           CUdevice to, CUstream stream, struct move *move)
{
    if (!kiwi_pager_driver.prefetch_batch || atomic_load(&no_batches) || count < 2)
        return false;
    struct batch b = batch_of(ranges, count, ctx, NULL);
    CUmemLocation where = location_of(to);
    size_t first = 0; /* the one location applies from the first range on */
    CUresult result = b.count ? kiwi_pager_driver.prefetch_batch(b.ptrs, b.sizes, b.count, &where,
                                                                 &first, 1, 0, stream)
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
    if (!kiwi_pager_driver.discard_batch || atomic_load(&no_discards) || !count)
        return;
    struct batch b = batch_of(free_ranges, count, ctx, NULL);
    CUresult result = b.count ? kiwi_pager_driver.discard_batch(b.ptrs, b.sizes, b.count, 0, stream)
                              : CUDA_SUCCESS;
    batch_free(&b);
    if (result == CUDA_ERROR_NOT_SUPPORTED) {
        atomic_store(&no_discards, true);
        kiwi_log("the driver cannot discard; free ranges are left out of evictions instead");
    }
    if (result == CUDA_SUCCESS)
        move->discarded += b.bytes;
}

/* KIWI_EVICT_COPY's way out: c's live ranges copied to host buffers, then discarded, all on
 * c's stream (so no discard runs before its copy has read the bytes). A range that could not
 * be copied is prefetched instead. False when nothing was discarded: the caller prefetches. */
static bool copy_out_then_discard(struct context *c, const struct kiwi_range *ranges,
                                  size_t count, struct move *move)
{
    bool *copied = calloc(count, sizeof *copied);
    uint64_t before = move->bytes;
    size_t n = copied ? kiwi_copy_out(c, ranges, count, copied, move) : 0;
    struct batch b = {0};
    if (n)
        b = batch_of(ranges, count, c->ctx, copied);
    CUresult result = b.count ? kiwi_pager_driver.discard_batch(b.ptrs, b.sizes, b.count, 0,
                                                                c->stream)
                              : CUDA_ERROR_OUT_OF_MEMORY;
    batch_free(&b);
    if (n && result != CUDA_SUCCESS) {
        if (result == CUDA_ERROR_NOT_SUPPORTED)
            atomic_store(&no_discards, true);
        kiwi_warn("discarding after the copy out failed (CUDA error %d); prefetching instead",
                  result);
        kiwi_pager_driver.stream_sync(c->stream); /* the copies still read their buffers */
        kiwi_copy_out_undo(c->ctx);
        move->bytes = before;
    }
    bool discarded = n && result == CUDA_SUCCESS;
    if (discarded) /* the ranges that could not be copied */
        prefetch_each(ranges, count, c->ctx, CU_DEVICE_CPU, c->stream, copied, move);
    free(copied);
    return discarded;
}

size_t kiwi_pager_move_context(struct context *c, const struct kiwi_range *ranges, size_t count,
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
    if (kiwi_pager_driver.ctx_set(c->ctx) != CUDA_SUCCESS ||
        (!c->stream &&
         kiwi_pager_driver.stream_create(&c->stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)) {
        c->stream = NULL;
        move->failures += (int)mine;
        return mine;
    }
    if (mine_free)
        discard(free_ranges, free_count, c->ctx, c->stream, move);
    if (!mine)
        return 0;
    if (move->to_host && discards() && kiwi_copy_out_usable() &&
        copy_out_then_discard(c, ranges, count, move))
        return mine;
    CUdevice to = move->to_host ? CU_DEVICE_CPU : c->device;
    if (!prefetch_batch(ranges, count, c->ctx, to, c->stream, move))
        prefetch_each(ranges, count, c->ctx, to, c->stream, NULL, move);
    /* Discarded ranges came back as fresh pages: their bytes follow, in stream order. */
    if (!move->to_host)
        kiwi_copy_back(c, ranges, count, move);
    return mine;
}
