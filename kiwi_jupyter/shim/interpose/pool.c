/* The device's memory pool, as a framework asks for it: the shim's managed pool of that device
 * (mechanisms/pools.c), where the driver has managed pools, so that the pool it configures and
 * reads is the one its stream-ordered allocations come from.
 */
#define _GNU_SOURCE
#include "interpose.h"

#define DEVICE_POOL(symbol)                                                  \
    KIWI_EXPORT CUresult symbol(CUmemoryPool *pool, CUdevice device)         \
    {                                                                        \
        KIWI_REAL(real, symbol);                                             \
        CUmemoryPool managed = pool ? kiwi_pool_of(device) : NULL;           \
        if (!managed)                                                        \
            return real(pool, device);                                       \
        *pool = managed;                                                     \
        return CUDA_SUCCESS;                                                 \
    }

DEVICE_POOL(cuDeviceGetMemPool)
DEVICE_POOL(cuDeviceGetDefaultMemPool)
