/* What the memory files share, and nothing else of the shim needs (shim.h declares what the
 * others call):
 *
 *   memory.c      the table of allocations: the working set, and the ranges the pager moves
 *   limit.c       the memory limit, and the room on the GPU, reserved against before allocating
 *   alloc.c       the allocation entry points: device memory becomes managed memory
 *   alloc_async.c stream-ordered allocations
 *   free.c        the free entry points, and frees deferred while a graph is being captured
 */
#ifndef KIWI_MEMORY_H
#define KIWI_MEMORY_H

#include "shim.h"

/* MANAGED can be paged out; VMM (cuMemCreate) and DEVICE (plain device memory, where managed
 * memory was refused) cannot. */
enum allocation_kind { MANAGED, VMM, DEVICE };

struct allocation {
    struct allocation *next;
    uint64_t key; /* device pointer, or VMM handle */
    size_t size;
    enum allocation_kind kind;
    bool freeing; /* a free of it is in progress: the pager leaves it alone */
    bool pooled;  /* from a managed memory pool (pool.c): freed in stream order */
    CUcontext ctx;
    CUdevice device;
};

/* The locks around the table (memory.c says how they are used), and what it counts. */
extern pthread_mutex_t kiwi_table_lock;
extern pthread_rwlock_t kiwi_paging_lock;
extern uint64_t kiwi_managed_bytes, kiwi_vmm_bytes; /* under kiwi_table_lock */

/* ---- memory.c ---------------------------------------------------------------------------- */

void kiwi_memory_track(uint64_t key, size_t size, enum allocation_kind kind, CUcontext ctx,
                       CUdevice device, bool pooled);
/* A free in two halves: around the driver's call. */
struct allocation *kiwi_memory_begin_free(uint64_t key, enum allocation_kind kind,
                                          enum allocation_kind or_kind);
void kiwi_memory_end_free(struct allocation *a, CUresult result);

/* ---- limit.c ----------------------------------------------------------------------------- */

bool kiwi_memory_reserve(size_t size, enum allocation_kind kind, CUdevice device);
void kiwi_memory_unreserve(size_t size, enum allocation_kind kind);

/* ---- alloc.c ----------------------------------------------------------------------------- */

CUresult kiwi_memory_allocate_managed(CUdeviceptr *dptr, size_t size, unsigned int flags);

/* ---- alloc_async.c ----------------------------------------------------------------------- */

/* Is the stream being captured into a CUDA graph? */
bool kiwi_memory_capturing(CUstream stream);

/* ---- free.c ------------------------------------------------------------------------------ */

/* A forked child: no free of its parent's is waiting for a release. */
void kiwi_memory_deferred_after_fork(void);

#endif
