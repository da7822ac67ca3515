/* Frees: an allocation is forgotten only once the driver has freed it, and no free runs while
 * the pager moves the working set (kiwi_memory_free_begin). Memory the vmm evictor maps is
 * freed by it (mechanisms/vmm_frees.c: after a synchronization, or in stream order after an event);
 * a stream-ordered free of managed memory waits for its stream.
 */
#define _GNU_SOURCE
#include "interpose.h"

typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);

#define FREEABLE (KIND(MANAGED) | KIND(DEVICE) | KIND(MAPPED))

KIWI_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    KIWI_REAL(real, cuMemFree_v2);
    kiwi_memory_free_begin();
    struct allocation *a = kiwi_memory_begin_free(dptr, FREEABLE);
    CUresult result;
    if (a && a->kind == MAPPED) {
        result = kiwi_vmm_free(a);
    } else {
        result = real(dptr);
        kiwi_memory_end_free(a, result);
    }
    kiwi_memory_free_end();
    return result;
}

/* A stream-ordered free of memory the shim made managed: the stream's earlier work may still
 * use it, so wait for the stream, then free at once. (The cost is one stream synchronization
 * per free; PyTorch's and CuPy's caching allocators free rarely.) A stream being captured
 * cannot be waited for; the free then waits for the next release, which synchronizes
 * everything anyway. */
static CUresult free_managed_after(CUdeviceptr dptr, CUstream s, bool *deferred_free)
{
    *deferred_free = false;
    free_fn free_now = (free_fn)kiwi_real(HOOK_cuMemFree_v2);
    if (!free_now)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (kiwi_memory_capturing(s)) {
        *deferred_free = kiwi_memory_defer_free(dptr);
        if (*deferred_free)
            return CUDA_SUCCESS;
        kiwi_warn("too many frees during graph capture; freeing 0x%llx at once",
                  (unsigned long long)dptr);
        return free_now(dptr);
    }
    typedef CUresult (*sync_fn)(CUstream);
    sync_fn sync = (sync_fn)kiwi_driver_sym("cuStreamSynchronize");
    CUresult result = sync ? sync(s) : CUDA_ERROR_NOT_INITIALIZED;
    return result == CUDA_SUCCESS ? free_now(dptr) : result;
}

static CUresult free_async(free_async_fn real, CUdeviceptr dptr, CUstream s, bool per_thread)
{
    kiwi_memory_free_begin();
    struct allocation *a = kiwi_memory_begin_free(dptr, FREEABLE);
    CUstream stream = kiwi_stream(s, per_thread);
    CUresult result;
    if (a && a->kind == MAPPED) {
        result = kiwi_vmm_free_async(a, stream, kiwi_memory_capturing(stream));
    } else if (!a || a->pooled) {
        /* the driver's own (graph capture), never seen, or from a managed pool: all freed in
         * stream order by the driver */
        result = real(dptr, s);
        kiwi_memory_end_free(a, result);
    } else {
        bool deferred_free;
        result = free_managed_after(dptr, stream, &deferred_free);
        /* A deferred free keeps the record until it is done (kiwi_memory_free_deferred). */
        kiwi_memory_end_free(a, deferred_free ? CUDA_ERROR_NOT_READY : result);
    }
    kiwi_memory_free_end();
    return result;
}

#define FREE_ASYNC(symbol, per_thread)                                                   \
    KIWI_EXPORT CUresult symbol(CUdeviceptr dptr, CUstream s)                            \
    {                                                                                    \
        KIWI_REAL(real, symbol);                                                         \
        return free_async(real, dptr, s, per_thread);                                    \
    }

FREE_ASYNC(cuMemFreeAsync, false)
FREE_ASYNC(cuMemFreeAsync_ptsz, true)

KIWI_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    KIWI_REAL(real, cuMemRelease);
    struct allocation *a = kiwi_memory_begin_free(handle, KIND(VMM));
    CUresult result = real(handle);
    kiwi_memory_end_free(a, result);
    return result;
}
