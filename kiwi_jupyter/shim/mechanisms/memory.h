/* The table of allocations, entry by entry: for the entry points that allocate and free
 * (interpose/alloc.c, alloc_async.c, free.c), and for memory.c and limit.c, which share its
 * locks and counts. shim.h declares what the rest of the shim reads of it.
 */
#ifndef KIWI_MEMORY_H
#define KIWI_MEMORY_H

#include "../shim.h"

/* MANAGED can be paged out; VMM (cuMemCreate) and DEVICE (plain device memory, where managed
 * memory was refused) cannot. */
enum allocation_kind { MANAGED, VMM, DEVICE };

struct allocation {
    struct allocation *next;
    uint64_t key; /* device pointer, or VMM handle */
    size_t size;
    enum allocation_kind kind;
    bool freeing; /* a free of it is in progress: the pager leaves it alone */
    bool pooled;  /* from a managed memory pool (pools.c): freed in stream order */
    CUcontext ctx;
    CUdevice device;
};

/* ---- memory.c ---------------------------------------------------------------------------- */

void kiwi_memory_track(uint64_t key, size_t size, enum allocation_kind kind, CUcontext ctx,
                       CUdevice device, bool pooled);
/* A free in two halves, around the driver's call (for memory the pager moves, itself inside
 * kiwi_memory_free_begin and kiwi_memory_free_end). */
struct allocation *kiwi_memory_begin_free(uint64_t key, enum allocation_kind kind,
                                          enum allocation_kind or_kind);
void kiwi_memory_end_free(struct allocation *a, CUresult result);
/* A free of managed memory that must wait for the next release (its stream is being captured
 * into a graph): kept, and done by kiwi_memory_free_deferred. False when no more can wait. */
bool kiwi_memory_defer_free(CUdeviceptr dptr);

/* The locks around the table (memory.c says how they are used), and what it counts. */
extern pthread_mutex_t kiwi_table_lock;
extern uint64_t kiwi_managed_bytes, kiwi_vmm_bytes; /* under kiwi_table_lock */

/* ---- limit.c ----------------------------------------------------------------------------- */

/* Reserves size bytes against the limit before the driver is asked for them. */
bool kiwi_memory_reserve(size_t size, enum allocation_kind kind, CUdevice device);
void kiwi_memory_unreserve(size_t size, enum allocation_kind kind);

#endif
