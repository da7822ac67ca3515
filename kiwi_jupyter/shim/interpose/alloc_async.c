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

typedef CUresult (*alloc_pool_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);


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

/* A stream-ordered allocation from the device's managed pool (mechanisms/pools.c), where the
 * driver has managed pools: it stays stream-ordered, and so does its free. False when there is
 * none. */
static bool allocate_pooled(CUdeviceptr *dptr, size_t size, CUstream s, CUresult *result)
{
    alloc_pool_fn real = (alloc_pool_fn)kiwi_real(HOOK_cuMemAllocFromPoolAsync);
    CUdevice device = -1;
    CUcontext ctx = kiwi_pager_note_context(&device);
    CUmemoryPool pool = real ? kiwi_pool_of(device) : NULL;
    if (!pool)
        return false;
    *result = CUDA_ERROR_OUT_OF_MEMORY;
    if (!kiwi_memory_reserve(size, MANAGED, device))
        return true;
    *result = real(dptr, size, pool, s);
    if (*result != CUDA_SUCCESS) {
        kiwi_memory_unreserve(size, MANAGED);
        return true;
    }
    kiwi_memory_track(*dptr, size, MANAGED, ctx, device, true);
    return true;
}

/* The pool cuMemAllocAsync allocates from: the device's current pool, asked of the driver once
 * per device. */
static CUmemoryPool current_pool(CUdevice device)
{
    static _Atomic(CUmemoryPool) known[64];
    typedef CUresult (*get_pool_fn)(CUmemoryPool *, CUdevice);
    if (device < 0 || device >= 64)
        return NULL;
    CUmemoryPool pool = atomic_load(&known[device]);
    get_pool_fn get_pool = pool ? NULL : (get_pool_fn)kiwi_real(HOOK_cuDeviceGetMemPool);
    if (get_pool && get_pool(&pool, device) == CUDA_SUCCESS)
        atomic_store(&known[device], pool);
    return pool;
}

/* The shim's stream-ordered allocation. Under vmm: memory the shim maps, counted for the pool
 * it was asked of (the device's current pool for cuMemAllocAsync). Under managed: from the
 * device's managed pool where there is one (whichever pool the caller named: another pool's
 * memory could not be paged out), else plain managed memory. */
static CUresult allocate_stream_ordered(CUdeviceptr *dptr, size_t size, CUstream stream,
                                        CUmemoryPool pool, bool from_pool)
{
    enum kiwi_evictor evictor = kiwi_pager_allocator();
    if (evictor == KIWI_EVICTOR_VMM) {
        CUdevice device = -1;
        CUcontext ctx = kiwi_pager_note_context(&device);
        struct kiwi_stream_order order = {from_pool ? pool : current_pool(device), stream};
        return kiwi_memory_allocate_in(dptr, size, ctx, device, &order);
    }
    CUresult pooled;
    if (evictor == KIWI_EVICTOR_MANAGED && allocate_pooled(dptr, size, stream, &pooled))
        return pooled;
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
