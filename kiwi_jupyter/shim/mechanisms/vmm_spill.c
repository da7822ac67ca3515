/* The vmm evictor's disk tier: what an eviction left in host shadows goes to spill files
 * (spill.h) and comes back, so that a long-idle kernel holds no host memory (issue 42).
 *
 * Out (the daemon's `spill`, to a kernel whose memory is in host memory): the chunks away from
 * the card with a shadow, in the order they were made, in batches of up to BATCH bytes, each
 * batch one spill file: the live pieces of its chunks written end to end, synced, and only then
 * every shadow of the batch freed (a pinned one unpinned: cuMemHostUnregister or cuMemFreeHost).
 * A failure (a full or failing disk, a directory that is unsafe) stops there: the batch's
 * shadows are untouched and its file is dropped, the batches before it stay on disk; nothing
 * is lost either way. Each batch done is reported (host down, disk up).
 *
 * Back to host memory (the daemon's `fetch` with tier host; or a restore without the staging
 * ring): each chunk on disk gets a pageable shadow (pinning is slow, and the staging ring copies
 * from pageable ones at the link's speed: vmm_staging.c), and its file's blocks are read back
 * and checked. A chunk whose file could not be read stays on disk, its new shadow freed. A chunk
 * on disk has no shadow, and the builder makes it none (vmm_builder.c): it is to hold no host
 * memory.
 *
 * Straight to the card (a restore, with the ring: kiwi_vmm_unspill_to_card): a file's blocks
 * are read into the ring's cells, several at once, and each block's bytes are copied on to the
 * addresses of the pieces it holds as soon as it is in, the chunks mapped as the stream reaches
 * them; no shadow is made, so the host memory a restore takes is the ring's. The chunks keep
 * their file until the whole restore has ended well: one that fails is rolled back and its
 * memory is still on disk.
 *
 * Both hold kiwi_vmm_lock throughout, as a move does, and say so (kiwi_vmm_moving): the
 * builder pins nothing meanwhile, and readers of the figures take the last counted ones.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vmm.h"

/* A spill's progress is reported, and its shadows freed, every this many bytes. */
#define BATCH ((uint64_t)1 << 30)

/* Why the last tier move failed, for moved->failed (one move at a time: the client's). */
static char failure[512];

struct batch {
    struct vmm_chunk **chunks;
    struct kiwi_spill_segment *segments;
    size_t chunk_count, segment_count, capacity;
    uint64_t bytes;
};

static bool batch_add_segment(struct batch *b, void *host, uint64_t size)
{
    if (b->segment_count == b->capacity) {
        size_t more = b->capacity ? b->capacity * 2 : 64;
        struct kiwi_spill_segment *grown = realloc(b->segments, more * sizeof *grown);
        struct vmm_chunk **chunks = grown ? realloc(b->chunks, more * sizeof *chunks) : NULL;
        if (grown)
            b->segments = grown;
        if (!chunks)
            return false;
        b->chunks = chunks;
        b->capacity = more;
    }
    b->segments[b->segment_count++] = (struct kiwi_spill_segment){host, b->bytes, size};
    b->bytes += size;
    return true;
}

/* A chunk's pieces, from its shadow (host) or into it; false: out of host memory. */
static bool batch_add(struct batch *b, struct vmm_chunk *c)
{
    uint64_t start = b->bytes;
    for (size_t p = 0; p < c->piece_count; p++)
        if (!batch_add_segment(b, (unsigned char *)c->shadow.host + c->pieces[p].offset,
                               c->pieces[p].size))
            return false;
    c->spill_offset = start;
    b->chunks[b->chunk_count++] = c; /* chunk_count <= segment_count: room is there */
    return true;
}

static void batch_clear(struct batch *b)
{
    b->chunk_count = b->segment_count = 0;
    b->bytes = 0;
}

static void report(struct kiwi_transfer *moved)
{
    if (!moved->progress)
        return;
    struct kiwi_residency now;
    kiwi_vmm_residency_locked(&now);
    moved->progress(&now, moved->progress_arg);
}

/* Writes the batch to a file of its own; on success its chunks are on disk, their shadows
 * freed. */
static bool spill_batch(struct batch *b, struct kiwi_transfer *moved)
{
    struct kiwi_spill_file *file = kiwi_spill_create(failure, sizeof failure);
    if (!file)
        return false;
    if (!kiwi_spill_write(file, b->segments, b->segment_count, failure, sizeof failure)) {
        kiwi_spill_release(file);
        return false;
    }
    for (size_t i = 0; i < b->chunk_count; i++) {
        struct vmm_chunk *c = b->chunks[i];
        kiwi_spill_hold(file);
        c->spilled = file;
        kiwi_vmm_shadow_free(&c->shadow);
    }
    kiwi_spill_release(file); /* the chunks hold it now */
    moved->bytes += b->bytes;
    report(moved);
    return true;
}

static void spill(uint64_t wanted, struct kiwi_transfer *moved)
{
    struct batch b = {0};
    bool ok = true;
    for (struct vmm_region *r = kiwi_vmm_first_region; r && ok; r = r->next) {
        for (int i = 0; i < r->chunk_count && ok; i++) {
            struct vmm_chunk *c = &r->chunks[i];
            if (c->resident || c->spilled || !c->piece_count || c->shadow.kind == SHADOW_NONE)
                continue;
            if (wanted && moved->bytes >= wanted)
                break;
            ok = batch_add(&b, c);
            if (!ok)
                snprintf(failure, sizeof failure, "out of host memory for the spill's list");
            if (ok && (b.bytes >= BATCH || (wanted && moved->bytes + b.bytes >= wanted))) {
                ok = spill_batch(&b, moved);
                batch_clear(&b);
            }
        }
    }
    if (ok && b.chunk_count)
        ok = spill_batch(&b, moved);
    free(b.segments);
    free(b.chunks);
    if (!ok) {
        moved->failed = failure;
        kiwi_warn("spill: %s; what was not written stays in host memory", failure);
    }
}

/* Reads back the chunks on disk in file (batch), each into a new pageable shadow. */
static bool unspill_file(struct kiwi_spill_file *file, struct batch *b, struct kiwi_transfer *moved)
{
    batch_clear(b);
    for (struct vmm_region *r = kiwi_vmm_first_region; r; r = r->next) {
        for (int i = 0; i < r->chunk_count; i++) {
            struct vmm_chunk *c = &r->chunks[i];
            if (c->spilled != file)
                continue;
            c->shadow = kiwi_vmm_shadow_pageable(c->size);
            uint64_t offset = c->spill_offset;
            bool ok = c->shadow.kind != SHADOW_NONE;
            for (size_t p = 0; ok && p < c->piece_count; p++) {
                ok = batch_add_segment(b, (unsigned char *)c->shadow.host + c->pieces[p].offset,
                                       c->pieces[p].size);
                if (ok)
                    b->segments[b->segment_count - 1].offset = offset;
                offset += c->pieces[p].size;
            }
            if (ok)
                b->chunks[b->chunk_count++] = c;
            if (!ok) {
                kiwi_vmm_shadow_free(&c->shadow);
                for (size_t k = 0; k < b->chunk_count; k++)
                    kiwi_vmm_shadow_free(&b->chunks[k]->shadow);
                snprintf(failure, sizeof failure, "out of host memory to read the spill back");
                return false;
            }
        }
    }
    /* The chunks were walked in the order they were made, the order they were written in. */
    if (!kiwi_spill_read(file, b->segments, b->segment_count, failure, sizeof failure)) {
        for (size_t k = 0; k < b->chunk_count; k++)
            kiwi_vmm_shadow_free(&b->chunks[k]->shadow);
        return false;
    }
    for (size_t k = 0; k < b->chunk_count; k++) {
        b->chunks[k]->spilled = NULL;
        kiwi_spill_release(file);
    }
    moved->bytes += b->bytes;
    return true;
}

/* ---- straight to the card ----------------------------------------------------------------- */

/* One piece of a chunk on disk: where it is in its file's stream, and where on the card. */
struct target {
    struct vmm_region *region;
    int index;
    uint64_t offset, size;
    CUdeviceptr to;
};

struct way_in {
    struct target *targets; /* in stream order */
    size_t count, next;     /* next: the first not wholly copied yet */
    kiwi_vmm_reach_fn reach;
    void *mover;
    uint64_t *bytes;
};

static int by_offset(const void *a, const void *b)
{
    uint64_t x = ((const struct target *)a)->offset, y = ((const struct target *)b)->offset;
    return x < y ? -1 : x > y;
}

/* The pieces of the chunks in file, in stream order (the order they were written in); false:
 * out of host memory. */
static bool targets_of(struct kiwi_spill_file *file, struct way_in *w)
{
    size_t capacity = 0;
    for (struct vmm_region *r = kiwi_vmm_first_region; r; r = r->next)
        for (int i = 0; i < r->chunk_count; i++)
            capacity += r->chunks[i].spilled == file ? r->chunks[i].piece_count : 0;
    w->targets = capacity ? malloc(capacity * sizeof *w->targets) : NULL;
    if (capacity && !w->targets)
        return false;
    for (struct vmm_region *r = kiwi_vmm_first_region; r; r = r->next) {
        for (int i = 0; i < r->chunk_count; i++) {
            struct vmm_chunk *c = &r->chunks[i];
            uint64_t offset = c->spill_offset;
            for (size_t p = 0; c->spilled == file && p < c->piece_count; p++) {
                w->targets[w->count++] = (struct target){
                    r, i, offset, c->pieces[p].size, r->va + c->offset + c->pieces[p].offset};
                offset += c->pieces[p].size;
            }
        }
    }
    qsort(w->targets, w->count, sizeof *w->targets, by_offset);
    return true;
}

/* The blocks the targets overlap, in order, each once; false: out of host memory. */
static bool blocks_of(const struct way_in *w, size_t **blocks, size_t *count)
{
    *count = 0;
    *blocks = w->count ? malloc(w->count * 2 * sizeof **blocks) : NULL;
    size_t capacity = w->count * 2;
    for (size_t i = 0; i < w->count; i++) {
        const struct target *t = &w->targets[i];
        for (size_t k = t->offset / KIWI_SPILL_BLOCK;
             t->size && k <= (t->offset + t->size - 1) / KIWI_SPILL_BLOCK; k++) {
            if (*count && (*blocks)[*count - 1] >= k)
                continue;
            if (*count == capacity) {
                size_t *grown = realloc(*blocks, (capacity *= 2) * sizeof *grown);
                if (!grown) {
                    free(*blocks);
                    *blocks = NULL;
                    return false;
                }
                *blocks = grown;
            }
            (*blocks)[(*count)++] = k;
        }
    }
    return !w->count || *blocks;
}

/* Block k's bytes (in a cell of the ring) copied on to the pieces it holds, each chunk reached
 * (mapped) first; the last copy's stream and context, for the cell's event. A block holding
 * pieces of two contexts waits for the first context's copies (rare: the cell has one event). */
static CUresult deliver(void *arg, size_t k, const unsigned char *bytes, CUcontext *ctx,
                        CUstream *stream)
{
    struct way_in *w = arg;
    uint64_t start = k * KIWI_SPILL_BLOCK, end = start + KIWI_SPILL_BLOCK;
    CUresult result = CUDA_SUCCESS;
    for (size_t i = w->next; i < w->count && w->targets[i].offset < end; i++) {
        const struct target *t = &w->targets[i];
        CUstream on = NULL;
        result = w->reach(w->mover, t->region, t->index, &on);
        if (result == CUDA_SUCCESS && *ctx && *ctx != t->region->ctx)
            result = kiwi_pager_driver.stream_sync(*stream);
        if (result != CUDA_SUCCESS)
            return result;
        uint64_t from = t->offset > start ? t->offset : start;
        uint64_t to = t->offset + t->size < end ? t->offset + t->size : end;
        result = kiwi_pager_driver.copy_to_device(t->to + (from - t->offset),
                                                  bytes + (from - start), to - from, on);
        if (result != CUDA_SUCCESS)
            return result;
        *w->bytes += to - from;
        *ctx = t->region->ctx;
        *stream = on;
        if (to == t->offset + t->size)
            w->next = i + 1;
    }
    return result;
}

CUresult kiwi_vmm_unspill_to_card(struct kiwi_spill_file *file, kiwi_vmm_reach_fn reach,
                                  void *mover, uint64_t *bytes, const char **why)
{
    struct way_in w = {.reach = reach, .mover = mover, .bytes = bytes};
    size_t *blocks = NULL, count = 0;
    CUresult result = CUDA_SUCCESS;
    if (!targets_of(file, &w) || !blocks_of(&w, &blocks, &count)) {
        result = CUDA_ERROR_OUT_OF_MEMORY;
    } else if (!kiwi_vmm_stage_from_disk(file, blocks, count, deliver, &w, &result, failure,
                                         sizeof failure)) {
        *why = failure;
        result = CUDA_ERROR_UNKNOWN;
    }
    /* Chunks of the file with nothing to copy (no pieces) are still to be mapped. */
    for (struct vmm_region *r = kiwi_vmm_first_region; r && result == CUDA_SUCCESS; r = r->next)
        for (int i = 0; i < r->chunk_count && result == CUDA_SUCCESS; i++) {
            CUstream unused;
            if (r->chunks[i].spilled == file && !r->chunks[i].resident)
                result = reach(mover, r, i, &unused);
        }
    free(blocks);
    free(w.targets);
    return result;
}

/* The first chunk on disk whose file is not known to fail (after: the files that did). */
static struct kiwi_spill_file *next_file(struct kiwi_spill_file *const *failed, size_t failures)
{
    for (struct vmm_region *r = kiwi_vmm_first_region; r; r = r->next)
        for (int i = 0; i < r->chunk_count; i++) {
            struct kiwi_spill_file *file = r->chunks[i].spilled;
            bool known = false;
            for (size_t k = 0; file && k < failures && !known; k++)
                known = failed[k] == file;
            if (file && !known)
                return file;
        }
    return NULL;
}

bool kiwi_vmm_unspill_locked(struct kiwi_transfer *moved)
{
    struct batch b = {0};
    struct kiwi_spill_file *failed[16];
    size_t failures = 0;
    struct kiwi_spill_file *file;
    while (failures < sizeof failed / sizeof failed[0] && (file = next_file(failed, failures)))
        if (!unspill_file(file, &b, moved))
            failed[failures++] = file;
    free(b.segments);
    free(b.chunks);
    if (failures) {
        moved->failed = failure;
        kiwi_warn("reading the spill back: %s; that memory stays on disk", failure);
    }
    return !failures;
}

void kiwi_vmm_spill_forget(struct vmm_chunk *c)
{
    if (c->spilled)
        kiwi_spill_release(c->spilled);
    c->spilled = NULL;
}

void kiwi_vmm_tier(enum kiwi_page_direction direction, uint64_t bytes,
                   struct kiwi_transfer *moved)
{
    *moved = (struct kiwi_transfer){.progress = moved->progress,
                                    .progress_arg = moved->progress_arg};
    double started = kiwi_now();
    kiwi_vmm_moving(true);
    pthread_mutex_lock(&kiwi_vmm_lock);
    kiwi_vmm_builder_quiet();
    if (direction == KIWI_PAGE_OUT)
        spill(bytes, moved);
    else
        kiwi_vmm_unspill_locked(moved);
    struct kiwi_residency after;
    kiwi_vmm_residency_locked(&after);
    kiwi_vmm_moving(false);
    pthread_mutex_unlock(&kiwi_vmm_lock);
    moved->seconds = kiwi_now() - started;
    kiwi_log("vmm: moved %llu bytes %s in %.6f s%s%s", (unsigned long long)moved->bytes,
             direction == KIWI_PAGE_OUT ? "to spill files" : "from spill files to host memory",
             moved->seconds, moved->failed ? "; failed: " : "", moved->failed ? moved->failed : "");
}
