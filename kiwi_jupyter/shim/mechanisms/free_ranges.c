/* Free ranges: what the framework's cache holds free, as the kernel says, so that an eviction
 * need not copy it.
 *
 * PyTorch's caching allocator (and CuPy's pool) keep freed blocks inside the big segments they
 * allocated; to the shim a segment is one managed allocation (or one the vmm evictor maps),
 * live from end to end. At a cell's end the kernel reads the free blocks from the framework and
 * hands them over here; the pager then discards them (cuMemDiscardBatchAsync; under vmm they
 * are released with their chunk, never copied) instead of copying them to host memory, and
 * skips them when it restores.
 *
 * A discard destroys contents, so a hint is believed only while nothing can have put live data
 * in it since the framework was read:
 *   - kiwi_free_ranges_begin comes before the kernel reads the framework, and marks the gate.
 *     Live data gets into a free block only by GPU work (a launch, copy or memset), which
 *     passes the gate: if any call has left the gate since the mark, the hints are not used.
 *     From the release's drain until the next grant the gate is closed, so a hint that holds
 *     at the eviction still holds at the restore.
 *   - a hint counts only when it lies wholly inside one evictable allocation the shim tracks,
 *     and only while the table of allocations has not changed (an address freed and handed
 *     out again must never be discarded on the word of an old hint);
 *   - each range is shrunk to whole 2 MiB blocks, the largest page the driver migrates, so no
 *     discarded page can also hold a live neighbour;
 *   - every grant forgets them.
 * Skipping a prefetch never loses data (the pages move on demand); only the discard needs all
 * of this.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "pager.h"

#define BLOCK ((CUdeviceptr)2 << 20)
#define MAX_RANGES 65536

struct span {
    CUdeviceptr ptr;
    size_t size;
};

static pthread_mutex_t ranges_lock = PTHREAD_MUTEX_INITIALIZER;
static struct span *spans; /* sorted by address, disjoint */
static size_t span_count;
static uint64_t span_bytes;
static bool begun;               /* kiwi_free_ranges_begin since the last grant */
static uint64_t table_generation; /* the table as it was at begin */

/* Under ranges_lock. */
static void forget(void)
{
    free(spans);
    spans = NULL;
    span_count = 0;
    span_bytes = 0;
}

void kiwi_free_ranges_begin(void)
{
    pthread_mutex_lock(&ranges_lock);
    forget();
    kiwi_gate_mark();
    table_generation = kiwi_memory_generation();
    begun = true;
    pthread_mutex_unlock(&ranges_lock);
}

static int by_address(const void *a, const void *b)
{
    CUdeviceptr x = ((const struct kiwi_range *)a)->ptr, y = ((const struct kiwi_range *)b)->ptr;
    return x < y ? -1 : x > y;
}

static int span_by_address(const void *a, const void *b)
{
    CUdeviceptr x = ((const struct span *)a)->ptr, y = ((const struct span *)b)->ptr;
    return x < y ? -1 : x > y;
}

size_t kiwi_ranges_after(const struct kiwi_range *ranges, size_t count, CUdeviceptr ptr)
{
    size_t low = 0, high = count;
    while (low < high) {
        size_t mid = low + (high - low) / 2;
        if (ranges[mid].ptr <= ptr)
            low = mid + 1;
        else
            high = mid;
    }
    return low;
}

/* The allocation holding [ptr, ptr + size) wholly, in allocations sorted by address; NULL when
 * none does. */
static const struct kiwi_range *holder(const struct kiwi_range *allocations, size_t count,
                                       CUdeviceptr ptr, size_t size)
{
    size_t low = kiwi_ranges_after(allocations, count, ptr);
    if (!low)
        return NULL;
    const struct kiwi_range *a = &allocations[low - 1];
    uint64_t offset = ptr - a->ptr;
    return offset <= a->size && size <= a->size - offset ? a : NULL;
}

long long kiwi_free_ranges_set(const unsigned long long *ptrs, const unsigned long long *sizes,
                               size_t count)
{
    if (count && (!ptrs || !sizes))
        return -1;
    pthread_mutex_lock(&ranges_lock);
    if (!begun) {
        pthread_mutex_unlock(&ranges_lock);
        return -1;
    }
    forget();
    struct kiwi_range *allocations = NULL;
    uint64_t now = 0;
    size_t allocated = kiwi_memory_ranges(KIWI_RANGES_EVICTABLE, &allocations, &now);
    if (count > MAX_RANGES)
        count = MAX_RANGES; /* a bound on host memory; the rest are copied as before */
    struct span *kept = now == table_generation && count ? malloc(count * sizeof *kept) : NULL;
    size_t n = 0;
    if (allocated)
        qsort(allocations, allocated, sizeof *allocations, by_address);
    for (size_t i = 0; kept && i < count; i++) {
        if (!holder(allocations, allocated, ptrs[i], sizes[i]))
            continue; /* not wholly inside one evictable allocation: not ours to discard */
        CUdeviceptr start = (ptrs[i] + BLOCK - 1) & ~(BLOCK - 1);
        CUdeviceptr end = (ptrs[i] + sizes[i]) & ~(BLOCK - 1);
        if (end > start)
            kept[n++] = (struct span){start, end - start};
    }
    free(allocations);
    if (n)
        qsort(kept, n, sizeof *kept, span_by_address);
    size_t merged = 0; /* overlapping hints become one */
    for (size_t i = 0; i < n; i++) {
        CUdeviceptr end = kept[i].ptr + kept[i].size;
        if (merged && kept[i].ptr <= kept[merged - 1].ptr + kept[merged - 1].size) {
            struct span *last = &kept[merged - 1];
            if (end > last->ptr + last->size)
                last->size = end - last->ptr;
        } else {
            kept[merged++] = kept[i];
        }
    }
    spans = kept;
    span_count = merged;
    for (size_t i = 0; i < merged; i++)
        span_bytes += kept[i].size;
    long long accepted = (long long)span_bytes;
    pthread_mutex_unlock(&ranges_lock);
    kiwi_log("%zu free range(s) of the framework's cache: %lld bytes", merged, accepted);
    return accepted;
}

/* Under ranges_lock: do the hints still hold? */
static bool holding_true(void)
{
    return span_count && !kiwi_gate_used_since_mark() &&
           kiwi_memory_generation() == table_generation;
}

uint64_t kiwi_free_ranges_bytes(void)
{
    pthread_mutex_lock(&ranges_lock);
    uint64_t bytes = holding_true() ? span_bytes : 0;
    pthread_mutex_unlock(&ranges_lock);
    return bytes;
}

size_t kiwi_free_ranges_split(const struct kiwi_range *ranges, size_t count,
                              struct kiwi_range **pieces, size_t *live)
{
    *pieces = NULL;
    *live = count;
    pthread_mutex_lock(&ranges_lock);
    if (!holding_true()) {
        pthread_mutex_unlock(&ranges_lock);
        return 0;
    }
    /* Live pieces from the front, free ones from the back: each span makes at most two pieces
     * (the live gap before it, itself) and each range one more, so they never meet. */
    size_t capacity = count + 2 * span_count, live_count = 0, free_start = capacity;
    struct kiwi_range *out = malloc(capacity * sizeof *out);
    for (size_t r = 0; out && r < count; r++) {
        CUdeviceptr cursor = ranges[r].ptr, end = ranges[r].ptr + ranges[r].size;
        size_t low = 0, high = span_count; /* the first span at or after the range's start */
        while (low < high) {
            size_t mid = low + (high - low) / 2;
            if (spans[mid].ptr < cursor)
                low = mid + 1;
            else
                high = mid;
        }
        for (size_t s = low; s < span_count && spans[s].ptr < end; s++) {
            CUdeviceptr span_end = spans[s].ptr + spans[s].size;
            if (span_end > end)
                span_end = end; /* cannot happen while the table is unchanged; never trusted */
            struct kiwi_range piece = ranges[r];
            if (spans[s].ptr > cursor) {
                piece.ptr = cursor;
                piece.size = spans[s].ptr - cursor;
                out[live_count++] = piece;
            }
            piece.ptr = spans[s].ptr;
            piece.size = span_end - spans[s].ptr;
            out[--free_start] = piece;
            cursor = span_end;
        }
        if (cursor < end) {
            struct kiwi_range piece = ranges[r];
            piece.ptr = cursor;
            piece.size = end - cursor;
            out[live_count++] = piece;
        }
    }
    pthread_mutex_unlock(&ranges_lock);
    if (!out)
        return 0;
    /* The free pieces back in their order, right after the live ones. */
    size_t free_count = capacity - free_start;
    for (size_t i = 0; i < free_count / 2; i++) {
        struct kiwi_range swap = out[free_start + i];
        out[free_start + i] = out[capacity - 1 - i];
        out[capacity - 1 - i] = swap;
    }
    memmove(out + live_count, out + free_start, free_count * sizeof *out);
    *pieces = out;
    *live = live_count;
    return live_count + free_count;
}

void kiwi_free_ranges_forget(void)
{
    pthread_mutex_lock(&ranges_lock);
    forget();
    begun = false;
    pthread_mutex_unlock(&ranges_lock);
}

void kiwi_free_ranges_after_fork(void)
{
    pthread_mutex_init(&ranges_lock, NULL);
    spans = NULL; /* the parent's copy: leaked in the child, which owns nothing of it */
    span_count = 0;
    span_bytes = 0;
    begun = false;
}
