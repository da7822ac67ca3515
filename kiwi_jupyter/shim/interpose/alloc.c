/* GPU memory: allocations become memory the shim can page out, as the evictor chosen pages it
 * (mechanisms/pager.c).
 *
 * Under the vmm evictor a device allocation becomes physical memory the shim maps itself at
 * addresses it reserved (mechanisms/vmm.c): device memory to the process in every way, that an
 * eviction can take off the card and a restore put back at the same addresses. Managed memory
 * the program asks for itself stays managed.
 *
 * Under the managed evictor it becomes managed memory (cuMemAllocManaged): its pages can live
 * on the GPU or in host memory, and the pager moves them with prefetches when the GPU changes
 * hands. A device pointer to managed memory works everywhere a device pointer does, so the
 * process cannot tell the difference.
 *
 * Under the checkpoint evictor (mechanisms/pager.c) nothing is converted: allocations stay
 * device memory, counted all the same, and each waits at the gate, since it takes room on a GPU
 * that another holder may be using (and a checkpointed process's driver calls would block in
 * the driver, where no grant could reach them).
 */
#define _GNU_SOURCE

#include "interpose.h"

static bool capture_error(CUresult result)
{
    return result >= 900 && result <= 908; /* CUDA_ERROR_STREAM_CAPTURE_* */
}

static void track(uint64_t key, size_t size, enum allocation_kind kind, CUcontext ctx,
                  CUdevice device)
{
    kiwi_memory_track(key, size, kind, ctx, device, false);
}

typedef CUresult (*alloc_managed_fn)(CUdeviceptr *, size_t, unsigned int);

/* Allocates size bytes of plain device memory, counted (not evictable by the shim). */
static CUresult allocate_device(CUdeviceptr *dptr, size_t size, CUcontext ctx, CUdevice device)
{
    typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
    alloc_fn device_alloc = (alloc_fn)kiwi_real(HOOK_cuMemAlloc_v2);
    if (!device_alloc)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!kiwi_memory_reserve(size, DEVICE, device))
        return CUDA_ERROR_OUT_OF_MEMORY;
    bool gated = kiwi_pager_checkpointing();
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
    track(*dptr, size, DEVICE, ctx, device);
    return CUDA_SUCCESS;
}

/* An allocation that waited for room and got none goes, as the program's own free would take
 * it. */
static void give_back(CUdeviceptr ptr)
{
    kiwi_memory_free_begin();
    struct allocation *record = kiwi_memory_begin_free(ptr, KIND(MAPPED));
    if (record)
        kiwi_vmm_free(record);
    kiwi_memory_free_end();
}

/* Allocates size bytes the vmm evictor maps, within the limit (which it checks itself: what
 * counts is the card's bytes it takes, whole granules, not size). On a card that is full, the
 * allocation waits for the daemon to make room (mechanisms/room_wait.c): the room an idle
 * process holds is never a reason to fail; past the limit no eviction makes the room. */
static CUresult allocate_mapped(CUdeviceptr *dptr, size_t size, CUcontext ctx, CUdevice device,
                                const struct kiwi_stream_order *order)
{
    enum kiwi_vmm_backing backing = KIWI_VMM_BACKED;
    CUresult result = kiwi_vmm_allocate(dptr, size, ctx, device, order, false, &backing);
    if (result == CUDA_ERROR_OUT_OF_MEMORY && kiwi_room_may_wait(size))
        result = kiwi_vmm_allocate(dptr, size, ctx, device, order, true, &backing);
    if (capture_error(result)) {
        /* The driver refuses to map during this graph capture: device memory, counted but
         * not evictable, rather than a failed allocation (as for managed memory, below). */
        CUresult fallback = allocate_device(dptr, size, ctx, device);
        if (fallback == CUDA_SUCCESS)
            kiwi_log("device allocation of %zu bytes during graph capture", size);
        return fallback == CUDA_ERROR_OUT_OF_MEMORY ? result : fallback;
    }
    if (result != CUDA_SUCCESS)
        return result;
    kiwi_memory_track(*dptr, size, MAPPED, ctx, device, false); /* the working set grows */
    if (backing != KIWI_VMM_WAITS)
        return CUDA_SUCCESS;
    result = kiwi_room_wait(size);
    if (result != CUDA_SUCCESS)
        give_back(*dptr);
    return result;
}

/* Managed memory of size bytes in ctx, within the limit. */
static CUresult allocate_managed(CUdeviceptr *dptr, size_t size, unsigned int flags,
                                 CUcontext ctx, CUdevice device)
{
    alloc_managed_fn real = (alloc_managed_fn)kiwi_real(HOOK_cuMemAllocManaged);
    if (!real)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!kiwi_memory_reserve(size, MANAGED, device))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult result = real(dptr, size, flags);
    if (capture_error(result)) {
        /* The driver refuses managed memory while a graph is being captured: give the caller
         * device memory, counted but not evictable, rather than fail its allocation. */
        kiwi_memory_unreserve(size, MANAGED);
        CUresult fallback = allocate_device(dptr, size, ctx, device);
        if (fallback == CUDA_SUCCESS)
            kiwi_log("device allocation of %zu bytes during graph capture", size);
        return fallback == CUDA_ERROR_OUT_OF_MEMORY ? result : fallback;
    }
    if (result != CUDA_SUCCESS) {
        kiwi_memory_unreserve(size, MANAGED);
        return result;
    }
    track(*dptr, size, MANAGED, ctx, device);
    kiwi_log("managed allocation of %zu bytes at 0x%llx", size, (unsigned long long)*dptr);
    return CUDA_SUCCESS;
}

CUresult kiwi_memory_allocate_in(CUdeviceptr *dptr, size_t size, CUcontext ctx, CUdevice device,
                                 const struct kiwi_stream_order *order)
{
    if (!kiwi_real(HOOK_cuMemAlloc_v2))
        return CUDA_ERROR_NOT_INITIALIZED;
    switch (kiwi_pager_allocator()) {
    case KIWI_EVICTOR_VMM:
        return allocate_mapped(dptr, size, ctx, device, order);
    case KIWI_EVICTOR_MANAGED:
        return allocate_managed(dptr, size, CU_MEM_ATTACH_GLOBAL, ctx, device);
    default:
        return allocate_device(dptr, size, ctx, device);
    }
}

CUresult kiwi_memory_allocate(CUdeviceptr *dptr, size_t size)
{
    CUdevice device = -1;
    CUcontext ctx = kiwi_pager_note_context(&device);
    return kiwi_memory_allocate_in(dptr, size, ctx, device, NULL);
}

KIWI_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags)
{
    KIWI_REAL(real, cuMemAllocManaged);
    if (!kiwi_cfg.enabled)
        return real(dptr, size, flags);
    CUdevice device = -1;
    CUcontext ctx = kiwi_pager_note_context(&device);
    /* Under checkpoint not even this is managed memory: the driver cannot checkpoint a
     * process that has any (r570). */
    if (kiwi_pager_allocator() == KIWI_EVICTOR_CHECKPOINT)
        return allocate_device(dptr, size, ctx, device);
    return allocate_managed(dptr, size, flags, ctx, device);
}

KIWI_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size)
{
    kiwi_init();
    if (!kiwi_cfg.enabled) {
        KIWI_REAL(real, cuMemAlloc_v2);
        return real(dptr, size);
    }
    return kiwi_memory_allocate(dptr, size);
}

/* The driver pads pitched rows for texture hardware; 512 bytes satisfies every GPU's
 * CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT. */
#define PITCH_ALIGNMENT 512

KIWI_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width,
                                        size_t height, unsigned int element_size)
{
    kiwi_init();
    if (!kiwi_cfg.enabled) {
        KIWI_REAL(real, cuMemAllocPitch_v2);
        return real(dptr, pitch, width, height, element_size);
    }
    if (!dptr || !pitch || !width || !height ||
        (element_size != 4 && element_size != 8 && element_size != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t row = (width + PITCH_ALIGNMENT - 1) / PITCH_ALIGNMENT * PITCH_ALIGNMENT;
    if (height > SIZE_MAX / row)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult result = kiwi_memory_allocate(dptr, row * height);
    if (result == CUDA_SUCCESS)
        *pitch = row;
    return result;
}

KIWI_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                 const CUmemAllocationProp *prop, unsigned long long flags)
{
    KIWI_REAL(real, cuMemCreate);
    if (!kiwi_cfg.enabled)
        return real(handle, size, prop, flags);
    CUdevice device = -1;
    CUcontext ctx = kiwi_pager_note_context(&device);
    if (!kiwi_memory_reserve(size, VMM, device))
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult result = real(handle, size, prop, flags);
    if (result != CUDA_SUCCESS) {
        kiwi_memory_unreserve(size, VMM);
        return result;
    }
    track(*handle, size, VMM, ctx, device);
    return CUDA_SUCCESS;
}
