/* GPU memory: allocations become memory the shim can page out, as the evictor chosen pages it
 * and allocates it (its table of operations, mechanisms/pager.c): memory the vmm evictor maps
 * itself (mechanisms/vmm_evictor.c), managed memory (mechanisms/managed.c), or under the
 * checkpoint evictor plain device memory, each allocation waiting at the gate
 * (mechanisms/checkpoint.c). The program's own VMM handles (cuMemCreate) are counted here.
 */
#define _GNU_SOURCE

#include "interpose.h"

static void track(uint64_t key, size_t size, enum allocation_kind kind, CUcontext ctx,
                  CUdevice device)
{
    kiwi_memory_track(key, size, kind, ctx, device, false);
}

CUresult kiwi_memory_allocate_in(CUdeviceptr *dptr, size_t size, CUcontext ctx, CUdevice device,
                                 const struct kiwi_stream_order *order)
{
    if (!kiwi_real(HOOK_cuMemAlloc_v2))
        return CUDA_ERROR_NOT_INITIALIZED;
    return kiwi_pager_allocator()->allocate(dptr, size, ctx, device, order);
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
    return kiwi_pager_allocator()->allocate_managed(dptr, size, flags, ctx, device);
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
