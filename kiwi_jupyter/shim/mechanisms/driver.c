/* Finding the driver's own functions, for the shim's replacements (interpose/) and for the
 * driver calls the shim makes itself (synchronizing, prefetching, probing).
 *
 * A hooked symbol's function is recorded when interpose/hook.c sees it handed out (dlsym on the
 * driver's handle, or a cuGetProcAddress answer); otherwise it is looked up here: in the
 * driver's handle once known, else in the libraries loaded after the shim, else in a
 * libcuda.so.1 the process has loaded. A lookup in the global scope would find the shim's own
 * export of the name first, which is never the driver.
 *
 * The real dlsym is found with dlvsym by symbol version, because dlsym(RTLD_NEXT, "dlsym")
 * would come back to the shim. glibc 2.34 moved dlsym into libc as dlsym@GLIBC_2.34; older
 * glibc has dlsym@GLIBC_2.2.5 (x86-64) or @GLIBC_2.17 (aarch64). It is found without
 * pthread_once (intercepted by the sanitizers, and not ready inside their start-up); threads
 * racing here all find the same function.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdatomic.h>

#include "../shim.h"

#define NAME(symbol, base, version, per_thread) #symbol,
static const char *const symbols[KIWI_HOOK_COUNT] = {KIWI_HOOKS(NAME)};
#undef NAME

static _Atomic(void *) reals[KIWI_HOOK_COUNT];
/* Symbols this driver does not have (older drivers lack the newest variants), so that the
 * address matching of cuGetProcAddress's answers does not ask dlsym again for each of hundreds
 * of answers. */
static atomic_bool missing[KIWI_HOOK_COUNT];
static _Atomic(void *) driver_handle;
static _Atomic(kiwi_dlsym_fn) real_dlsym;

KIWI_SANITIZER_SAFE kiwi_dlsym_fn kiwi_driver_dlsym(void)
{
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17",
                                           "GLIBC_2.0"};
    kiwi_dlsym_fn found = atomic_load_explicit(&real_dlsym, memory_order_acquire);
    for (size_t i = 0; !found && i < sizeof versions / sizeof versions[0]; i++)
        found = (kiwi_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    if (found)
        atomic_store_explicit(&real_dlsym, found, memory_order_release);
    return found;
}

/* Whether address lies in the shim's own library. */
static bool in_shim(void *address)
{
    Dl_info shim, found;
    return dladdr((void *)&in_shim, &shim) && dladdr(address, &found) &&
           shim.dli_fbase == found.dli_fbase;
}

static void *lookup(void *handle, const char *symbol)
{
    kiwi_dlsym_fn real = kiwi_driver_dlsym();
    if (!real)
        return NULL;
    void *address = real(handle, symbol);
    return address && !in_shim(address) ? address : NULL;
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
    address = kiwi_driver_sym(symbols[id]);
    if (!address && atomic_load(&driver_handle))
        atomic_store(&missing[id], true);
    if (address) {
        void *expected = NULL;
        if (!atomic_compare_exchange_strong(&reals[id], &expected, address))
            address = expected;
    }
    return address;
}

void kiwi_driver_found(enum kiwi_hook_id id, void *address, void *handle)
{
    void *expected = NULL;
    atomic_compare_exchange_strong(&reals[id], &expected, address);
    atomic_store(&missing[id], false);
    if (handle && handle != RTLD_DEFAULT && handle != RTLD_NEXT) {
        expected = NULL;
        atomic_compare_exchange_strong(&driver_handle, &expected, handle);
    }
}
