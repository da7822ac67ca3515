/* What the vmm evictor's files share (shim.h, memory.h and pager.h declare what the rest of the
 * shim calls in them). They call one another only downwards, in this order:
 *
 *   vmm_evictor.c  the evictor's operations (struct kiwi_evictor): its allocations, the
 *                  room they wait for, its move and the managed memory moved alongside
 *   vmm_move.c     the move: an eviction copies each chunk to its host shadow on two streams
 *                  per context and unmaps and releases it as its copy completes; a restore
 *                  maps each again at its address and copies it back, or rolls back
 *   vmm_ipc.c      legacy IPC: a region exported as file descriptors and pinned; another
 *                  process's opened here
 *   vmm_spill.c    the disk tier: what an eviction left in host shadows, to spill files and
 *                  back (spill.h), chunk by chunk, the shadows freed only once written; a
 *                  restore's chunks on disk straight to the card through the staging ring
 *   vmm_staging.c  copies of chunks without a pinned shadow, through a ring of pinned buffers
 *                  and threads that copy between them and the pageable shadows
 *   vmm.c          an allocation placed: in a slab, a cached region, its stream's pending free
 *                  or a new region; what a context's end and a fork take
 *   vmm_addresses.c questions about an address; what pins memory in place; peer access
 *   vmm_residency.c where the memory is: on the card, in host memory, in shadows
 *   vmm_frees.c    frees: synchronized, stream-ordered (pending until their event), or
 *                  deferred past a capture
 *   vmm_allocations.c the program's allocations (kept in memory.c's table), and what goes
 *                  when one does
 *   vmm_cache.c    regions kept mapped for reuse after their last allocation went
 *   vmm_regions.c  regions of reserved address space cut into chunks: made, backed, destroyed
 *   vmm_slabs.c    slabs: small allocations in units of one granule's region
 *   vmm_builder.c  the thread that pins shadows ahead, within the pin budget and the cgroup's
 *                  room, never during a move or a global capture; spares; the staging ring
 *   vmm_shadows.c  host shadows: pinned huge pages, the driver's pinned memory, or pageable
 *   vmm_chunks.c   the physical side: the driver's VMM calls, one chunk mapped or unmapped,
 *                  the access every mapping gets (its device, and the peers the program enabled)
 *   vmm_index.c    the regions by address, for every question about an address
 *   vmm_reuse.c    stream-ordered reuse: pending frees by stream and size class
 *   vmm_contexts.c, vmm_pools.c  per context a second stream and spare events; per pool the
 *                  counters of cuMemPoolGetAttribute
 *
 * The words: a region is one reservation of address space (one allocation of 1 MiB or more,
 * or a slab holding small ones); a chunk is one physical handle mapped into a region, at most
 * VMM_CHUNK_MAX; a chunk is resident while it is mapped on the card, and its shadow is the
 * host memory its bytes go to when it is not.
 */
#ifndef KIWI_VMM_H
#define KIWI_VMM_H

#include <unistd.h>

#include "memory.h"
#include "pager.h"
#include "spill.h"

/* Allocations smaller than this share slabs of one granule (2 MiB on current GPUs). */
#define VMM_SLAB_LIMIT ((size_t)1 << 20)
/* An allocation up to this is one handle; a larger one is cut into chunks of 64 to 256 MiB,
 * so that a move can copy, release and map it piece by piece. */
#define VMM_CHUNK_MAX ((size_t)256 << 20)
/* A slab's unit: every small allocation starts on one (cudaMalloc promises 256 bytes). */
#define VMM_UNIT ((size_t)512)

enum vmm_shadow_kind {
    SHADOW_NONE,
    SHADOW_PAGEABLE,   /* anonymous memory, not pinned: copies to it are slower */
    SHADOW_REGISTERED, /* anonymous huge pages pinned with cuMemHostRegister */
    SHADOW_ALLOCATED,  /* the driver's pinned memory (cuMemAllocHost) */
};

struct vmm_shadow {
    void *host;
    size_t size;
    enum vmm_shadow_kind kind;
};

/* A part of a chunk the last eviction copied out, so the restore copies back just that. */
struct vmm_piece {
    size_t offset;
    size_t size;
};

struct vmm_chunk {
    size_t offset; /* from the region's start */
    size_t size;
    CUmemGenericAllocationHandle handle; /* while resident */
    bool resident;
    struct vmm_shadow shadow;
    struct vmm_piece *pieces; /* what its shadow holds while it is away; NULL: nothing */
    size_t piece_count;
    /* While away, its pieces are in this spill file instead (end to end from spill_offset of
     * its stream) and it has no shadow; NULL: in its shadow (vmm_spill.c). */
    struct kiwi_spill_file *spilled;
    uint64_t spill_offset;
};

/* A region shared through legacy IPC (vmm_ipc.c): each chunk exported as a file descriptor,
 * and a manifest (a memfd) that lists them for the importer; closed with the region. */
struct vmm_export {
    int manifest;
    uint64_t token;  /* the manifest's, so that a stale handle is told apart */
    int chunk_fds[]; /* one per chunk, in order */
};

struct vmm_region {
    struct vmm_region *next, *prev; /* every region, in the order they were made */
    /* The slabs in use, or the regions kept for reuse, so that an allocation looks only there */
    struct vmm_region *side_next, *side_prev;
    uint64_t serial;                /* never reused: the shadow builder finds it again by it */
    CUdeviceptr va;
    size_t size; /* reserved: whole granules */
    CUcontext ctx;
    CUdevice device;
    int chunk_count;
    struct vmm_chunk *chunks;
    bool slab;
    uint64_t *units;     /* a slab's units in use, one bit each */
    uint64_t *starts;    /* a slab's units where an allocation starts, one bit each */
    size_t unit_count;   /* units in the slab */
    size_t units_used;
    size_t allocations;  /* allocations in it not yet reclaimed */
    bool pinned;         /* a handle of it was handed out: it stays where it is */
    struct vmm_export *export; /* shared through legacy IPC (pinned then), or NULL */
    bool cached;         /* freed, and kept mapped for a next allocation of its size */
};

/* A stream as stream-ordered reuse tells them apart: its handle in its context, and for the
 * per-thread default stream the thread (each thread's is another stream). */
struct vmm_stream {
    CUcontext ctx;
    CUstream stream;
    pthread_t thread; /* 0 but for the per-thread default stream */
};

/* One allocation the program made: a region of its own, or units of a slab. */
struct vmm_allocation {
    /* in the list of pending frees, or of a context's allocations going */
    struct vmm_allocation *next;
    struct vmm_allocation *prev; /* in the list of pending frees */
    CUdeviceptr ptr;
    size_t size;
    struct vmm_region *region;
    size_t first_unit, unit_count; /* in a slab */
    CUmemoryPool pool;             /* a stream-ordered allocation's pool, for its counters */
    uint64_t buffer_id;            /* CU_POINTER_ATTRIBUTE_BUFFER_ID: its own, for its life */
    bool sync_memops;              /* CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, as the program set it */
    /* A pending free: reclaimed once its event completes, or, without one (a free during
     * graph capture), after the next release has synchronized everything. */
    CUevent event;
    CUcontext event_ctx;
    bool stream_ordered;             /* cuMemAllocAsync's: it belongs to no context */
    struct vmm_stream freed_on;      /* a stream-ordered free's stream */
    bool filed;                      /* filed for stream-ordered reuse (vmm_reuse.c) */
    struct vmm_allocation *reuse_next, *reuse_prev;
};

/* ---- vmm_chunks.c ------------------------------------------------------------------------ */

/* The parts of a chunk [start, start + size) that live ranges (sorted, disjoint) cover, as
 * pieces relative to start, those close together merged; how many (0: none, or no memory). */
size_t kiwi_vmm_live_pieces(const struct kiwi_range *live, size_t count, CUdeviceptr start,
                            size_t size, struct vmm_piece **out);

typedef CUresult (*reserve_fn)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*address_free_fn)(CUdeviceptr, size_t);
typedef CUresult (*create_fn)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                              unsigned long long);
typedef CUresult (*release_fn)(CUmemGenericAllocationHandle);
typedef CUresult (*map_fn)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                           unsigned long long);
typedef CUresult (*unmap_fn)(CUdeviceptr, size_t);
typedef CUresult (*set_access_fn)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
typedef CUresult (*granularity_fn)(size_t *, const CUmemAllocationProp *,
                                   CUmemAllocationGranularity_flags);
typedef CUresult (*event_create_fn)(CUevent *, unsigned int);
typedef CUresult (*event_fn)(CUevent);
typedef CUresult (*event_record_fn)(CUevent, CUstream);
typedef CUresult (*host_register_fn)(void *, size_t, unsigned int);
typedef CUresult (*host_unregister_fn)(void *);
typedef CUresult (*graph_trim_fn)(CUdevice);
typedef CUresult (*export_fn)(void *, CUmemGenericAllocationHandle, int, unsigned long long);
typedef CUresult (*import_fn)(CUmemGenericAllocationHandle *, void *, int);
typedef CUresult (*mem_info_fn)(size_t *, size_t *);

/* The driver functions the vmm evictor calls (besides the pager's): resolved on first use. */
struct vmm_driver {
    reserve_fn reserve;
    address_free_fn address_free;
    create_fn create;
    release_fn release;
    map_fn map;
    unmap_fn unmap;
    set_access_fn set_access;
    granularity_fn granularity;
    event_create_fn event_create;
    event_record_fn event_record;
    event_fn event_query;
    event_fn event_synchronize;
    event_fn event_destroy;
    host_register_fn host_register;
    host_unregister_fn host_unregister;
    graph_trim_fn graph_trim; /* cuDeviceGraphMemTrim; NULL on drivers before CUDA 11.4 */
    export_fn export_fd;      /* cuMemExportToShareableHandle, and cuMemImport...: legacy IPC */
    import_fn import_fd;
    mem_info_fn mem_info;     /* the driver's own cuMemGetInfo: the card's free memory */
};
extern struct vmm_driver kiwi_vmm_driver;

/* Resolves them and the pager's; false while no driver is loaded or it lacks the VMM API. */
bool kiwi_vmm_resolve(void);
/* The device's allocation granularity (2 MiB on current GPUs); 0 when the driver cannot say. */
size_t kiwi_vmm_granularity(CUdevice device);
/* Backs a chunk of the region at va: a new physical handle on device, mapped at
 * va + c->offset, with the access every mapping gets. On failure nothing is left behind. */
CUresult kiwi_vmm_map_chunk(CUdeviceptr va, struct vmm_chunk *c, CUdevice device);
/* Unmaps a resident chunk and releases its handle: its memory leaves the card. */
CUresult kiwi_vmm_unmap_chunk(CUdeviceptr va, struct vmm_chunk *c);
/* Gives [va, va + size) on device the access every mapping gets (again: a peer was enabled). */
CUresult kiwi_vmm_set_access(CUdeviceptr va, size_t size, CUdevice device);
/* Gives device (alone) read-write access to [va, va + size): memory another process shared. */
CUresult kiwi_vmm_give_access(CUdeviceptr va, size_t size, CUdevice device);
/* From now on a mapping on owner is also accessible from accessor (cuCtxEnablePeerAccess);
 * true when that is new. */
bool kiwi_vmm_peer_note(CUdevice owner, CUdevice accessor);
void kiwi_vmm_chunks_after_fork(void);

/* ---- vmm_index.c ------------------------------------------------------------------------- */

/* Under kiwi_vmm_lock: r's addresses are known from now on (false: out of host memory), or no
 * longer. */
bool kiwi_vmm_index_add(struct vmm_region *r);
void kiwi_vmm_index_remove(struct vmm_region *r);
/* Under kiwi_vmm_lock: the region whose addresses hold ptr (one kept for reuse too), or NULL. */
struct vmm_region *kiwi_vmm_index_find(CUdeviceptr ptr);
/* Under kiwi_vmm_lock: the regions overlapping [ptr, ptr + size), in address order, at *first
 * (the index's own array: valid until it next changes); returns how many. */
size_t kiwi_vmm_index_overlapping(CUdeviceptr ptr, size_t size,
                                  struct vmm_region *const **first);
void kiwi_vmm_index_after_fork(void);

/* ---- vmm_reuse.c ------------------------------------------------------------------------- */

/* The units of a slab, and the bytes of a region (whole granules), a stream-ordered allocation
 * of size takes: its size class. */
size_t kiwi_vmm_class_units(size_t size);
size_t kiwi_vmm_class_bytes(size_t size, size_t granule);
/* The stream a call on stream in ctx means, from the calling thread. */
struct vmm_stream kiwi_vmm_stream(CUcontext ctx, CUstream stream);
/* Under kiwi_vmm_lock: a's pending free (its event recorded on a->freed_on) may be reused by
 * an allocation on that stream; or no longer. */
void kiwi_vmm_reuse_file(struct vmm_allocation *a);
void kiwi_vmm_reuse_unfile(struct vmm_allocation *a);
/* Under kiwi_vmm_lock: a pending free filed for stream that takes bytes (slab units or a
 * region) on device, still filed; or NULL. */
struct vmm_allocation *kiwi_vmm_reuse_find(const struct vmm_stream *stream, size_t bytes,
                                           CUdevice device);
void kiwi_vmm_reuse_after_fork(void);

/* ---- vmm_shadows.c ----------------------------------------------------------------------- */

/* A host buffer of size bytes as KIWI_VMM_SHADOW asks (pinned: registered huge pages, else
 * the driver's pinned memory; or pageable), in the calling thread's current context; kind
 * SHADOW_NONE when host memory ran out. Slow where it pins: never on the switch path. */
struct vmm_shadow kiwi_vmm_shadow_make(size_t size);
/* A pageable buffer, made at once (what an eviction takes when the builder is behind). */
struct vmm_shadow kiwi_vmm_shadow_pageable(size_t size);
void kiwi_vmm_shadow_free(struct vmm_shadow *shadow);
bool kiwi_vmm_shadow_pinned(const struct vmm_shadow *shadow);

/* ---- vmm_builder.c ----------------------------------------------------------------------- */

/* Starts the builder (once: at the first allocation). */
void kiwi_vmm_builder_start(void);
/* Under kiwi_vmm_lock: the chunks or the budget changed; the builder may have work. */
void kiwi_vmm_shadows_changed(void);
/* A move begins (true, before it takes kiwi_vmm_lock: readers take the last counted figures
 * rather than wait for the lock, and the builder pins nothing more) or ends (false, under
 * kiwi_vmm_lock, once its figures are counted). */
void kiwi_vmm_moving(bool now);
bool kiwi_vmm_move_running(void);
/* Under kiwi_vmm_lock, as a move begins: waits for a pinning or unpinning under way to end. */
void kiwi_vmm_builder_quiet(void);
/* Under kiwi_vmm_lock: a spare shadow of exactly size bytes (or none); a shadow no chunk has,
 * kept for the next chunk of its size or freed. */
struct vmm_shadow kiwi_vmm_spare_take(size_t size);
void kiwi_vmm_spare_put(struct vmm_shadow *shadow);
/* Under kiwi_vmm_lock: the staging ring (SHADOW_NONE until it is pinned), and its slots' size. */
struct vmm_shadow kiwi_vmm_ring(size_t *slot);
/* How many threads copy between the ring and pageable shadows (vmm_staging.c): the builder
 * sizes the ring by it, so it lives here, below both. */
static inline int kiwi_vmm_copiers(void)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    return cpus < 4 ? 1 : cpus / 2 > 8 ? 8 : (int)(cpus / 2);
}
/* Under kiwi_vmm_lock: adds the spares, the ring, the budget and the time pinning took. */
void kiwi_vmm_builder_count(struct kiwi_residency *out);
void kiwi_vmm_builder_after_fork(void);

/* ---- vmm_regions.c ----------------------------------------------------------------------- */

/* The lock around the regions, the placements of allocations and every count the vmm files
 * keep; a move holds it throughout. Taken after the paging lock (memory.c), the contexts' lock
 * (contexts.c) and, by the builder, the captures' (captures.c). The one table of allocations'
 * lock (kiwi_table_lock, memory.c) is taken inside it, never around it: memory.h holds the
 * whole order. */
extern pthread_mutex_t kiwi_vmm_lock;
/* Under kiwi_vmm_lock: the first region (every region follows by next). A variable, so that
 * the builder below reads the list without calling up. */
extern struct vmm_region *kiwi_vmm_first_region;
/* Under kiwi_vmm_lock: whether an eviction moved memory out that is not back yet; while it is,
 * new allocations only reserve their addresses, and the restore backs them. */
extern bool kiwi_vmm_evicted;
/* Whether every chunk is on the card: none away after an eviction, none waiting for room.
 * Written under kiwi_vmm_lock, read without it. */
extern atomic_bool kiwi_vmm_all_backed;
/* Under kiwi_vmm_lock: reserves and (when back, and unless the memory is away) backs a new
 * region, in the list; NULL with *result on failure. */
struct vmm_region *kiwi_vmm_make_region(size_t size, size_t granule, CUcontext ctx,
                                        CUdevice device, bool slab, bool back, CUresult *result);
/* Under kiwi_vmm_lock: takes r off the card and out of the address space, with all it holds
 * (a cached one leaves the cache first: vmm_cache.c). */
void kiwi_vmm_destroy_region(struct vmm_region *r);
/* Under kiwi_vmm_lock: whether every chunk is on the card again (kiwi_vmm_away), after a move,
 * a free or a context's end. */
void kiwi_vmm_recount_backed(void);
void kiwi_vmm_regions_after_fork(void);

/* The side lists (slabs in use, regions kept for reuse) a region is on, by side_next. */
static inline void kiwi_vmm_side_link(struct vmm_region **head, struct vmm_region *r)
{
    r->side_prev = NULL;
    r->side_next = *head;
    if (*head)
        (*head)->side_prev = r;
    *head = r;
}

static inline void kiwi_vmm_side_unlink(struct vmm_region **head, struct vmm_region *r)
{
    if (r->side_prev)
        r->side_prev->side_next = r->side_next;
    else
        *head = r->side_next;
    if (r->side_next)
        r->side_next->side_prev = r->side_prev;
    r->side_next = r->side_prev = NULL;
}

static inline size_t kiwi_vmm_round_up(size_t value, size_t granule)
{
    return (value + granule - 1) / granule * granule;
}

/* ---- vmm_slabs.c ------------------------------------------------------------------------- */

/* Under kiwi_vmm_lock: a slab is in use (new, or out of the cache), or no longer. */
void kiwi_vmm_slabs_add(struct vmm_region *slab);
void kiwi_vmm_slabs_remove(struct vmm_region *slab);
/* count units of a slab from first on are in use, or free again. */
void kiwi_vmm_mark_units(struct vmm_region *slab, size_t first, size_t count, bool used);
/* Under kiwi_vmm_lock: a slab in use of ctx on device with count free units in a row, at
 * *first; NULL when none has. */
struct vmm_region *kiwi_vmm_slab_with_room(size_t count, CUcontext ctx, CUdevice device,
                                           size_t *first);
/* The last unit at or before unit where an allocation starts; unit_count when none. */
size_t kiwi_vmm_slab_start_before(const struct vmm_region *slab, size_t unit);
void kiwi_vmm_slabs_after_fork(void);

/* ---- vmm_cache.c ------------------------------------------------------------------------- */

/* Under kiwi_vmm_lock: a region whose last allocation went: kept for reuse, or destroyed. Its
 * bytes leave the working set and the limit either way. */
void kiwi_vmm_let_go(struct vmm_region *r);
/* Under kiwi_vmm_lock: a region kept for reuse of exactly size bytes on device (a slab, or
 * not), now ctx's; NULL when none. */
struct vmm_region *kiwi_vmm_take_cached(size_t size, CUdevice device, CUcontext ctx, bool slab);
/* Under kiwi_vmm_lock: unmaps and releases the regions kept for reuse (all, or ctx's). */
void kiwi_vmm_trim_cache(void);
void kiwi_vmm_cache_forget(CUcontext ctx);
void kiwi_vmm_cache_after_fork(void);

/* ---- vmm_allocations.c ------------------------------------------------------------------- */

/* The live allocations are kept in the shim's one table (memory.c), each as the placement of
 * its record (memory.h: kiwi_memory_track_placement, _placement, _unplace, _replace and
 * _each_placement), under kiwi_vmm_lock. */
/* Under kiwi_vmm_lock: the memory of an allocation (taken off its record) goes: its units, or
 * its region; and the placement. */
void kiwi_vmm_release(struct vmm_allocation *a);
/* Under kiwi_vmm_lock: r stays where it is from now on (why: for the log). */
void kiwi_vmm_pin(struct vmm_region *r, const char *why);
/* Under kiwi_vmm_lock: ctx ended: its live allocations go (their records stay, for the
 * context's end to forget: interpose/context.c). */
void kiwi_vmm_allocations_forget(CUcontext ctx);

/* ---- vmm_frees.c ------------------------------------------------------------------------- */

/* Under kiwi_vmm_lock: reclaims the pending frees whose memory may go: those whose event has
 * completed, and with synchronized (every context synchronized since) all of them. */
void kiwi_vmm_reclaim(bool synchronized);
/* Under kiwi_vmm_lock: whether any free is pending; waits for every pending free's event and
 * reclaims them (to make room); a pending free taken back (reuse), or ctx's gone with it. */
bool kiwi_vmm_pending(void);
void kiwi_vmm_pending_finish(void);
void kiwi_vmm_unpend(struct vmm_allocation *a);
void kiwi_vmm_pending_forget(CUcontext ctx);
void kiwi_vmm_frees_after_fork(void);

/* ---- vmm_contexts.c, vmm_pools.c, vmm_addresses.c, vmm_residency.c ----------------------- */

/* Under kiwi_vmm_lock: a stream of the vmm evictor's own in ctx, besides the pager's (the two
 * copy engines, one each way, want two streams); NULL when none can be made. */
CUstream kiwi_vmm_second_stream(CUcontext ctx);
/* Under kiwi_vmm_lock: an event of ctx (it must be current), from the spares or new; and back. */
CUevent kiwi_vmm_event_take(CUcontext ctx);
void kiwi_vmm_event_give(CUcontext ctx, CUevent event);
void kiwi_vmm_contexts_forget(CUcontext ctx);
void kiwi_vmm_contexts_after_fork(void);
/* Under kiwi_vmm_lock: a stream-ordered allocation's bytes in use and reserved changed, in the
 * counters of its pool (none: NULL). */
void kiwi_vmm_count_in_pool(CUmemoryPool pool, int64_t used, int64_t reserved);
void kiwi_vmm_pools_after_fork(void);
/* Under kiwi_vmm_lock: the region of the live allocation holding ptr, and the allocation's
 * start and size; NULL when there is none. */
struct vmm_region *kiwi_vmm_allocation_region(CUdeviceptr ptr, CUdeviceptr *base, size_t *size);
/* Under kiwi_vmm_lock: kiwi_vmm_residency's figures (and they become the last counted). */
void kiwi_vmm_residency_locked(struct kiwi_residency *out);

/* ---- vmm_staging.c ----------------------------------------------------------------------- */

/* Under kiwi_vmm_lock, as a move begins: whether the ring is there to copy through. */
bool kiwi_vmm_staging_begin(void);
/* Queue a copy of size bytes between the card and pageable host memory through the ring, on
 * stream (ctx current); return once queued (the bytes land later). */
CUresult kiwi_vmm_stage_out(CUcontext ctx, CUstream stream, CUdeviceptr from, void *to,
                            size_t size);
CUresult kiwi_vmm_stage_in(CUcontext ctx, CUstream stream, const void *from, CUdeviceptr to,
                           size_t size);
/* What a restore from disk does with each block once it is in a cell of the ring, in the move's
 * thread: queues its copies to the card, and says on which stream (of ctx, current) the last of
 * them went, for the event that frees the cell. */
typedef CUresult (*kiwi_vmm_deliver_fn)(void *arg, size_t block, const unsigned char *bytes,
                                        CUcontext *ctx, CUstream *stream);
/* Under kiwi_vmm_lock, in a restore: blocks (in stream order) of file read into the ring's cells,
 * several at once, each delivered as it is in; false with *why when a block could not be read,
 * or *result when a delivery failed (what was queued is done by kiwi_vmm_staging_end). */
bool kiwi_vmm_stage_from_disk(struct kiwi_spill_file *file, const size_t *blocks, size_t count,
                              kiwi_vmm_deliver_fn deliver, void *arg, CUresult *result,
                              char *why, size_t why_size);
/* Waits until every copy staged is done, both halves; false when one failed. */
bool kiwi_vmm_staging_end(void);
/* The bytes the ring's slots hold in all, as the move that began last uses them. */
uint64_t kiwi_vmm_staging_bytes(void);

/* ---- vmm_ipc.c --------------------------------------------------------------------------- */

/* (memory.h declares kiwi_vmm_ipc_export, _import and _close, pager.h its after-fork; it calls
 * vmm_addresses.c and vmm_allocations.c, never the reverse: a region's export is closed with
 * the region, in vmm_regions.c.) */

/* ---- vmm_spill.c ------------------------------------------------------------------------ */

/* The vmm evictor's disk tier (struct kiwi_evictor's tier). */
void kiwi_vmm_tier(enum kiwi_page_direction direction, uint64_t bytes,
                   struct kiwi_transfer *moved);
/* Under kiwi_vmm_lock, as a restore begins: every chunk on disk read back into a shadow; false
 * (moved->failed says why) when one could not be: those stay on disk, nothing is lost. */
bool kiwi_vmm_unspill_locked(struct kiwi_transfer *moved);
/* How a restore reaches a chunk for the disk's way in: its context current, mapped at its
 * address if it is not (waiting for room as the restore does), and the stream its copies go on. */
typedef CUresult (*kiwi_vmm_reach_fn)(void *mover, struct vmm_region *r, int index,
                                      CUstream *stream);
/* Under kiwi_vmm_lock, in a restore with the staging ring: the chunks in file straight to the
 * card, disk -> ring -> GPU, pipelined (vmm_staging.c); *bytes counts what was queued. They keep
 * their file until the restore ends well (kiwi_vmm_spill_forget): a failure leaves them on disk.
 * CUDA_SUCCESS, or the first failure (*why set when it was a read's). */
CUresult kiwi_vmm_unspill_to_card(struct kiwi_spill_file *file, kiwi_vmm_reach_fn reach,
                                  void *mover, uint64_t *bytes, const char **why);
/* Under kiwi_vmm_lock: the chunk goes (its region does), and with it its part of a spill file. */
void kiwi_vmm_spill_forget(struct vmm_chunk *c);

/* ---- vmm_move.c -------------------------------------------------------------------------- */

/* (pager.h declares kiwi_vmm_move.) */

#endif
