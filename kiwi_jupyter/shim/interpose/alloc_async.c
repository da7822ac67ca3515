/* Stream-ordered allocations: memory the shim maps (vmm) or managed memory is usable at once,
 * which is at least as early as the stream would have made it usable. Under vmm the free is
 * stream-ordered (interpose/free.c), and an allocation takes back at once what its own stream
 * freed (mechanisms/vmm_reuse.c: the stream matters there); the pool it was asked of is noted
 * for its counters (interpose/pool.c).
 *
 * Except while the stream is being captured into a CUDA graph: then the allocation must become
 * a node of the graph (it happens again at each replay), so it goes to the driver unchanged
 * and stays out of the table. (PyTorch's cudaMallocAsync backend does this under CUDA graphs.)
 */
#define _GNU_SOURCE
#include "interpose.h"

bool kiwi_memory_capturing(CUstream stream)
{
    typedef CUresult (*is_capturing_fn)(CUstream, int *);
    static _Atomic(is_capturing_fn) is_capturing;
    is_capturing_fn fn = atomic_load(&is_capturing);
    if (!fn) {
        fn = (is_capturing_fn)kiwi_driver_sym("cuStreamIsCapturing");
        atomic_store(&is_capturing, fn);
    }
    int status = 0; /* CU_STREAM_CAPTURE_STATUS_NONE */
    return fn && fn(stream, &status) == CUDA_SUCCESS && status != 0;
}

/* The shim's stream-ordered allocation, as the evictor makes one (under vmm: memory the shim
 * maps, counted for the pool it was asked of; under managed: from the device's managed pool
 * where there is one), else a plain allocation. */
static CUresult allocate_stream_ordered(CUdeviceptr *dptr, size_t size, CUstream stream,
                                        CUmemoryPool pool, bool from_pool)
{
    const struct kiwi_evictor *evictor = kiwi_pager_allocator();
    CUresult result;
    if (evictor->allocate_ordered &&
        evictor->allocate_ordered(dptr, size, stream, pool, from_pool, &result))
        return result;
    return kiwi_memory_allocate(dptr, size);
}

#define ALLOC_ASYNC(symbol, per_thread, params, args, pool, from_pool)                          \
    KIWI_EXPORT CUresult symbol params                                                          \
    {                                                                                           \
        kiwi_init();                                                                            \
        CUstream stream = kiwi_stream(s, per_thread);                                           \
        if (!kiwi_cfg.enabled || kiwi_memory_capturing(stream)) {                               \
            KIWI_REAL(real, symbol);                                                            \
            return real args;                                                                   \
        }                                                                                       \
        return allocate_stream_ordered(dptr, size, stream, pool, from_pool);                    \
    }

#define ASYNC_PARAMS (CUdeviceptr *dptr, size_t size, CUstream s)
#define ASYNC_ARGS (dptr, size, s)
ALLOC_ASYNC(cuMemAllocAsync, false, ASYNC_PARAMS, ASYNC_ARGS, NULL, false)
ALLOC_ASYNC(cuMemAllocAsync_ptsz, true, ASYNC_PARAMS, ASYNC_ARGS, NULL, false)
#define FROM_POOL_PARAMS (CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s)
#define FROM_POOL_ARGS (dptr, size, pool, s)
ALLOC_ASYNC(cuMemAllocFromPoolAsync, false, FROM_POOL_PARAMS, FROM_POOL_ARGS, pool, true)
ALLOC_ASYNC(cuMemAllocFromPoolAsync_ptsz, true, FROM_POOL_PARAMS, FROM_POOL_ARGS, pool, true)
