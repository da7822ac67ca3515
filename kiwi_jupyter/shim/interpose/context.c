/* Contexts that end: what was allocated in a context is freed with it.
 *
 * A context ends when it is destroyed (cuCtxDestroy), and a device's primary context, the one
 * the CUDA runtime and so every framework uses, when it is reset or its last reference is
 * released (cuDevicePrimaryCtxReset, cuDevicePrimaryCtxRelease). The shim must then forget the
 * context's allocations, or it would go on counting them in the working set and, worse, prefetch
 * addresses that the driver may hand to a new context; and the pager must forget the context
 * and its stream, or the next release would make a dead context current to synchronize it.
 *
 * Which context is a device's primary one is learnt from cuDevicePrimaryCtxRetain, which is how
 * the runtime gets it (the pager keeps it: mechanisms/contexts.c).
 */
#define _GNU_SOURCE
#include "interpose.h"

#define PEER_ACCESS_ALREADY_ENABLED 704 /* CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED */

static void forget(CUcontext ctx)
{
    if (!ctx)
        return;
    kiwi_pager_forget_context(ctx);
    uint64_t bytes = kiwi_memory_forget_context(ctx);
    kiwi_log("context %p ended: forgot %llu bytes allocated in it", (void *)ctx,
             (unsigned long long)bytes);
}

/* The primary context of device, once it has ended: forgotten, here and everywhere. */
static void primary_ended(CUdevice device)
{
    forget(kiwi_pager_primary_ended(device));
    kiwi_pool_forget_device(device);
}

static bool primary_active(CUdevice device)
{
    typedef CUresult (*state_fn)(CUdevice, unsigned int *, int *);
    state_fn state = (state_fn)kiwi_driver_sym("cuDevicePrimaryCtxGetState");
    unsigned int flags = 0;
    int active = 1; /* unknown: assume it lives on, and forget nothing */
    if (state && state(device, &flags, &active) != CUDA_SUCCESS)
        active = 1;
    return active != 0;
}

KIWI_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice device)
{
    KIWI_REAL(real, cuDevicePrimaryCtxRetain);
    CUresult result = real(ctx, device);
    if (result == CUDA_SUCCESS && ctx)
        kiwi_pager_note_primary(device, *ctx);
    return result;
}

/* The driver frees the context's memory: to the pager that is a free like any other, so it
 * waits while the working set moves (kiwi_memory_free_begin). */
#define PRIMARY_ENDS(symbol, ends_always)                                   \
    KIWI_EXPORT CUresult symbol(CUdevice device);                           \
    KIWI_EXPORT CUresult symbol(CUdevice device)                            \
    {                                                                       \
        KIWI_REAL(real, symbol);                                            \
        kiwi_memory_free_begin();                                           \
        CUresult result = real(device);                                     \
        if (result == CUDA_SUCCESS && (ends_always || !primary_active(device))) \
            primary_ended(device);                                          \
        kiwi_memory_free_end();                                             \
        return result;                                                      \
    }

PRIMARY_ENDS(cuDevicePrimaryCtxRelease, false)
PRIMARY_ENDS(cuDevicePrimaryCtxRelease_v2, false)
PRIMARY_ENDS(cuDevicePrimaryCtxReset, true)
PRIMARY_ENDS(cuDevicePrimaryCtxReset_v2, true)

#define DESTROY(symbol)                                                     \
    KIWI_EXPORT CUresult symbol(CUcontext ctx);                             \
    KIWI_EXPORT CUresult symbol(CUcontext ctx)                              \
    {                                                                       \
        KIWI_REAL(real, symbol);                                            \
        kiwi_memory_free_begin();                                           \
        CUresult result = real(ctx);                                        \
        if (result == CUDA_SUCCESS)                                         \
            forget(ctx);                                                    \
        kiwi_memory_free_end();                                             \
        return result;                                                      \
    }

DESTROY(cuCtxDestroy)
DESTROY(cuCtxDestroy_v2)

/* Peer access does not reach memory the vmm evictor maps (access to VMM memory is per mapping):
 * the mappings of the peer's device are given access from this context's device instead, now
 * and at every restore (mechanisms/vmm_addresses.c). */
KIWI_EXPORT CUresult cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags)
{
    KIWI_REAL(real, cuCtxEnablePeerAccess);
    CUresult result = real(peer, flags);
    if (kiwi_cfg.enabled && (result == CUDA_SUCCESS || result == PEER_ACCESS_ALREADY_ENABLED))
        kiwi_vmm_peer_enabled(peer);
    return result;
}
