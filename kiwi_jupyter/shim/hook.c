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
 * The real dlsym is found with dlvsym by symbol version, because dlsym(RTLD_NEXT, "dlsym")
 * would come back to the shim. glibc 2.34 moved dlsym into libc as dlsym@GLIBC_2.34; older
 * glibc has dlsym@GLIBC_2.2.5 (x86-64) or @GLIBC_2.17 (aarch64).
 *
 * Known limit: a library calling dlsym(RTLD_NEXT, name) for a name the shim does not hook now
 * resolves it relative to the shim rather than to itself (dlsym uses its caller's address).
 * Python, the CUDA runtime, PyTorch, CuPy and JAX do not do this.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>
#include <string.h>

#include "shim.h"

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

static _Atomic(void *) reals[KIWI_HOOK_COUNT];
/* Symbols this driver does not have (older drivers lack the newest variants), so that the
 * address matching in hook_answer does not ask dlsym again for each of hundreds of answers. */
static atomic_bool missing[KIWI_HOOK_COUNT];
static _Atomic(void *) driver_handle;

typedef void *(*dlsym_fn)(void *, const char *);
static _Atomic(dlsym_fn) real_dlsym_fn;

/* dlsym and what it calls first run inside a sanitizer's own start-up, when a sanitized build of
 * the shim is tested: AddressSanitizer and ThreadSanitizer resolve their interceptors with dlsym
 * before their shadow memory exists. These functions are left uninstrumented, and the real dlsym
 * is found without pthread_once (itself intercepted, and not ready then); threads racing here
 * all find the same function. */
#define KIWI_SANITIZER_SAFE __attribute__((no_sanitize_address, no_sanitize_thread))

KIWI_SANITIZER_SAFE static dlsym_fn real_dlsym(void)
{
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17",
                                           "GLIBC_2.0"};
    dlsym_fn found = atomic_load_explicit(&real_dlsym_fn, memory_order_acquire);
    for (size_t i = 0; !found && i < sizeof versions / sizeof versions[0]; i++)
        found = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    if (found)
        atomic_store_explicit(&real_dlsym_fn, found, memory_order_release);
    return found;
}

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

static void *lookup(void *handle, const char *symbol)
{
    dlsym_fn real = real_dlsym();
    if (!real)
        return NULL;
    void *address = real(handle, symbol);
    /* A lookup in the global scope finds the shim's own export first: that is not the driver. */
    return address && hook_at(address) < 0 ? address : NULL;
}

void *kiwi_driver_sym(const char *symbol)
{
    void *address = NULL;
    void *handle = atomic_load(&driver_handle);
    if (handle)
        address = lookup(handle, symbol);
    if (!address)
        address = lookup(RTLD_NEXT, symbol);
    if (!address) {
        handle = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
        if (handle) {
            address = lookup(handle, symbol);
            dlclose(handle);
        }
    }
    return address;
}

void *kiwi_real(enum kiwi_hook_id id)
{
    void *address = atomic_load_explicit(&reals[id], memory_order_acquire);
    if (address || atomic_load_explicit(&missing[id], memory_order_relaxed))
        return address;
    address = kiwi_driver_sym(hooks[id].symbol);
    if (!address && atomic_load(&driver_handle))
        atomic_store(&missing[id], true);
    if (address) {
        void *expected = NULL;
        if (!atomic_compare_exchange_strong(&reals[id], &expected, address))
            address = expected;
    }
    return address;
}

static void remember(int id, void *address, void *handle)
{
    void *expected = NULL;
    atomic_compare_exchange_strong(&reals[id], &expected, address);
    atomic_store(&missing[id], false);
    if (handle && handle != RTLD_DEFAULT && handle != RTLD_NEXT) {
        expected = NULL;
        atomic_compare_exchange_strong(&driver_handle, &expected, handle);
    }
}

KIWI_EXPORT KIWI_SANITIZER_SAFE void *dlsym(void *handle, const char *symbol)
{
    dlsym_fn real = real_dlsym();
    if (!real)
        return NULL;
    int id = find_hook(symbol);
    if (id < 0)
        return real(handle, symbol);
    kiwi_init();
    void *address = real(handle, symbol);
    if (!address || hook_at(address) >= 0)
        return address;
    remember(id, address, handle);
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
    remember(best, answer, NULL);
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
