/* The vmm evictor's table of operations (struct kiwi_evictor): a device allocation becomes
 * physical memory the shim maps itself at addresses it reserved (vmm.c), device memory to the
 * process in every way, that an eviction takes off the card for real and a restore puts back at
 * the same addresses (vmm_move.c). The managed memory the program asks for itself stays managed,
 * and moves alongside, as the managed evictor moves it.
 */
#define _GNU_SOURCE
#include <stdlib.h>

#include "vmm.h"

/* An allocation that waited for room and got none goes, as the program's own free would take
 * it. */
static void give_back(CUdeviceptr ptr)
{
    kiwi_memory_free_begin();
    struct allocation *record = kiwi_memory_begin_free(ptr, KIND(MAPPED));
    if (record)
        kiwi_vmm_free(record);
    kiwi_memory_free_end();
}

/* Allocates size bytes the vmm evictor maps, within the limit (which it checks itself: what
 * counts is the card's bytes it takes, whole granules, not size). On a card that is full, the
 * allocation waits for the daemon to make room (room_wait.c): the room an idle process holds is
 * never a reason to fail; past the limit no eviction makes the room. */
static CUresult allocate(CUdeviceptr *dptr, size_t size, CUcontext ctx, CUdevice device,
                         const struct kiwi_stream_order *order)
{
    enum kiwi_vmm_backing backing = KIWI_VMM_BACKED;
    CUresult result = kiwi_vmm_allocate(dptr, size, ctx, device, order, false, &backing);
    if (result == CUDA_ERROR_OUT_OF_MEMORY && kiwi_room_may_wait(size))
        result = kiwi_vmm_allocate(dptr, size, ctx, device, order, true, &backing);
    if (kiwi_capture_error(result)) /* the driver refuses to map during this graph capture */
        return kiwi_device_allocate_instead(dptr, size, ctx, device, result);
    if (result != CUDA_SUCCESS)
        return result;
    if (backing != KIWI_VMM_WAITS)
        return CUDA_SUCCESS;
    result = kiwi_room_wait(size);
    if (result != CUDA_SUCCESS)
        give_back(*dptr);
    return result;
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

/* A stream-ordered allocation: memory the shim maps, counted for the pool it was asked of (the
 * device's current pool for cuMemAllocAsync); its stream may take back its own earlier frees at
 * once (vmm_reuse.c). */
static bool allocate_ordered(CUdeviceptr *dptr, size_t size, CUstream stream, CUmemoryPool pool,
                             bool from_pool, CUresult *result)
{
    if (!kiwi_real(HOOK_cuMemAlloc_v2)) {
        *result = CUDA_ERROR_NOT_INITIALIZED;
        return true;
    }
    CUdevice device = -1;
    CUcontext ctx = kiwi_pager_note_context(&device);
    struct kiwi_stream_order order = {from_pool ? pool : current_pool(device), stream};
    *result = allocate(dptr, size, ctx, device, &order);
    return true;
}

/* The move, and the managed memory the program asked for itself moved alongside. */
static void move(enum kiwi_page_direction direction, struct kiwi_transfer *moved)
{
    kiwi_vmm_move(direction, moved);
    if (moved->failed)
        return;
    struct kiwi_range *ranges;
    uint64_t generation;
    size_t count = kiwi_memory_ranges(KIWI_RANGES_MANAGED, &ranges, &generation);
    free(ranges);
    if (!count)
        return;
    struct kiwi_transfer managed;
    kiwi_managed_move(direction, &managed);
    moved->bytes += managed.bytes;
    moved->skipped += managed.skipped;
    moved->discarded += managed.discarded;
    moved->seconds += managed.seconds;
}

static void after_fork(void)
{
    kiwi_vmm_after_fork();
    kiwi_vmm_ipc_after_fork();
}

const struct kiwi_evictor kiwi_vmm_evictor = {
    .name = "vmm",
    /* a daemon that predates vmm: to it the process pages itself, as under managed */
    .name_for_old_daemons = "managed",
    .allocate = allocate,
    .allocate_managed = kiwi_managed_allocate,
    .allocate_ordered = allocate_ordered,
    .move = move,
    .tier = kiwi_vmm_tier,
    .residency = kiwi_vmm_residency,
    .movable = kiwi_vmm_movable,
    .away = kiwi_vmm_away,
    .free_deferred = kiwi_vmm_free_deferred,
    .forget_context = kiwi_vmm_forget_context,
    .pin_budget = kiwi_vmm_pin_budget,
    .after_fork = after_fork,
    .pages_itself = true,
    .cell_asks_when_evicted = true,
    .keeps_driver_pools = true,
};
