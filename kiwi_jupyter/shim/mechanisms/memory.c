/* GPU memory: every allocation is counted, in one table.
 *
 * The table of allocations is the working set the shim reports to the daemon (so that the
 * daemon knows whether two holders fit side by side) and the list of ranges the pager moves.
 * The application's own VMM handles (cuMemCreate) cannot be moved: they are counted, and
 * reported as not evictable; so is memory the vmm evictor maps that had to be pinned in place.
 * The vmm evictor keeps no table of its own: its placement of an allocation hangs off the
 * allocation's record here (memory.h says how, and in which order the locks are taken).
 * Whenever the totals change the client hears of it as news (news.c), never by a call: it reads
 * the totals when it next wakes.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "memory.h"

#define BUCKETS 4096

pthread_mutex_t kiwi_table_lock = PTHREAD_MUTEX_INITIALIZER;
/* Frees hold it shared (kiwi_memory_free_begin), the pager exclusively while it moves the
 * working set: so no prefetch is ever issued for an address being freed, or freed and handed
 * out again. The table lock itself is not held while prefetching, so allocations and
 * statistics never wait for paging. Writers first, so a stream of frees cannot hold an
 * eviction off. */
static pthread_rwlock_t paging_lock = PTHREAD_RWLOCK_WRITER_NONRECURSIVE_INITIALIZER_NP;
static struct allocation *table[BUCKETS];
uint64_t kiwi_managed_bytes, kiwi_vmm_bytes, kiwi_mapped_bytes, kiwi_pinned_bytes;
static uint64_t allocation_count;
/* Moves whenever a record is added or removed: what was said of the table's addresses before
 * (the free ranges of free_ranges.c) holds only while it has not moved. */
static uint64_t generation;
/* Frees of managed memory made while their stream was captured into a graph (free.c), done at
 * the next release; under kiwi_table_lock. */
#define MAX_DEFERRED 1024
static CUdeviceptr deferred[MAX_DEFERRED];
static size_t deferred_count;

static size_t bucket(uint64_t key, enum allocation_kind kind)
{
    uint64_t h = (key ^ (uint64_t)kind) * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 52) % BUCKETS;
}

/* ---- table ---------------------------------------------------------------------------- */

/* A new record in the table; false when out of host memory. */
static bool record(uint64_t key, size_t size, enum allocation_kind kind, CUcontext ctx,
                   CUdevice device, bool pooled, struct vmm_allocation *placement)
{
    struct allocation *a = malloc(sizeof *a);
    if (!a)
        return false;
    *a = (struct allocation){.key = key, .size = size, .kind = kind, .ctx = ctx,
                             .device = device, .pooled = pooled, .placement = placement};
    pthread_mutex_lock(&kiwi_table_lock);
    size_t b = bucket(key, kind);
    a->next = table[b];
    table[b] = a;
    allocation_count++;
    generation++;
    pthread_mutex_unlock(&kiwi_table_lock);
    kiwi_news_post(KIWI_NEWS_WORKING_SET);
    return true;
}

void kiwi_memory_track(uint64_t key, size_t size, enum allocation_kind kind, CUcontext ctx,
                       CUdevice device, bool pooled)
{
    /* Without a record the allocation still works; it is only missing from the pager's list. */
    if (!record(key, size, kind, ctx, device, pooled, NULL))
        kiwi_warn("out of host memory tracking an allocation of %zu bytes", size);
}

bool kiwi_memory_track_placement(uint64_t key, size_t size, CUcontext ctx, CUdevice device,
                                 struct vmm_allocation *placement)
{
    /* Here the record is the only place the allocation is kept: without it, no allocation. */
    return record(key, size, MAPPED, ctx, device, false, placement);
}

/* Under kiwi_table_lock: the record of an allocation not already being freed, or NULL. */
static struct allocation *find(uint64_t key, enum allocation_kind kind)
{
    for (struct allocation *a = table[bucket(key, kind)]; a; a = a->next)
        if (a->key == key && a->kind == kind && !a->freeing)
            return a;
    return NULL;
}

/* Under kiwi_table_lock: removes this very record (not merely one with its key: once the driver
 * has freed an address, another thread may be handed it again and track it anew). */
static void remove_record(struct allocation *gone)
{
    for (struct allocation **p = &table[bucket(gone->key, gone->kind)]; *p; p = &(*p)->next) {
        if (*p != gone)
            continue;
        *p = gone->next;
        if (gone->kind != MAPPED) /* the vmm evictor counts its regions itself (memory.h) */
            *kiwi_bytes_of(gone->kind) -= gone->size;
        allocation_count--;
        generation++;
        free(gone);
        return;
    }
}

/* The first half of a free: marks the record of key (of the first of the kinds, in the enum's
 * order, that has one) as being freed and returns it, or NULL when the shim never saw the
 * allocation. */
struct allocation *kiwi_memory_begin_free(uint64_t key, unsigned kinds)
{
    pthread_mutex_lock(&kiwi_table_lock);
    struct allocation *a = NULL;
    for (enum allocation_kind kind = MANAGED; !a && kind <= MAPPED; kind++)
        if (kinds & KIND(kind))
            a = find(key, kind);
    if (a)
        a->freeing = true;
    pthread_mutex_unlock(&kiwi_table_lock);
    return a;
}

struct vmm_allocation *kiwi_memory_placement(uint64_t key)
{
    pthread_mutex_lock(&kiwi_table_lock);
    struct vmm_allocation *placement = NULL;
    for (struct allocation *a = table[bucket(key, MAPPED)]; a && !placement; a = a->next)
        if (a->key == key && a->kind == MAPPED)
            placement = a->placement;
    pthread_mutex_unlock(&kiwi_table_lock);
    return placement;
}

/* Under kiwi_table_lock: whether this very record is still in the table (the end of its
 * context forgets records being freed too). */
static bool listed(const struct allocation *record)
{
    for (const struct allocation *a = table[bucket(record->key, record->kind)]; a; a = a->next)
        if (a == record)
            return true;
    return false;
}

struct vmm_allocation *kiwi_memory_unplace(struct allocation *record)
{
    pthread_mutex_lock(&kiwi_table_lock);
    struct vmm_allocation *placement = listed(record) ? record->placement : NULL;
    if (placement)
        record->placement = NULL;
    pthread_mutex_unlock(&kiwi_table_lock);
    return placement;
}

bool kiwi_memory_replace(struct allocation *record, struct vmm_allocation *placement)
{
    pthread_mutex_lock(&kiwi_table_lock);
    bool kept = listed(record) && !record->placement;
    if (kept)
        record->placement = placement;
    pthread_mutex_unlock(&kiwi_table_lock);
    return kept;
}

void kiwi_memory_each_placement(void (*visit)(struct allocation *record, void *arg), void *arg)
{
    pthread_mutex_lock(&kiwi_table_lock);
    for (size_t b = 0; b < BUCKETS; b++)
        for (struct allocation *a = table[b]; a; a = a->next)
            if (a->kind == MAPPED && a->placement)
                visit(a, arg);
    pthread_mutex_unlock(&kiwi_table_lock);
}

void kiwi_memory_pinned(int64_t bytes)
{
    pthread_mutex_lock(&kiwi_table_lock);
    kiwi_pinned_bytes += (uint64_t)bytes;
    pthread_mutex_unlock(&kiwi_table_lock);
    kiwi_news_post(KIWI_NEWS_WORKING_SET);
}

/* The second half: forgets the record once the driver has freed it, keeps it otherwise. */
void kiwi_memory_end_free(struct allocation *a, CUresult result)
{
    if (!a)
        return;
    pthread_mutex_lock(&kiwi_table_lock);
    if (result == CUDA_SUCCESS)
        remove_record(a);
    else
        a->freeing = false;
    pthread_mutex_unlock(&kiwi_table_lock);
    if (result == CUDA_SUCCESS)
        kiwi_news_post(KIWI_NEWS_WORKING_SET);
}

bool kiwi_memory_defer_free(CUdeviceptr dptr)
{
    /* Still allocated, so still tracked, until the deferred free (for which it must be found
     * again: see kiwi_memory_free_deferred). */
    pthread_mutex_lock(&kiwi_table_lock);
    bool kept = deferred_count < MAX_DEFERRED;
    if (kept)
        deferred[deferred_count++] = dptr;
    pthread_mutex_unlock(&kiwi_table_lock);
    return kept;
}

void kiwi_memory_free_deferred(void)
{
    typedef CUresult (*free_fn)(CUdeviceptr);
    free_fn free_now = (free_fn)kiwi_real(HOOK_cuMemFree_v2);
    pthread_mutex_lock(&kiwi_table_lock);
    size_t count = deferred_count;
    CUdeviceptr pending[MAX_DEFERRED];
    memcpy(pending, deferred, count * sizeof pending[0]);
    deferred_count = 0;
    pthread_mutex_unlock(&kiwi_table_lock);
    pthread_rwlock_rdlock(&paging_lock);
    for (size_t i = 0; i < count && free_now; i++) {
        struct allocation *a = kiwi_memory_begin_free(pending[i], KIND(MANAGED));
        if (a) /* else its context went, and the address may belong to someone else now */
            kiwi_memory_end_free(a, free_now(pending[i]));
    }
    pthread_rwlock_unlock(&paging_lock);
}

void kiwi_memory_working_set(struct kiwi_working_set *out)
{
    pthread_mutex_lock(&kiwi_table_lock);
    out->bytes = kiwi_managed_bytes + kiwi_vmm_bytes + kiwi_mapped_bytes;
    out->evictable = kiwi_managed_bytes + kiwi_mapped_bytes - kiwi_pinned_bytes;
    out->allocations = allocation_count;
    pthread_mutex_unlock(&kiwi_table_lock);
}

static bool chosen(const struct allocation *a, enum kiwi_ranges which)
{
    bool managed = a->kind == MANAGED, mapped = a->kind == MAPPED && !a->pinned;
    return which == KIWI_RANGES_MANAGED  ? managed
           : which == KIWI_RANGES_MAPPED ? mapped
                                         : managed || mapped;
}

/* Under kiwi_table_lock: a copy of the allocations `which` names that are not being freed
 * (NULL when none, or out of host memory). */
static size_t copy_ranges(enum kiwi_ranges which, struct kiwi_range **ranges)
{
    size_t count = 0, capacity = allocation_count;
    struct kiwi_range *copy = capacity ? malloc(capacity * sizeof *copy) : NULL;
    for (size_t b = 0; copy && b < BUCKETS; b++)
        for (struct allocation *a = table[b]; a; a = a->next)
            if (chosen(a, which) && !a->freeing && count < capacity)
                copy[count++] = (struct kiwi_range){(CUdeviceptr)a->key, a->size, a->ctx,
                                                    a->device};
    if (capacity && !copy)
        kiwi_warn("out of host memory listing the working set; it moves on demand instead");
    *ranges = copy;
    return copy ? count : 0;
}

size_t kiwi_memory_paging_begin(enum kiwi_ranges which, struct kiwi_range **ranges)
{
    pthread_rwlock_wrlock(&paging_lock);
    pthread_mutex_lock(&kiwi_table_lock);
    size_t count = copy_ranges(which, ranges);
    pthread_mutex_unlock(&kiwi_table_lock);
    return count;
}

size_t kiwi_memory_ranges(enum kiwi_ranges which, struct kiwi_range **ranges,
                          uint64_t *table_generation)
{
    pthread_mutex_lock(&kiwi_table_lock);
    size_t count = copy_ranges(which, ranges);
    *table_generation = generation;
    pthread_mutex_unlock(&kiwi_table_lock);
    return count;
}

uint64_t kiwi_memory_generation(void)
{
    pthread_mutex_lock(&kiwi_table_lock);
    uint64_t now = generation;
    pthread_mutex_unlock(&kiwi_table_lock);
    return now;
}

void kiwi_memory_paging_end(struct kiwi_range *ranges)
{
    free(ranges);
    pthread_rwlock_unlock(&paging_lock);
}

void kiwi_memory_free_begin(void)
{
    pthread_rwlock_rdlock(&paging_lock);
}

void kiwi_memory_free_end(void)
{
    pthread_rwlock_unlock(&paging_lock);
}

uint64_t kiwi_memory_forget_context(CUcontext ctx)
{
    uint64_t bytes = 0;
    pthread_mutex_lock(&kiwi_table_lock);
    for (size_t b = 0; b < BUCKETS; b++) {
        struct allocation **p = &table[b];
        while (*p) {
            struct allocation *a = *p;
            if (a->ctx != ctx) {
                p = &a->next;
                continue;
            }
            bytes += a->size;
            remove_record(a); /* unlinks *p, so p now points at the next one */
        }
    }
    pthread_mutex_unlock(&kiwi_table_lock);
    if (bytes)
        kiwi_news_post(KIWI_NEWS_WORKING_SET);
    return bytes;
}

void kiwi_memory_after_fork(void)
{
    /* A forked child cannot use its parent's CUDA context, so it owns none of these. */
    pthread_mutex_init(&kiwi_table_lock, NULL);
    pthread_rwlock_t fresh = PTHREAD_RWLOCK_WRITER_NONRECURSIVE_INITIALIZER_NP;
    paging_lock = fresh;
    for (size_t b = 0; b < BUCKETS; b++) {
        while (table[b]) {
            struct allocation *a = table[b];
            table[b] = a->next;
            free(a);
        }
    }
    kiwi_managed_bytes = kiwi_vmm_bytes = kiwi_mapped_bytes = kiwi_pinned_bytes = 0;
    allocation_count = 0;
    generation++;
    deferred_count = 0; /* no free of its parent's is waiting for a release in it */
}
