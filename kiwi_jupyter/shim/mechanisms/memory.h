/* The table of allocations, entry by entry: for the entry points that allocate and free
 * (interpose/alloc.c, alloc_async.c, free.c), and for memory.c and limit.c, which share its
 * locks and counts. shim.h declares what the rest of the shim reads of it.
 *
 * It is the shim's one table of allocations: every allocation the interposer sees has one
 * record here, keyed by its address (or VMM handle), whatever evictor made it. The vmm
 * evictor's own facts of an allocation (where it is placed: its region or slab units, its pool,
 * buffer id, a pending free's event) hang off its record as its placement (struct
 * vmm_allocation, vmm.h); the vmm files keep no table of their own and find an allocation by
 * its record (kiwi_memory_placement). One lock, kiwi_table_lock, guards the records and the
 * figures counted from them; a placement is attached and taken off with kiwi_vmm_lock held
 * too, so either lock is enough to read it.
 *
 * The locks, in the order they are taken (never the reverse):
 *   the paging lock (memory.c) -> the contexts' (contexts.c), the captures' (captures.c)
 *   -> kiwi_vmm_lock (vmm_regions.c) -> kiwi_table_lock (memory.c)
 * kiwi_table_lock is innermost: nothing is called with it held that takes another lock.
 */
#ifndef KIWI_MEMORY_H
#define KIWI_MEMORY_H

#include "../shim.h"

/* MANAGED (the managed evictor's) and MAPPED (the vmm evictor's: physical memory the shim maps
 * itself, vmm.c) can be paged out; VMM (the application's own cuMemCreate handles) and DEVICE
 * (plain device memory: the checkpoint evictor's, or where the others were refused) cannot. */
enum allocation_kind { MANAGED, VMM, DEVICE, MAPPED };
#define KIND(kind) (1u << (kind))

struct vmm_allocation;

struct allocation {
    struct allocation *next;
    uint64_t key; /* device pointer, or VMM handle */
    size_t size;
    enum allocation_kind kind;
    bool freeing; /* a free of it is in progress: the pager leaves it alone */
    bool pooled;  /* from a managed memory pool (pools.c): freed in stream order */
    bool pinned;  /* MAPPED memory that must stay where it is (a handle of it was retained:
                     vmm_allocations.c): counted, not evictable */
    CUcontext ctx;
    CUdevice device;
    /* MAPPED: the vmm evictor's placement of it (vmm.h); NULL once the vmm evictor took it back
     * (a free under way, or its context ended). Written under kiwi_vmm_lock and
     * kiwi_table_lock both. */
    struct vmm_allocation *placement;
};

/* ---- memory.c ---------------------------------------------------------------------------- */

void kiwi_memory_track(uint64_t key, size_t size, enum allocation_kind kind, CUcontext ctx,
                       CUdevice device, bool pooled);
/* A free in two halves, around the driver's call (for memory the pager moves, itself inside
 * kiwi_memory_free_begin and kiwi_memory_free_end): the record of key, of one of the kinds
 * (KIND(MANAGED) | KIND(DEVICE), ...), marked as being freed; NULL when the shim never saw it. */
struct allocation *kiwi_memory_begin_free(uint64_t key, unsigned kinds);
void kiwi_memory_end_free(struct allocation *a, CUresult result);
/* A free of managed memory that must wait for the next release (its stream is being captured
 * into a graph): kept, and done by kiwi_memory_free_deferred. False when no more can wait. */
bool kiwi_memory_defer_free(CUdeviceptr dptr);

/* The vmm evictor's side of the table, all under kiwi_vmm_lock (memory.c takes
 * kiwi_table_lock inside it). track_placement: a new MAPPED record at key carrying placement
 * (false: out of host memory, and nothing recorded). placement: that of the MAPPED allocation
 * at key (one being freed too), or NULL. unplace: record's placement, taken off it for its free
 * (NULL when it has none, or the record went with its context); replace: put back on it (a free
 * that failed; false when the record went). each_placement: visit called, with
 * kiwi_table_lock held, for every MAPPED record with a placement; it may pin the record or take
 * its placement off, and must call nothing that locks. */
bool kiwi_memory_track_placement(uint64_t key, size_t size, CUcontext ctx, CUdevice device,
                                 struct vmm_allocation *placement);
struct vmm_allocation *kiwi_memory_placement(uint64_t key);
struct vmm_allocation *kiwi_memory_unplace(struct allocation *record);
bool kiwi_memory_replace(struct allocation *record, struct vmm_allocation *placement);
void kiwi_memory_each_placement(void (*visit)(struct allocation *record, void *arg), void *arg);
/* MAPPED allocations are counted by what they take on the card, not by the bytes asked for: the
 * vmm evictor reserves each region (one allocation's, or a slab of small ones: whole granules)
 * with kiwi_memory_reserve(..., MAPPED) as it takes it, and gives it back with
 * kiwi_memory_unreserve as it lets it go; their records count no bytes. Of those bytes, the
 * ones pinned in place changed by bytes: */
void kiwi_memory_pinned(int64_t bytes);

/* The lock around the table and the figures (the one lock for them: the order of the locks is
 * at the top of this file; memory.c says how they are used), and what it counts. */
extern pthread_mutex_t kiwi_table_lock;
/* Under kiwi_table_lock: bytes by kind (kiwi_vmm_bytes: VMM and DEVICE), and of the MAPPED
 * bytes those pinned in place. */
extern uint64_t kiwi_managed_bytes, kiwi_vmm_bytes, kiwi_mapped_bytes, kiwi_pinned_bytes;

/* Under kiwi_table_lock: the count a kind's bytes are in. */
static inline uint64_t *kiwi_bytes_of(enum allocation_kind kind)
{
    return kind == MANAGED ? &kiwi_managed_bytes : kind == MAPPED ? &kiwi_mapped_bytes
                                                                  : &kiwi_vmm_bytes;
}

/* ---- limit.c ----------------------------------------------------------------------------- */

/* Reserves size bytes against the limit before the driver is asked for them. */
bool kiwi_memory_reserve(size_t size, enum allocation_kind kind, CUdevice device);
void kiwi_memory_unreserve(size_t size, enum allocation_kind kind);

/* ---- vmm.c, vmm_frees.c, vmm_addresses.c, vmm_pools.c: for the entry points -------------- */

/* What a stream-ordered allocation (cuMemAllocAsync, cuMemAllocFromPoolAsync) was asked with:
 * its pool, for the pool's counters (NULL when the device's could not be learnt), and its
 * stream, whose own earlier frees it may reuse at once. */
struct kiwi_stream_order {
    CUmemoryPool pool;
    CUstream stream;
};

/* Where a new vmm allocation's memory is: on the card; away with the rest of the memory (an
 * eviction's, which the restore on the next grant backs); or waiting for room (the card is full:
 * the caller waits for the daemon to make room, room_wait.c). */
enum kiwi_vmm_backing { KIWI_VMM_BACKED, KIWI_VMM_AWAY, KIWI_VMM_WAITS };

/* size bytes of device memory the shim maps itself, in ctx on device (the card's bytes it
 * takes reserved against the limit as MAPPED, whole regions: kiwi_memory_pinned says how);
 * order: a stream-ordered allocation's (NULL for the others). CUDA_ERROR_OUT_OF_MEMORY past the
 * limit, or when the card has no room unless may_wait: then only the addresses (KIWI_VMM_WAITS:
 * the caller waits for room); a capture error when the driver refuses to map during a graph
 * capture (the caller falls back). *backing: where its memory is. */
CUresult kiwi_vmm_allocate(CUdeviceptr *dptr, size_t size, CUcontext ctx, CUdevice device,
                           const struct kiwi_stream_order *order, bool may_wait,
                           enum kiwi_vmm_backing *backing);
/* Frees a MAPPED allocation (a.key), whose record the caller holds (kiwi_memory_begin_free):
 * synchronizes its context first, since work queued before the free may still use it; while a
 * graph capture is open it cannot, and the free waits for the next release instead. Ends the
 * record's free (kiwi_memory_end_free) itself, when the memory is freed or will be. */
CUresult kiwi_vmm_free(struct allocation *a);
/* A stream-ordered free of a MAPPED allocation: an event on stream marks when its memory may be
 * unmapped (reclaimed at later allocations, frees and evictions); under graph capture on the
 * stream, at the next release. Ends the record's free itself. */
CUresult kiwi_vmm_free_async(struct allocation *a, CUstream stream, bool capturing);
/* The current context enabled peer access to peer's memory (cuCtxEnablePeerAccess): every
 * mapping on peer's device becomes accessible from the current one, now and at each restore. */
void kiwi_vmm_peer_enabled(CUcontext peer);
/* Is ptr inside memory the vmm evictor maps? */
bool kiwi_vmm_owns(CUdeviceptr ptr);
/* What the driver would have said of an address inside an allocation the vmm evictor maps, had
 * the allocation been the one the program asked for: the allocation's own start and size (never
 * its chunk's or its slab's), context (none for a stream-ordered allocation, which belongs to no
 * context, as the driver's pool memory does not), device and pool, an id of its own for its life
 * (never a mapping's, which changes at each restore), SYNC_MEMOPS as the program set it; and
 * whether any of it is away (evicted, or reserved while evicted). */
struct kiwi_vmm_facts {
    CUdeviceptr base;
    size_t size;
    CUcontext ctx;
    CUdevice device;
    CUmemoryPool pool;
    uint64_t buffer_id;
    bool stream_ordered;
    bool sync_memops;
    bool away;
};
/* False when ptr is not inside a live allocation the vmm evictor maps. */
bool kiwi_vmm_facts(CUdeviceptr ptr, struct kiwi_vmm_facts *out);
/* CU_POINTER_ATTRIBUTE_SYNC_MEMOPS of the allocation at ptr; false when it is none of these. */
bool kiwi_vmm_set_sync_memops(CUdeviceptr ptr, bool on);
/* A handle of the memory in [ptr, ptr + size) was handed out (cuMemRetainAllocationHandle: for
 * an export, an NCCL registration; a dma-buf of cuMemGetHandleForAddressRange): from now on
 * the regions there stay where they are, pinned and not evictable. */
void kiwi_vmm_retained(CUdeviceptr ptr, size_t size);
/* Is any of [ptr, ptr + size) memory the vmm evictor moved off the card (or reserved while its
 * memory was away)? */
bool kiwi_vmm_away_in(CUdeviceptr ptr, size_t size);
/* Legacy IPC of the memory the vmm evictor maps (vmm_ipc.c). export: a handle of the shim's for
 * the allocation holding ptr, its region exported and pinned from now on; CUDA_ERROR_NOT_READY
 * while the region is away (the caller waits at the gate, then asks again). import: the address
 * here of the allocation a handle of the shim's names (the same for each open of one handle);
 * CUDA_ERROR_NOT_FOUND for a handle that is not the shim's (the driver's own). close: the last
 * close of an address import answered unmaps it; CUDA_ERROR_NOT_FOUND when it answered none. */
CUresult kiwi_vmm_ipc_export(CUdeviceptr ptr, CUipcMemHandle *handle);
CUresult kiwi_vmm_ipc_import(const CUipcMemHandle *handle, CUdeviceptr *ptr);
CUresult kiwi_vmm_ipc_close(CUdeviceptr ptr);
/* The pool's counters, for cuMemPoolGetAttribute: bytes of stream-ordered allocations the vmm
 * evictor made for pool, in use now and at most, and reserved (in use, or freed and not yet
 * reclaimed); false when it made none for it. reset: set the high marks to the current. */
bool kiwi_vmm_pool_attribute(CUmemoryPool pool, int attribute, uint64_t *value);
bool kiwi_vmm_pool_reset(CUmemoryPool pool, int attribute);

#endif
