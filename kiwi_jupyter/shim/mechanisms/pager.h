/* What the pager's files share, and nothing else of the shim needs (shim.h declares what the
 * others call). The pager is one module behind one entry, kiwi_pager_move; its files call one
 * another only downwards, in this order:
 *
 *   pager.c       the entry: which evictor runs, and each move handed to it
 *   managed.c     the managed evictor: its allocations, and the working set moved by
 *                 prefetch, context by context
 *   checkpoint.c  the checkpoint evictor: plain device memory, which the others fall back to
 *   transfer.c    one context's share of a move: its ranges prefetched, in one batch where the
 *                 driver can, and its free ranges discarded
 *   copy_out.c    KIWI_EVICT_COPY: live ranges copied to host buffers and discarded instead of
 *                 prefetched to the host, and copied back after the restore's prefetch
 *   free_ranges.c what the framework's cache holds free: discarded, not copied, on eviction
 *   contexts.c    the contexts the pager knows, and the driver functions it calls
 *
 * The vmm evictor (vmm_evictor.c, and vmm.h: the files behind it) sits beside managed.c; the
 * pager reaches each evictor only through its table of operations (struct kiwi_evictor).
 */
#ifndef KIWI_PAGER_H
#define KIWI_PAGER_H

#include "../shim.h"

struct context {
    CUcontext ctx;
    CUdevice device;
    CUstream stream; /* the pager's own, created on first use */
};

typedef CUresult (*ctx_get_fn)(CUcontext *);
typedef CUresult (*ctx_set_fn)(CUcontext);
typedef CUresult (*ctx_device_fn)(CUdevice *);
typedef CUresult (*sync_fn)(void);
typedef CUresult (*stream_create_fn)(CUstream *, unsigned int);
typedef CUresult (*stream_sync_fn)(CUstream);
typedef CUresult (*prefetch_fn)(CUdeviceptr, size_t, CUdevice, CUstream);
/* CUDA 12.2 added cuMemPrefetchAsync_v2, which names the destination with a CUmemLocation;
 * CUDA 13 headers map cuMemPrefetchAsync to it. The driver exports both (the CUDA 13 runtime
 * still asks for v1 by version 8000); v1 is preferred. */
typedef CUresult (*prefetch_v2_fn)(CUdeviceptr, size_t, CUmemLocation, unsigned int, CUstream);
/* CUDA 13: many ranges in one call, one driver round trip for the whole working set. */
typedef CUresult (*prefetch_batch_fn)(CUdeviceptr *, size_t *, size_t, CUmemLocation *, size_t *,
                                      size_t, unsigned long long, CUstream);
/* CUDA 13: drops the pages of many ranges at once; their contents become undefined. */
typedef CUresult (*discard_batch_fn)(CUdeviceptr *, size_t *, size_t, unsigned long long, CUstream);

typedef CUresult (*copy_to_host_fn)(void *, CUdeviceptr, size_t, CUstream);
typedef CUresult (*copy_to_device_fn)(CUdeviceptr, const void *, size_t, CUstream);
typedef CUresult (*host_alloc_fn)(void **, size_t);
typedef CUresult (*host_free_fn)(void *);

/* The driver functions the pager calls: contexts.c resolves them on first use. */
struct pager_driver {
    ctx_get_fn ctx_get;
    ctx_set_fn ctx_set;
    ctx_device_fn ctx_device;
    sync_fn ctx_sync;
    stream_create_fn stream_create;
    stream_sync_fn stream_sync;
    prefetch_fn prefetch;
    prefetch_v2_fn prefetch_v2;
    prefetch_batch_fn prefetch_batch;
    discard_batch_fn discard_batch;
    copy_to_host_fn copy_to_host;     /* cuMemcpyDtoHAsync_v2 */
    copy_to_device_fn copy_to_device; /* cuMemcpyHtoDAsync_v2 */
    host_alloc_fn host_alloc;         /* cuMemAllocHost_v2 */
    host_free_fn host_free;           /* cuMemFreeHost */
};
extern struct pager_driver kiwi_pager_driver;

struct move {
    bool to_host;
    uint64_t bytes;
    uint64_t discarded;
    uint64_t copied_back; /* KIWI_EVICT_COPY: bytes written back from host buffers */
    int failures;
};

/* ---- contexts.c -------------------------------------------------------------------------- */

/* Resolves the pager's driver functions (on first use, and again until a driver is loaded);
 * false while none is. */
bool kiwi_pager_resolve(void);
/* The contexts the pager knows, locked: a move or a context's end holds the lock throughout.
 * The paging lock (memory.c) is always taken first. */
struct context *kiwi_contexts_lock(int *count);
void kiwi_contexts_unlock(void);
/* Under the contexts' lock: forgets ctx (its stream went with it). */
void kiwi_contexts_remove(CUcontext ctx);
void kiwi_contexts_after_fork(void);

/* ---- the evictors: managed.c, vmm_evictor.c, checkpoint.c -------------------------------- */

extern const struct kiwi_evictor kiwi_managed_evictor, kiwi_vmm_evictor, kiwi_checkpoint_evictor;

/* Plain device memory, counted and not evictable: the checkpoint evictor's allocations, and
 * the others' where the driver refuses theirs during a graph capture. gated: it waits at the
 * gate, since it takes room on a GPU another holder may be using. */
CUresult kiwi_device_allocate(CUdeviceptr *dptr, size_t size, CUcontext ctx, CUdevice device,
                              bool gated);
/* Whether a result is CUDA_ERROR_STREAM_CAPTURE_*: the driver refuses during a graph capture.
 * Then an allocation becomes device memory, counted but not evictable, rather than fail (its
 * refusal is the result where even that finds no room). */
bool kiwi_capture_error(CUresult result);
CUresult kiwi_device_allocate_instead(CUdeviceptr *dptr, size_t size, CUcontext ctx,
                                      CUdevice device, CUresult refused);

/* Moves the managed working set: every managed allocation the table holds, in every context
 * the pager knows, by prefetch (or KIWI_EVICT_COPY's copies), skipping the free ranges. */
void kiwi_managed_move(enum kiwi_page_direction direction, struct kiwi_transfer *moved);
/* The managed evictor's move (kiwi_managed_move, and what it moved out is in host memory until
 * the way in), and its residency: the table's bytes, less those. Every evictor that does not
 * count its own takes these. */
void kiwi_managed_page(enum kiwi_page_direction direction, struct kiwi_transfer *moved);
void kiwi_managed_residency(struct kiwi_residency *out);
/* cuMemAllocManaged's allocation: managed memory (device memory during a graph capture). */
CUresult kiwi_managed_allocate(CUdeviceptr *dptr, size_t size, unsigned int flags,
                               CUcontext ctx, CUdevice device);

/* ---- the vmm evictor's files (vmm.h), for vmm_evictor.c ---------------------------------- */

/* Moves the memory the vmm evictor maps: out, each chunk copied to its host shadow and taken
 * off the card as its copy completes; in, each mapped again at its address and copied back, or
 * nothing at all when the card has no room (moved->failed says why). */
void kiwi_vmm_move(enum kiwi_page_direction direction, struct kiwi_transfer *moved);
void kiwi_vmm_residency(struct kiwi_residency *out);
/* Whether memory is not on the card: an eviction's, still away, or an allocation's that waits
 * for room; never waits for a move. */
bool kiwi_vmm_away(void);
/* Whether any memory it maps could leave the card (in use or kept for reuse, not pinned). */
bool kiwi_vmm_movable(void);
/* After every context was synchronized: the frees that waited for it are done. */
void kiwi_vmm_free_deferred(void);
/* Under the contexts' lock: ctx ended; the memory allocated in it goes. */
void kiwi_vmm_forget_context(CUcontext ctx);
/* The daemon's pin budget: what the builder may keep pinned from now on (vmm_builder.c). */
void kiwi_vmm_pin_budget(uint64_t bytes);
void kiwi_vmm_after_fork(void);
/* vmm_ipc.c: what the parent opened of other processes' memory is not the child's. */
void kiwi_vmm_ipc_after_fork(void);

/* ---- transfer.c -------------------------------------------------------------------------- */

/* Moves the live ranges of one context: in one batch where the driver can, else one by one;
 * on the way out, discards its free ranges first. Returns how many live ranges are its. */
size_t kiwi_pager_move_context(struct context *c, const struct kiwi_range *ranges, size_t count,
                               const struct kiwi_range *free_ranges, size_t free_count,
                               struct move *move);

/* ---- copy_out.c -------------------------------------------------------------------------- */

/* KIWI_EVICT_COPY is set, and the driver copies asynchronously (the caller knows whether it
 * can discard, which the way out needs too). */
bool kiwi_copy_out_usable(void);
/* Queues a copy of each of c's live ranges into a host buffer of its own on c's stream (a spare
 * of the same size from an earlier eviction where there is one; spares left over are freed);
 * marks copied[i] for each one queued. Returns how many. */
size_t kiwi_copy_out(struct context *c, const struct kiwi_range *ranges, size_t count,
                     bool *copied, struct move *move);
/* Forgets c's copies (their stream must have been synchronized): the discard failed. */
void kiwi_copy_out_undo(CUcontext ctx);
/* After the restore's prefetch on c's stream: queues each saved copy back into its range, if
 * that range is still allocated as it was. */
void kiwi_copy_back(struct context *c, const struct kiwi_range *ranges, size_t count,
                    struct move *move);
/* After the streams' synchronize: every buffer becomes a spare for the next eviction. */
void kiwi_copy_back_done(void);
/* c's context ended: its copies and spares are forgotten (pinned ones went with it). */
void kiwi_copy_forget_context(CUcontext ctx);
/* In a forked child: the parent's copies are not its own. */
void kiwi_copy_after_fork(void);

/* ---- free_ranges.c ----------------------------------------------------------------------- */

/* In ranges sorted by address, the index of the first that starts after ptr (count when none
 * does): the one before it, if any, is the last that starts at or before ptr. */
size_t kiwi_ranges_after(const struct kiwi_range *ranges, size_t count, CUdeviceptr ptr);
/* Ranges cut into pieces, the live ones first (*live of them), then the free ones; returns the
 * number of pieces, or 0 (and no copy) when no free range is believed. */
size_t kiwi_free_ranges_split(const struct kiwi_range *ranges, size_t count,
                              struct kiwi_range **pieces, size_t *live);
void kiwi_free_ranges_after_fork(void);

#endif
