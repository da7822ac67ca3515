/* The device's memory pool, as a framework asks for it and reads it.
 *
 * Under the managed evictor: the shim's managed pool of that device (mechanisms/pools.c),
 * where the driver has managed pools, so that the pool a framework configures and reads is the
 * one its stream-ordered allocations come from.
 *
 * Under the vmm evictor the driver's own pool, whose settings stay the driver's; but its
 * stream-ordered allocations come from the vmm evictor, not from it, so what a framework reads
 * of the pool's memory (used and reserved, now and at most: torch.cuda.memory_reserved() under
 * PyTorch's cudaMallocAsync backend, CuPy's MemoryAsyncPool) is answered from the shim's own
 * counts of them (mechanisms/vmm_pools.c): reserved stays up from a free until its memory is
 * reclaimed, as a pool's does.
 */
#define _GNU_SOURCE
#include "interpose.h"

#define DEVICE_POOL(symbol)                                                            \
    KIWI_EXPORT CUresult symbol(CUmemoryPool *pool, CUdevice device)                   \
    {                                                                                  \
        KIWI_REAL(real, symbol);                                                       \
        bool driver_pool = kiwi_cfg.enabled && kiwi_pager_offer()->keeps_driver_pools; \
        CUmemoryPool managed = pool && !driver_pool ? kiwi_pool_of(device) : NULL;     \
        if (!managed)                                                                  \
            return real(pool, device);                                                 \
        *pool = managed;                                                               \
        return CUDA_SUCCESS;                                                           \
    }

DEVICE_POOL(cuDeviceGetMemPool)
DEVICE_POOL(cuDeviceGetDefaultMemPool)

KIWI_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attribute,
                                           void *value)
{
    KIWI_REAL(real, cuMemPoolGetAttribute);
    uint64_t count;
    if (!kiwi_cfg.enabled || !value || !kiwi_vmm_pool_attribute(pool, attribute, &count))
        return real(pool, attribute, value);
    *(cuuint64_t *)value = count;
    return CUDA_SUCCESS;
}

/* Setting a high mark (to 0, the one value the driver takes) resets it to what is current. */
KIWI_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attribute,
                                           void *value)
{
    KIWI_REAL(real, cuMemPoolSetAttribute);
    bool high = attribute == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH ||
                attribute == CU_MEMPOOL_ATTR_USED_MEM_HIGH; /* the others take an int */
    bool reset = kiwi_cfg.enabled && high && value && *(const cuuint64_t *)value == 0 &&
                 kiwi_vmm_pool_reset(pool, attribute);
    CUresult result = real(pool, attribute, value);
    return reset ? CUDA_SUCCESS : result;
}
