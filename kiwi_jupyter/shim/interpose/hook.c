/* Interposition: how the driver's entry points reach the shim's replacements.
 *
 * A process finds driver functions in three ways, and each must land on the shim:
 *
 * 1. Direct linking (CuPy's driver module links libcuda.so.1): the preloaded shim exports the
 *    same names, so the dynamic linker binds those references to the shim first.
 *
 * 2. dlsym(handle, "cuMemAlloc_v2") on a libcuda opened with dlopen: a lookup through a
 *    handle searches only that library, so exported names alone do not catch it. The shim
 *    defines dlsym itself; for a hooked name it records the driver's function (the first
 *    answer wins) and the handle it came from, and returns the replacement.
 *
 * 3. cuGetProcAddress / cuGetProcAddress_v2: since CUDA 11.3 the runtime asks the driver for
 *    nearly every entry point this way, by base name plus the CUDA version it was built for
 *    ("cuMemAlloc", 12000 -> cuMemAlloc_v2) and a default-stream flavour (_ptsz/_ptds). The
 *    runtime fetches cuGetProcAddress itself through dlsym, and then often fetches it again
 *    through itself, so both variants are hooked and both paths return hooks. nvshare missed
 *    the CUDA 12 runtime until it hooked cuGetProcAddress_v2: a process that only ever sees the
 *    _v2 path must still be caught, and the tests check each path separately.
 *
 *    The answer is matched to a hook by address first: the driver hands back one of its
 *    exported functions, and the shim knows each hooked symbol's address from dlsym. This
 *    needs no table of which base name maps to which variant in which version, so it stays
 *    right when a CUDA release adds a variant. Only when the address is unknown (a driver that
 *    hands out internal entry points) does the base name, version and flavour decide.
 *
 * What the driver handed out is kept in mechanisms/driver.c, which also finds the real dlsym
 * (by symbol version: dlsym(RTLD_NEXT, "dlsym") would come back here).
 *
 * Known limit: a library calling dlsym(RTLD_NEXT, name) for a name the shim does not hook now
 * resolves it relative to the shim rather than to itself (dlsym uses its caller's address).
 * Python, the CUDA runtime, PyTorch, CuPy and JAX do not do this.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <string.h>

#include "interpose.h"

/* The replacements, declared with a neutral type under names of their own (an asm label binds
 * each to the real symbol): only their addresses are needed here, and so hook.c does not clash
 * with cuda.h's prototypes when the tests compile the shim against it. */
#define DECLARE(symbol, base, version, per_thread) \
    extern void replacement_##symbol(void) __asm__(#symbol);
KIWI_HOOKS(DECLARE)
#undef DECLARE
KIWI_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
                                      cuuint64_t flags);
KIWI_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                         cuuint64_t flags,
                                         CUdriverProcAddressQueryResult *status);

struct hook {
    const char *symbol;
    const char *base;
    int version;
    int per_thread;
    void (*replacement)(void);
};

#define ENTRY(symbol, base, version, per_thread) \
    {#symbol, base, version, per_thread, replacement_##symbol},
static const struct hook hooks[KIWI_HOOK_COUNT] = {KIWI_HOOKS(ENTRY)};
#undef ENTRY

KIWI_SANITIZER_SAFE static int find_hook(const char *symbol)
{
    if (!symbol || symbol[0] != 'c' || symbol[1] != 'u')
        return -1;
    for (int i = 0; i < KIWI_HOOK_COUNT; i++)
        if (strcmp(hooks[i].symbol, symbol) == 0)
            return i;
    return -1;
}

static int hook_at(void *address)
{
    for (int i = 0; i < KIWI_HOOK_COUNT; i++)
        if ((void *)hooks[i].replacement == address)
            return i;
    return -1;
}

/* dlsym runs inside a sanitizer's own start-up (shim.h, KIWI_SANITIZER_SAFE): find_hook and the
 * lookup of the real dlsym are left uninstrumented with it. */
KIWI_EXPORT KIWI_SANITIZER_SAFE void *dlsym(void *handle, const char *symbol)
{
    kiwi_dlsym_fn real = kiwi_driver_dlsym();
    if (!real)
        return NULL;
    int id = find_hook(symbol);
    if (id < 0)
        return real(handle, symbol);
    kiwi_init();
    void *address = real(handle, symbol);
    if (!address || hook_at(address) >= 0)
        return address;
    kiwi_driver_found((enum kiwi_hook_id)id, address, handle);
    kiwi_log("dlsym %s: hooked", symbol);
    return kiwi_cfg.enabled ? (void *)hooks[id].replacement : address;
}

/* The hook for what cuGetProcAddress answered for (symbol, version, flags), or the answer
 * itself when the shim does not replace that entry point. */
static void *hook_answer(const char *symbol, void *answer, int version, cuuint64_t flags)
{
    if (!answer || !kiwi_cfg.enabled || hook_at(answer) >= 0)
        return answer;
    for (int i = 0; i < KIWI_HOOK_COUNT; i++) {
        if (kiwi_real((enum kiwi_hook_id)i) == answer) {
            kiwi_log("cuGetProcAddress %s (%d, flags %llu): hooked %s", symbol, version,
                     (unsigned long long)flags, hooks[i].symbol);
            return (void *)hooks[i].replacement;
        }
    }
    /* A per-thread-stream caller gets the _ptsz/_ptds variant where one exists, and the plain
     * function for entry points that have no such variant (cuMemAlloc, cuMemFree, ...). */
    int per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    int best = -1;
    for (int i = 0; i < KIWI_HOOK_COUNT; i++) {
        if (strcmp(hooks[i].base, symbol) != 0 || hooks[i].version > version ||
            (hooks[i].per_thread && !per_thread))
            continue;
        if (best < 0 || hooks[i].per_thread > hooks[best].per_thread ||
            (hooks[i].per_thread == hooks[best].per_thread &&
             hooks[i].version > hooks[best].version))
            best = i;
    }
    if (best < 0)
        return answer;
    kiwi_driver_found((enum kiwi_hook_id)best, answer, NULL);
    kiwi_log("cuGetProcAddress %s (%d, flags %llu): hooked %s by name", symbol, version,
             (unsigned long long)flags, hooks[best].symbol);
    return (void *)hooks[best].replacement;
}

KIWI_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
                                      cuuint64_t flags)
{
    KIWI_REAL(real, cuGetProcAddress);
    CUresult result = real(symbol, pfn, version, flags);
    if (result == CUDA_SUCCESS && pfn && symbol)
        *pfn = hook_answer(symbol, *pfn, version, flags);
    return result;
}

KIWI_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                         cuuint64_t flags,
                                         CUdriverProcAddressQueryResult *status)
{
    KIWI_REAL(real, cuGetProcAddress_v2);
    CUresult result = real(symbol, pfn, version, flags, status);
    if (result == CUDA_SUCCESS && pfn && symbol)
        *pfn = hook_answer(symbol, *pfn, version, flags);
    return result;
}
