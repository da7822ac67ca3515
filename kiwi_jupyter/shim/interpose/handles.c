/* Memory handed to others: legacy CUDA IPC handles, and the physical handles of VMM memory.
 *
 * The driver's legacy IPC (cuIpcGetMemHandle: PyTorch's sharing of CUDA tensors between
 * processes, NCCL's legacy registration) works on cuMemAlloc memory only: on managed memory it
 * fails, with the shim as without it. The memory the vmm evictor maps is shared on demand
 * through a handle of the shim's own (mechanisms/vmm_ipc.c): exported as file descriptors and
 * pinned in place, and opened by cuIpcOpenMemHandle in any process running the shim (the shim
 * says, once, that a process without it cannot). Handles of the driver's own go to the driver.
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

#include "interpose.h"

KIWI_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr)
{
    KIWI_REAL(real, cuIpcGetMemHandle);
    if (!kiwi_cfg.enabled || !kiwi_vmm_owns(dptr))
        return real(handle, dptr);
    /* Its chunks must be on the card to be exported: while they are away, the gate (which the
     * restore opens) first; inside it no eviction can start. */
    bool inside = false;
    CUresult result;
    while ((result = kiwi_vmm_ipc_export(dptr, handle)) == CUDA_ERROR_NOT_READY && !inside) {
        CUresult refused = kiwi_gate_enter();
        if (refused != CUDA_SUCCESS)
            return refused;
        inside = true;
    }
    if (inside)
        kiwi_gate_exit();
    return result == CUDA_ERROR_NOT_READY ? CUDA_ERROR_INVALID_VALUE : result;
}

/* A handle of the shim's opens here whether or not this process's own memory is the shim's
 * (KIWI_SHIM=0 included): opening it is no scheduling, only the other half of the export. */
#define IPC_OPEN(symbol)                                                                     \
    KIWI_EXPORT CUresult symbol(CUdeviceptr *dptr, CUipcMemHandle handle, unsigned int flags) \
    {                                                                                        \
        KIWI_REAL(real, symbol);                                                             \
        CUresult result = kiwi_vmm_ipc_import(&handle, dptr);                                \
        return result == CUDA_ERROR_NOT_FOUND ? real(dptr, handle, flags) : result;          \
    }

IPC_OPEN(cuIpcOpenMemHandle)
IPC_OPEN(cuIpcOpenMemHandle_v2)

KIWI_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    KIWI_REAL(real, cuIpcCloseMemHandle);
    CUresult result = kiwi_vmm_ipc_close(dptr);
    return result == CUDA_ERROR_NOT_FOUND ? real(dptr) : result;
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
