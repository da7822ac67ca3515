/* The table of allocations, entry by entry: for the entry points that allocate and free
 * (interpose/alloc.c, alloc_async.c, free.c), and for memory.c and limit.c, which share its
 * locks and counts. shim.h declares what the rest of the shim reads of it.
 */
#ifndef KIWI_MEMORY_H
#define KIWI_MEMORY_H

#include "../shim.h"

/* MANAGED (the managed evictor's) and MAPPED (the vmm evictor's: physical memory the shim maps
 * itself, vmm.c) can be paged out; VMM (the application's own cuMemCreate handles) and DEVICE
 * (plain device memory: the checkpoint evictor's, or where the others were refused) cannot. */
enum allocation_kind { MANAGED, VMM, DEVICE, MAPPED };
#define KIND(kind) (1u << (kind))

struct allocation {
    struct allocation *next;
    uint64_t key; /* device pointer, or VMM handle */
    size_t size;
    enum allocation_kind kind;
    bool freeing; /* a free of it is in progress: the pager leaves it alone */
    bool pooled;  /* from a managed memory pool (pools.c): freed in stream order */
    bool pinned;  /* MAPPED memory that must stay where it is (a handle of it was retained:
                     vmm.c): counted, not evictable */
    CUcontext ctx;
    CUdevice device;
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

/* The MAPPED allocation at key stays where it is from now on: not evictable. */
void kiwi_memory_pin(uint64_t key);

/* The locks around the table (memory.c says how they are used), and what it counts. */
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

/* ---- vmm.c: the vmm evictor's allocations, for the allocating entry points --------------- */

/* Where a new vmm allocation's memory is: on the card; away with the rest of the memory (an
 * eviction's, which the restore on the next grant backs); or waiting for room (the card is full:
 * the caller waits for the daemon to make room, room_wait.c). */
enum kiwi_vmm_backing { KIWI_VMM_BACKED, KIWI_VMM_AWAY, KIWI_VMM_WAITS };

/* size bytes of device memory the shim maps itself, in ctx on device (already reserved against
 * the limit as MAPPED); pool: the pool a stream-ordered allocation came from, for its counters
 * (NULL for the others). CUDA_ERROR_OUT_OF_MEMORY when the card has no room, unless may_wait:
 * then only the addresses (KIWI_VMM_WAITS: the caller waits for room); a capture error when the
 * driver refuses to map during a graph capture (the caller falls back). *backing: where its
 * memory is. */
CUresult kiwi_vmm_allocate(CUdeviceptr *dptr, size_t size, CUcontext ctx, CUdevice device,
                           CUmemoryPool pool, bool may_wait, enum kiwi_vmm_backing *backing);
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
/* A handle of the memory at ptr was handed out (cuMemRetainAllocationHandle: for an export,
 * an NCCL registration): from now on it stays where it is, pinned and not evictable. */
void kiwi_vmm_retained(CUdeviceptr ptr);
/* The pool's counters, for cuMemPoolGetAttribute: bytes of stream-ordered allocations the vmm
 * evictor made for pool, in use now and at most, and reserved (in use, or freed and not yet
 * reclaimed); false when it made none for it. reset: set the high marks to the current. */
bool kiwi_vmm_pool_attribute(CUmemoryPool pool, int attribute, uint64_t *value);
bool kiwi_vmm_pool_reset(CUmemoryPool pool, int attribute);

#endif
