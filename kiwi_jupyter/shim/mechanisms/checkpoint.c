/* The checkpoint evictor: nothing is converted. Allocations stay plain device memory, counted
 * all the same, and the daemon suspends the whole process from outside with the driver's
 * checkpoint API when the next holder needs the room; the shim only gates work and talks to
 * the daemon, and moves nothing. Each allocation waits at the gate, since it takes room on a GPU
 * that another holder may be using (and a checkpointed process's driver calls would block in the
 * driver, where no grant could reach them). Not even cuMemAllocManaged gets managed memory: the
 * driver cannot checkpoint a process that has any (r570).
 *
 * Plain device memory is also what the other evictors fall back to where the driver refuses
 * theirs during a graph capture (kiwi_device_allocate).
 */
#define _GNU_SOURCE
#include "memory.h"
#include "pager.h"

bool kiwi_capture_error(CUresult result)
{
    return result >= 900 && result <= 908; /* CUDA_ERROR_STREAM_CAPTURE_* */
}

CUresult kiwi_device_allocate(CUdeviceptr *dptr, size_t size, CUcontext ctx, CUdevice device,
                              bool gated)
{
    typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
    alloc_fn device_alloc = (alloc_fn)kiwi_real(HOOK_cuMemAlloc_v2);
    if (!device_alloc)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!kiwi_memory_reserve(size, DEVICE, device))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult result = gated ? kiwi_gate_enter() : CUDA_SUCCESS;
    if (result == CUDA_SUCCESS) {
        result = device_alloc(dptr, size);
        if (gated)
            kiwi_gate_exit();
    }
    if (result != CUDA_SUCCESS) {
        kiwi_memory_unreserve(size, DEVICE);
        return result;
    }
    kiwi_memory_track(*dptr, size, DEVICE, ctx, device, false);
    return CUDA_SUCCESS;
}

CUresult kiwi_device_allocate_instead(CUdeviceptr *dptr, size_t size, CUcontext ctx,
                                      CUdevice device, CUresult refused)
{
    CUresult result = kiwi_device_allocate(dptr, size, ctx, device, false);
    if (result == CUDA_SUCCESS)
        kiwi_log("device allocation of %zu bytes during graph capture", size);
    return result == CUDA_ERROR_OUT_OF_MEMORY ? refused : result;
}

static CUresult allocate(CUdeviceptr *dptr, size_t size, CUcontext ctx, CUdevice device,
                         const struct kiwi_stream_order *order)
{
    (void)order;
    return kiwi_device_allocate(dptr, size, ctx, device, true);
}

static CUresult allocate_managed(CUdeviceptr *dptr, size_t size, unsigned int flags,
                                 CUcontext ctx, CUdevice device)
{
    (void)flags;
    return kiwi_device_allocate(dptr, size, ctx, device, true);
}

const struct kiwi_evictor kiwi_checkpoint_evictor = {
    .name = "checkpoint",
    .allocate = allocate,
    .allocate_managed = allocate_managed,
    /* what was allocated, all of it on the card: the daemon tells where it is */
    .residency = kiwi_managed_residency,
    .moved_from_outside = true,
    .cell_asks_when_evicted = true,
};
