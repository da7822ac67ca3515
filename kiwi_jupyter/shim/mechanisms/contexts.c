/* The contexts the pager knows, and each device's primary context.
 *
 * The comm thread synchronizes the process's work and moves its memory in every context the
 * process used: noted as a thread allocates or waits at the gate in it (kiwi_pager_note_context),
 * forgotten when it ends (interpose/context.c). The comm thread is not a thread CUDA knows: it
 * makes each context current itself before it synchronizes or moves memory in it, on a stream
 * of the pager's own per context, created on first use.
 *
 * Which context is a device's primary one, the one the CUDA runtime and so every framework uses,
 * is learnt from cuDevicePrimaryCtxRetain, which is how the runtime gets it: when the primary
 * context is reset or released for the last time, its allocations go with it.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <string.h>

#include "pager.h"

#define MAX_CONTEXTS 16
#define MAX_DEVICES 64

static pthread_mutex_t contexts_lock = PTHREAD_MUTEX_INITIALIZER;
static struct context contexts[MAX_CONTEXTS];
static int context_count;

static pthread_mutex_t primaries_lock = PTHREAD_MUTEX_INITIALIZER;
static CUcontext primaries[MAX_DEVICES];

struct pager_driver kiwi_pager_driver;

/* Resolved on first use, and again until the driver is loaded (a process may allocate
 * through a driver it has not opened yet from the shim's point of view). */
bool kiwi_pager_resolve(void)
{
    static pthread_mutex_t resolve_lock = PTHREAD_MUTEX_INITIALIZER;
    static atomic_bool resolved;
    if (atomic_load(&resolved))
        return true;
    pthread_mutex_lock(&resolve_lock);
    if (!kiwi_pager_driver.ctx_get) {
        kiwi_pager_driver.ctx_device = (ctx_device_fn)kiwi_driver_sym("cuCtxGetDevice");
        kiwi_pager_driver.ctx_set = (ctx_set_fn)kiwi_driver_sym("cuCtxSetCurrent");
        kiwi_pager_driver.ctx_sync = (sync_fn)kiwi_driver_sym("cuCtxSynchronize");
        kiwi_pager_driver.stream_create = (stream_create_fn)kiwi_driver_sym("cuStreamCreate");
        kiwi_pager_driver.stream_sync = (stream_sync_fn)kiwi_driver_sym("cuStreamSynchronize");
        kiwi_pager_driver.prefetch = (prefetch_fn)kiwi_driver_sym("cuMemPrefetchAsync");
        kiwi_pager_driver.prefetch_v2 = (prefetch_v2_fn)kiwi_driver_sym("cuMemPrefetchAsync_v2");
        kiwi_pager_driver.prefetch_batch =
            (prefetch_batch_fn)kiwi_driver_sym("cuMemPrefetchBatchAsync");
        kiwi_pager_driver.discard_batch =
            (discard_batch_fn)kiwi_driver_sym("cuMemDiscardBatchAsync");
        kiwi_pager_driver.copy_to_host =
            (copy_to_host_fn)kiwi_driver_sym("cuMemcpyDtoHAsync_v2");
        kiwi_pager_driver.copy_to_device =
            (copy_to_device_fn)kiwi_driver_sym("cuMemcpyHtoDAsync_v2");
        kiwi_pager_driver.host_alloc = (host_alloc_fn)kiwi_driver_sym("cuMemAllocHost_v2");
        kiwi_pager_driver.host_free = (host_free_fn)kiwi_driver_sym("cuMemFreeHost");
        kiwi_pager_driver.ctx_get = (ctx_get_fn)kiwi_driver_sym("cuCtxGetCurrent");
    }
    bool found = kiwi_pager_driver.ctx_get != NULL;
    atomic_store(&resolved, found);
    pthread_mutex_unlock(&resolve_lock);
    return found;
}

CUcontext kiwi_pager_note_context(CUdevice *device)
{
    if (!kiwi_pager_resolve())
        return NULL;
    CUcontext ctx = NULL;
    if (kiwi_pager_driver.ctx_get(&ctx) != CUDA_SUCCESS || !ctx)
        return NULL;
    CUdevice dev = -1;
    pthread_mutex_lock(&contexts_lock);
    int i = 0;
    while (i < context_count && contexts[i].ctx != ctx)
        i++;
    if (i < context_count) {
        dev = contexts[i].device;
    } else if (kiwi_pager_driver.ctx_device &&
               kiwi_pager_driver.ctx_device(&dev) == CUDA_SUCCESS &&
               context_count < MAX_CONTEXTS) {
        contexts[context_count++] = (struct context){.ctx = ctx, .device = dev};
    }
    pthread_mutex_unlock(&contexts_lock);
    if (device)
        *device = dev;
    return ctx;
}

bool kiwi_pager_synchronize(void)
{
    if (!kiwi_pager_resolve() || !kiwi_pager_driver.ctx_set || !kiwi_pager_driver.ctx_sync)
        return true; /* no driver: nothing was queued */
    bool synchronized = true;
    pthread_mutex_lock(&contexts_lock);
    for (int i = 0; i < context_count; i++) {
        CUresult result = kiwi_pager_driver.ctx_set(contexts[i].ctx);
        if (result == CUDA_SUCCESS)
            result = kiwi_pager_driver.ctx_sync();
        if (result == CUDA_ERROR_INVALID_CONTEXT || result == CUDA_ERROR_CONTEXT_IS_DESTROYED) {
            /* Ended by a path the shim does not see: no work of it can still run. */
            kiwi_log("context %p is gone; forgetting it", (void *)contexts[i].ctx);
            contexts[i--] = contexts[--context_count];
        } else if (result != CUDA_SUCCESS) {
            kiwi_warn("synchronizing before release failed: CUDA error %d", result);
            synchronized = false;
        }
    }
    pthread_mutex_unlock(&contexts_lock);
    return synchronized;
}

struct context *kiwi_contexts_lock(int *count)
{
    pthread_mutex_lock(&contexts_lock);
    *count = context_count;
    return contexts;
}

void kiwi_contexts_unlock(void)
{
    pthread_mutex_unlock(&contexts_lock);
}

void kiwi_contexts_remove(CUcontext ctx)
{
    for (int i = 0; i < context_count; i++) {
        if (contexts[i].ctx == ctx) {
            /* Its stream went with it. Order does not matter: move the last one here. */
            contexts[i] = contexts[--context_count];
            break;
        }
    }
}

void kiwi_pager_note_primary(CUdevice device, CUcontext ctx)
{
    if (device < 0 || device >= MAX_DEVICES)
        return;
    pthread_mutex_lock(&primaries_lock);
    primaries[device] = ctx;
    pthread_mutex_unlock(&primaries_lock);
}

CUcontext kiwi_pager_primary_ended(CUdevice device)
{
    if (device < 0 || device >= MAX_DEVICES)
        return NULL;
    pthread_mutex_lock(&primaries_lock);
    CUcontext ctx = primaries[device];
    primaries[device] = NULL;
    pthread_mutex_unlock(&primaries_lock);
    return ctx;
}

void kiwi_contexts_after_fork(void)
{
    pthread_mutex_init(&contexts_lock, NULL);
    memset(contexts, 0, sizeof contexts);
    context_count = 0;
    pthread_mutex_init(&primaries_lock, NULL);
    memset(primaries, 0, sizeof primaries);
}
