/* The managed evictor's move: the working set, as managed memory, to host memory and back.
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

void kiwi_managed_forget_context(CUcontext ctx)
{
    kiwi_copy_forget_context(ctx);
}

void kiwi_managed_after_fork(void)
{
    kiwi_copy_after_fork();
}
