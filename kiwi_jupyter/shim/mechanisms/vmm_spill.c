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
 * In (the daemon's `fetch` with tier host, or a restore that finds chunks on disk): each chunk
 * on disk gets a pageable shadow (pinning is slow, and the staging ring copies from pageable
 * ones at the link's speed: vmm_staging.c), and its file's blocks are read back and checked. A
 * chunk whose file could not be read stays on disk, its new shadow freed. A chunk on disk has
 * no shadow, and the builder makes it none (vmm_builder.c): it is to hold no host memory.
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
