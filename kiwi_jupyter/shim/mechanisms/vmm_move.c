/* The vmm evictor's move: the memory it maps, to host memory and back, at the link's speed,
 * with the card really free in between.
 *
 * Out (after the release has drained the gate and synchronized every context): the frees that
 * waited for their events are done, the regions kept for reuse released, and the driver's
 * graph pools trimmed (cuDeviceGraphMemTrim: what graphs no longer use goes back; what they do
 * use cannot move). Then chunk by chunk, in the order they were made: the live bytes of each
 * chunk (the allocations in it, less the blocks the framework's cache holds free, free_ranges.c)
 * are copied to its host shadow with cuMemcpyDtoHAsync on one of two streams of its context,
 * the pager's and one of the vmm evictor's own, so the copy engines never idle between chunks;
 * an event follows each chunk's copies, and as it completes the chunk is unmapped and its
 * handle released. At most WINDOW chunks are in flight. A chunk with nothing live is released
 * without a copy. A chunk whose copy failed stays on the card (and its region's bytes are still
 * counted there). Every KIWI_PROGRESS_BYTES released the caller hears of it, so the daemon may
 * start the next holder's restore while the rest goes out.
 *
 * In (on a grant, before the gate opens): each chunk that is away gets a new handle, mapped at
 * the same address with the same access, and what its shadow holds is copied back, on the two
 * streams in turn; mapping the next chunk overlaps the copy of the last. The shadows stay, for
 * the next eviction. When the card has no room for a chunk (another process took it meanwhile)
 * the restore waits while the card's free memory grows (another process's eviction on its way
 * out: a daemon with handoff_overlap grants this way in beside that way out), and when it stops
 * growing the restore is rolled back: every chunk it mapped is taken off again, the shadows
 * untouched, and moved->failed says why; nothing is left half mapped, and the next grant tries
 * again. Chunks without a pinned shadow go through the staging ring both ways (vmm_staging.c).
 * Chunks on disk come straight from their spill file through the ring (vmm_spill.c), mapped as
 * the file's stream reaches them; they leave the file only once the restore has ended well.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <time.h>

#include "vmm.h"

#define WINDOW 8
/* A restore without room waits this long for the card's free memory to grow, looking this
 * often (the driver's own figure: no event says so across processes). */
#define ROOM_PATIENCE 3.0
#define ROOM_POLL_NS 200000L

/* The two streams of a context a move copies on, made on first use. */
struct lanes {
    struct context *context;
    CUstream stream[2];
    int next;
};

struct flight {
    struct vmm_region *region;
    int index;
    CUevent event;
    CUstream stream;
    uint64_t staged; /* of its bytes, those that hold slots of the staging ring */
};

struct mapped {
    struct vmm_region *region;
    int index;
};

struct mover {
    struct context *contexts;
    int context_count;
    struct mapped *done; /* what a restore mapped, to take off again if it fails */
    size_t done_count;
    struct lanes lanes[16];
    int lane_count;
    CUcontext current;
    struct flight window[WINDOW];
    int in_flight, oldest;
    uint64_t bytes, released, reported;
    uint64_t copied_out; /* of the chunks off the card: what their shadows hold now */
    struct kiwi_residency before;
    int failures;
    bool staging; /* the ring is there: chunks without a pinned shadow copy through it */
    uint64_t ring_bytes, staged_in_flight; /* the ring's slots, and what chunks in flight hold */
    struct kiwi_transfer *moved;
};

static bool make_current(struct mover *m, CUcontext ctx)
{
    if (m->current == ctx)
        return true;
    if (kiwi_pager_driver.ctx_set(ctx) != CUDA_SUCCESS)
        return false;
    m->current = ctx;
    return true;
}

/* The lanes of ctx (current), from the pager's known contexts; NULL when it knows none. */
static struct lanes *lanes_of(struct mover *m, struct context *contexts, int count, CUcontext ctx)
{
    for (int i = 0; i < m->lane_count; i++)
        if (m->lanes[i].context->ctx == ctx)
            return m->lanes[i].stream[0] ? &m->lanes[i] : NULL;
    struct context *c = NULL;
    for (int i = 0; i < count && !c; i++)
        if (contexts[i].ctx == ctx)
            c = &contexts[i];
    if (!c || m->lane_count == (int)(sizeof m->lanes / sizeof m->lanes[0]) ||
        !make_current(m, ctx))
        return NULL;
    struct lanes *l = &m->lanes[m->lane_count++];
    *l = (struct lanes){.context = c};
    if (!c->stream &&
        kiwi_pager_driver.stream_create(&c->stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
        c->stream = NULL;
    l->stream[0] = c->stream;
    l->stream[1] = kiwi_vmm_second_stream(ctx);
    if (!l->stream[1])
        l->stream[1] = l->stream[0];
    return l->stream[0] ? l : NULL;
}

static CUstream next_stream(struct lanes *l)
{
    CUstream stream = l->stream[l->next];
    l->next ^= 1;
    return stream;
}

static void synchronize_lanes(struct mover *m)
{
    for (int i = 0; i < m->lane_count; i++) {
        if (!m->lanes[i].stream[0] || !make_current(m, m->lanes[i].context->ctx))
            continue;
        kiwi_pager_driver.stream_sync(m->lanes[i].stream[0]);
        if (m->lanes[i].stream[1] != m->lanes[i].stream[0])
            kiwi_pager_driver.stream_sync(m->lanes[i].stream[1]);
    }
}

/* ---- out --------------------------------------------------------------------------------- */

static int by_address(const void *a, const void *b)
{
    CUdeviceptr x = ((const struct kiwi_range *)a)->ptr, y = ((const struct kiwi_range *)b)->ptr;
    return x < y ? -1 : x > y;
}

/* Another KIWI_PROGRESS_BYTES off the card since the last report: where the memory is now. */
static void report(struct mover *m)
{
    if (!m->moved->progress || m->released - m->reported < KIWI_PROGRESS_BYTES)
        return;
    m->reported = m->released;
    struct kiwi_residency now = m->before;
    now.resident = now.resident > m->released ? now.resident - m->released : 0;
    now.host += m->copied_out;
    m->moved->progress(&now, m->moved->progress_arg);
}

/* The oldest chunk in flight: once its copy is done, off the card. */
static void retire_oldest(struct mover *m)
{
    struct flight *f = &m->window[m->oldest];
    m->oldest = (m->oldest + 1) % WINDOW;
    m->in_flight--;
    m->staged_in_flight -= f->staged;
    struct vmm_chunk *c = &f->region->chunks[f->index];
    CUresult result = CUDA_SUCCESS;
    if (f->event) {
        result = kiwi_vmm_driver.event_synchronize(f->event);
        kiwi_vmm_event_give(f->region->ctx, f->event);
    } else if (make_current(m, f->region->ctx)) {
        result = kiwi_pager_driver.stream_sync(f->stream);
    }
    if (result == CUDA_SUCCESS)
        result = kiwi_vmm_unmap_chunk(f->region->va, c);
    if (result != CUDA_SUCCESS) {
        m->failures++;
        free(c->pieces); /* still on the card: its shadow holds nothing needed */
        c->pieces = NULL;
        c->piece_count = 0;
        return;
    }
    m->released += c->size;
    for (size_t p = 0; p < c->piece_count; p++)
        m->copied_out += c->pieces[p].size;
    report(m);
}

/* The chunks in flight whose copies are done, off the card (and reported) before the next
 * chunk is queued: queuing may wait (for the staging ring, for the driver), and the daemon's
 * evict_timeout runs from the last report it heard. */
static void retire_finished(struct mover *m)
{
    while (m->in_flight) {
        struct flight *f = &m->window[m->oldest];
        if (!f->event || kiwi_vmm_driver.event_query(f->event) != CUDA_SUCCESS)
            return;
        retire_oldest(m);
    }
}

/* Room in the staging ring for a chunk's staged bytes, by taking the oldest chunks off first
 * (each waits for its copy out of the card, not for the ring's copiers). Queued into a full
 * ring, the chunk would wait there for slots while the chunks before it, long done, were
 * neither released nor reported: through a ring smaller than the working set, a slow link's
 * way out reported nothing until all but the last chunks were queued, and the daemon
 * checkpointed it in the middle for making no progress. */
static void make_room_in_ring(struct mover *m, uint64_t staged)
{
    while (m->in_flight && m->staged_in_flight + staged > m->ring_bytes)
        retire_oldest(m);
}

/* One chunk: its live pieces copied out and the chunk queued to be taken off; or, with
 * nothing live, taken off at once. */
static void evict_chunk(struct mover *m, struct lanes *l, struct vmm_region *r, int index,
                        const struct kiwi_range *live, size_t live_count)
{
    struct vmm_chunk *c = &r->chunks[index];
    free(c->pieces);
    c->piece_count =
        kiwi_vmm_live_pieces(live, live_count, r->va + c->offset, c->size, &c->pieces);
    if (!c->piece_count) {
        if (kiwi_vmm_unmap_chunk(r->va, c) == CUDA_SUCCESS) {
            m->released += c->size;
            report(m);
        } else {
            m->failures++;
        }
        return;
    }
    if (c->shadow.kind == SHADOW_NONE) /* the builder is behind, or past its budget */
        c->shadow = kiwi_vmm_shadow_pageable(c->size);
    retire_finished(m);
    if (m->in_flight == WINDOW)
        retire_oldest(m);
    bool staged = m->staging && !kiwi_vmm_shadow_pinned(&c->shadow);
    uint64_t live_bytes = 0;
    for (size_t p = 0; p < c->piece_count; p++)
        live_bytes += c->pieces[p].size;
    if (staged)
        make_room_in_ring(m, live_bytes);
    CUstream stream = next_stream(l);
    bool copied = c->shadow.kind != SHADOW_NONE && make_current(m, r->ctx);
    for (size_t p = 0; copied && p < c->piece_count; p++) {
        const struct vmm_piece *piece = &c->pieces[p];
        unsigned char *to = (unsigned char *)c->shadow.host + piece->offset;
        CUdeviceptr from = r->va + c->offset + piece->offset;
        copied = (staged ? kiwi_vmm_stage_out(r->ctx, stream, from, to, piece->size)
                         : kiwi_pager_driver.copy_to_host(to, from, piece->size, stream)) ==
                 CUDA_SUCCESS;
    }
    if (!copied) {
        kiwi_warn("copying %zu bytes at 0x%llx to host memory failed; they stay on the card",
                  c->size, (unsigned long long)(r->va + c->offset));
        if (make_current(m, r->ctx))
            kiwi_pager_driver.stream_sync(stream); /* the copies queued still read the chunk */
        free(c->pieces);
        c->pieces = NULL;
        c->piece_count = 0;
        m->failures++;
        return;
    }
    CUevent event = kiwi_vmm_event_take(r->ctx);
    if (event && kiwi_vmm_driver.event_record(event, stream) != CUDA_SUCCESS) {
        kiwi_vmm_event_give(r->ctx, event);
        event = NULL; /* retire_oldest waits for the whole stream instead */
    }
    m->window[(m->oldest + m->in_flight) % WINDOW] =
        (struct flight){r, index, event, stream, staged ? live_bytes : 0};
    m->in_flight++;
    m->staged_in_flight += staged ? live_bytes : 0;
    m->bytes += live_bytes;
}

static void evict(struct mover *m, struct context *contexts, int context_count,
                  const struct kiwi_range *ranges, size_t count)
{
    kiwi_vmm_reclaim(true); /* every context was synchronized: every event has completed */
    kiwi_vmm_trim_cache();
    kiwi_vmm_residency_locked(&m->before);
    for (int i = 0; kiwi_vmm_driver.graph_trim && i < context_count; i++)
        if (make_current(m, contexts[i].ctx))
            kiwi_vmm_driver.graph_trim(contexts[i].device);
    struct kiwi_range *pieces;
    size_t live;
    size_t total = kiwi_free_ranges_split(ranges, count, &pieces, &live);
    size_t live_count = total ? live : count;
    struct kiwi_range *sorted = live_count ? malloc(live_count * sizeof *sorted) : NULL;
    for (size_t i = 0; sorted && i < live_count; i++)
        sorted[i] = total ? pieces[i] : ranges[i];
    if (sorted)
        qsort(sorted, live_count, sizeof *sorted, by_address);
    else if (live_count)
        live_count = 0; /* out of host memory: nothing is known live, nothing is moved */
    for (size_t i = live; total && i < total; i++)
        m->moved->skipped += pieces[i].size;
    m->moved->discarded = m->moved->skipped; /* released with their chunks, never copied */
    for (struct vmm_region *r = kiwi_vmm_first_region; r; r = r->next) {
        if (r->pinned)
            continue;
        struct lanes *l = NULL;
        for (int i = 0; i < r->chunk_count; i++) {
            if (!r->chunks[i].resident)
                continue;
            if (!l)
                l = lanes_of(m, contexts, context_count, r->ctx);
            if (!l) {
                m->failures++;
                break;
            }
            evict_chunk(m, l, r, i, sorted, live_count);
        }
    }
    while (m->in_flight)
        retire_oldest(m);
    if (m->staging && !kiwi_vmm_staging_end()) /* the copiers' half: into the shadows */
        kiwi_warn("a staged copy to host memory failed; what it held is lost");
    free(sorted);
    free(pieces);
    kiwi_vmm_evicted = true;
}

/* ---- in ---------------------------------------------------------------------------------- */

/* A restore's copies are all done, the staged ones too; false when one failed. */
static bool copies_done(struct mover *m)
{
    synchronize_lanes(m);
    return !m->staging || kiwi_vmm_staging_end();
}

/* Takes off again what a failed restore mapped: nothing is left half there. */
static void roll_back(struct mover *m)
{
    copies_done(m); /* copies into those chunks may be in flight */
    for (size_t i = 0; i < m->done_count; i++)
        kiwi_vmm_unmap_chunk(m->done[i].region->va, &m->done[i].region->chunks[m->done[i].index]);
}

/* The card had no room for a chunk: waits while its free memory grows (another process's
 * eviction on its way out, which a daemon with handoff_overlap grants this restore beside);
 * true when it grew (try again), false once it has not for ROOM_PATIENCE seconds (someone else
 * holds the room: roll back, the next grant tries again). The copies queued so far go on
 * meanwhile, on their copy engine, beside the other process's way out on the other. */
static bool room_grew(void)
{
    size_t before = 0, now = 0, total = 0;
    if (!kiwi_vmm_driver.mem_info || kiwi_vmm_driver.mem_info(&before, &total) != CUDA_SUCCESS)
        return false;
    const struct timespec pause = {0, ROOM_POLL_NS};
    for (double since = kiwi_now(); kiwi_now() - since < ROOM_PATIENCE;) {
        nanosleep(&pause, NULL);
        if (kiwi_vmm_driver.mem_info(&now, &total) != CUDA_SUCCESS)
            return false;
        if (now > before)
            return true;
    }
    return false;
}

/* Maps a chunk back (its context current), waiting for room while the room grows; counted as
 * mapped by the restore. */
static CUresult map_back(struct mover *m, struct vmm_region *r, int index)
{
    struct vmm_chunk *c = &r->chunks[index];
    CUresult result = kiwi_vmm_map_chunk(r->va, c, r->device);
    while (result == CUDA_ERROR_OUT_OF_MEMORY && room_grew())
        result = kiwi_vmm_map_chunk(r->va, c, r->device);
    if (result == CUDA_SUCCESS)
        m->done[m->done_count++] = (struct mapped){r, index};
    return result;
}

/* The disk's way in reaches a chunk (kiwi_vmm_reach_fn): mapped, its copies on its context's
 * first lane (one stream per context: each cell of the ring has one event). */
static CUresult reach_chunk(void *mover, struct vmm_region *r, int index, CUstream *stream)
{
    struct mover *m = mover;
    if (!make_current(m, r->ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    struct lanes *l = lanes_of(m, m->contexts, m->context_count, r->ctx);
    *stream = l ? l->stream[0] : NULL;
    return r->chunks[index].resident ? CUDA_SUCCESS : map_back(m, r, index);
}

/* Maps a chunk back and queues the copy of what its shadow holds; the result of the first
 * call that failed. */
static CUresult restore_chunk(struct mover *m, struct lanes *l, struct vmm_region *r, int index)
{
    struct vmm_chunk *c = &r->chunks[index];
    if (!make_current(m, r->ctx))
        return CUDA_ERROR_INVALID_CONTEXT;
    CUresult result = map_back(m, r, index);
    if (result != CUDA_SUCCESS || !c->piece_count)
        return result;
    CUstream stream = l ? next_stream(l) : NULL;
    bool staged = l && m->staging && !kiwi_vmm_shadow_pinned(&c->shadow);
    for (size_t p = 0; p < c->piece_count && result == CUDA_SUCCESS; p++) {
        const struct vmm_piece *piece = &c->pieces[p];
        const unsigned char *from = (const unsigned char *)c->shadow.host + piece->offset;
        CUdeviceptr to = r->va + c->offset + piece->offset;
        result = staged ? kiwi_vmm_stage_in(r->ctx, stream, from, to, piece->size)
                        : kiwi_pager_driver.copy_to_device(to, from, piece->size, stream);
        m->bytes += piece->size;
    }
    if (!l && result == CUDA_SUCCESS) /* a context the pager does not know: no lanes to wait on */
        result = kiwi_pager_driver.ctx_sync();
    return result;
}

static void restore(struct mover *m)
{
    size_t capacity = 0;
    for (struct vmm_region *r = kiwi_vmm_first_region; r; r = r->next)
        capacity += (size_t)r->chunk_count;
    m->done = capacity ? malloc(capacity * sizeof *m->done) : NULL;
    CUresult result = capacity && !m->done ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
    for (struct vmm_region *r = kiwi_vmm_first_region; r && result == CUDA_SUCCESS; r = r->next) {
        struct lanes *l = NULL;
        for (int i = 0; i < r->chunk_count && result == CUDA_SUCCESS; i++) {
            struct vmm_chunk *c = &r->chunks[i];
            if (c->resident)
                continue;
            if (!l)
                l = lanes_of(m, m->contexts, m->context_count, r->ctx);
            result = c->spilled ? kiwi_vmm_unspill_to_card(c->spilled, reach_chunk, m, &m->bytes,
                                                           &m->moved->failed)
                                : restore_chunk(m, l, r, i);
        }
    }
    if (result == CUDA_SUCCESS && !copies_done(m))
        result = CUDA_ERROR_UNKNOWN;
    if (result != CUDA_SUCCESS) {
        roll_back(m);
        m->bytes = 0;
        if (!m->moved->failed) /* else a spill file's read failed, and says why */
            m->moved->failed = result == CUDA_ERROR_OUT_OF_MEMORY
                                   ? "restore: out of memory"
                                   : "restore: the driver refused to map or copy back";
        kiwi_warn("%s (CUDA error %d): rolled back, nothing of this process is on the card; "
                  "the next grant tries again", m->moved->failed, result);
    }
    for (size_t i = 0; result == CUDA_SUCCESS && i < m->done_count; i++) {
        struct vmm_chunk *c = &m->done[i].region->chunks[m->done[i].index];
        kiwi_vmm_spill_forget(c); /* it came from its spill file: no longer needed there */
        free(c->pieces);
        c->pieces = NULL;
        c->piece_count = 0;
    }
    free(m->done);
    if (result == CUDA_SUCCESS)
        kiwi_vmm_evicted = false;
}

void kiwi_vmm_move(enum kiwi_page_direction direction, struct kiwi_transfer *moved)
{
    *moved = (struct kiwi_transfer){.progress = moved->progress,
                                    .progress_arg = moved->progress_arg};
    if (!kiwi_vmm_resolve())
        return;
    double started = kiwi_now();
    struct kiwi_range *ranges;
    size_t count = kiwi_memory_paging_begin(KIWI_RANGES_MAPPED, &ranges);
    int context_count;
    struct context *contexts = kiwi_contexts_lock(&context_count);
    CUcontext caller = NULL;
    kiwi_pager_driver.ctx_get(&caller);
    struct mover m = {.moved = moved, .current = caller, .contexts = contexts,
                      .context_count = context_count};
    kiwi_vmm_moving(true);
    pthread_mutex_lock(&kiwi_vmm_lock);
    kiwi_vmm_builder_quiet(); /* a pinning under way holds the driver: the move waits it out */
    m.staging = kiwi_vmm_staging_begin();
    m.ring_bytes = m.staging ? kiwi_vmm_staging_bytes() : 0;
    if (direction == KIWI_PAGE_OUT)
        evict(&m, contexts, context_count, ranges, count);
    else if (m.staging || kiwi_vmm_unspill_locked(moved)) /* no ring: to host memory first */
        restore(&m);
    kiwi_vmm_recount_backed();
    struct kiwi_residency after;
    kiwi_vmm_residency_locked(&after); /* a reader that did not wait gets the move's end */
    kiwi_vmm_moving(false);
    pthread_mutex_unlock(&kiwi_vmm_lock);
    kiwi_contexts_unlock();
    kiwi_memory_paging_end(ranges);
    moved->bytes = m.bytes;
    moved->seconds = kiwi_now() - started;
    if (m.failures)
        kiwi_warn("%d chunk(s) could not be moved to host memory; they stay on the card",
                  m.failures);
    kiwi_log("vmm: moved %llu bytes %s in %.6f s (%llu released from the card); %llu free in "
             "the framework's cache not copied", (unsigned long long)m.bytes,
             direction == KIWI_PAGE_OUT ? "to host memory" : "to the GPU", moved->seconds,
             (unsigned long long)m.released, (unsigned long long)moved->skipped);
}
