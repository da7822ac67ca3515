/* Memory handed to others: legacy CUDA IPC handles, and the physical handles of VMM memory.
 *
 * The driver's legacy IPC (cuIpcGetMemHandle: PyTorch's sharing of CUDA tensors between
 * processes, NCCL's legacy registration) works on cuMemAlloc memory only. It fails on managed
 * memory, and on the memory the vmm evictor maps as well; under vmm the shim says why, once,
 * and answers CUDA_ERROR_NOT_SUPPORTED rather than the driver's bare invalid value.
 *
 * cuMemRetainAllocationHandle gives the physical handle behind an address to whoever asks (an
 * export to a shareable handle, an NCCL buffer registration): a handle held elsewhere keeps the
 * memory alive after the shim's release, and a restore into new memory would part the two. The
 * memory behind it stays where it is from then on, and is reported as not evictable.
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

KIWI_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle,
                                                 void *address)
{
    KIWI_REAL(real, cuMemRetainAllocationHandle);
    CUresult result = real(handle, address);
    if (result == CUDA_SUCCESS && kiwi_cfg.enabled)
        kiwi_vmm_retained((CUdeviceptr)(uintptr_t)address);
    return result;
}
