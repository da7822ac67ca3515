/* Memory handed to others: legacy CUDA IPC handles, and the physical handles of VMM memory.
 *
 * The driver's legacy IPC (cuIpcGetMemHandle: PyTorch's sharing of CUDA tensors between
 * processes, NCCL's legacy registration) works on cuMemAlloc memory only. It fails on managed
 * memory, and on the memory the vmm evictor maps as well; under vmm the shim says why, once,
 * and answers CUDA_ERROR_NOT_SUPPORTED rather than the driver's bare invalid value.
 *
 * cuMemRetainAllocationHandle gives the physical handle behind an address to whoever asks (an
 * export to a shareable handle, an NCCL buffer registration), and cuMemGetHandleForAddressRange
 * a dma-buf of the memory behind a range (GPUDirect RDMA registrations): a handle held elsewhere
 * keeps the memory alive after the shim's release, and a restore into new memory would part
 * the two. The memory behind it stays where it is from then on, and is reported as not
 * evictable. Both need the memory mapped: while it is away, they wait at the gate for the
 * restore first, as work does.
 */
#define _GNU_SOURCE
#include <stdatomic.h>

#include "interpose.h"

KIWI_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr)
{
    kiwi_init();
    if (kiwi_cfg.enabled && kiwi_vmm_owns(dptr)) {
        static atomic_bool said;
        if (!atomic_exchange(&said, true))
            kiwi_warn("cuIpcGetMemHandle: memory the shim pages with KIWI_EVICT=vmm cannot be "
                      "shared through legacy CUDA IPC; run this process with "
                      "KIWI_EVICT=checkpoint to share it");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    KIWI_REAL(real, cuIpcGetMemHandle);
    return real(handle, dptr);
}

/* Enters the gate when any of [ptr, ptr + size) is away, so that the restore brings it back;
 * *inside says whether it did (the caller leaves with kiwi_gate_exit). */
static CUresult present(CUdeviceptr ptr, size_t size, bool *inside)
{
    *inside = false;
    if (!kiwi_cfg.enabled || !kiwi_vmm_away_in(ptr, size))
        return CUDA_SUCCESS;
    CUresult refused = kiwi_gate_enter();
    *inside = refused == CUDA_SUCCESS;
    return refused;
}

KIWI_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle,
                                                 void *address)
{
    KIWI_REAL(real, cuMemRetainAllocationHandle);
    CUdeviceptr ptr = (CUdeviceptr)(uintptr_t)address;
    bool inside;
    CUresult result = present(ptr, 1, &inside);
    if (result != CUDA_SUCCESS)
        return result;
    result = real(handle, address);
    if (result == CUDA_SUCCESS && kiwi_cfg.enabled)
        kiwi_vmm_retained(ptr, 1);
    if (inside)
        kiwi_gate_exit();
    return result;
}

KIWI_EXPORT CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr dptr, size_t size,
                                                   CUmemRangeHandleType type,
                                                   unsigned long long flags)
{
    KIWI_REAL(real, cuMemGetHandleForAddressRange);
    bool inside;
    CUresult result = present(dptr, size, &inside);
    if (result != CUDA_SUCCESS)
        return result;
    result = real(handle, dptr, size, type, flags);
    if (result == CUDA_SUCCESS && kiwi_cfg.enabled)
        kiwi_vmm_retained(dptr, size);
    if (inside)
        kiwi_gate_exit();
    return result;
}
