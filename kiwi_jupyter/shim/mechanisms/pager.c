/* The pager's one entry: which evictor pages this process out, and each move handed to it.
 *
 *   vmm         allocations are physical memory the shim maps itself (vmm.c) at addresses it
 *               reserves; an eviction copies them to host shadows and unmaps and releases
 *               them, so the card is free for real, and a restore maps them again at the same
 *               addresses and copies them back (vmm_move.c);
 *   managed     the shim converts allocations to managed memory (interpose/alloc.c) and moves
 *               them itself (managed.c); the driver keeps their chunks on the card;
 *   checkpoint  allocations stay device memory; the daemon suspends the whole process from
 *               outside with the driver's checkpoint API when the next holder needs the room,
 *               and the shim only gates work and talks to the daemon: it moves nothing.
 *
 * KIWI_EVICT asks (auto by default). vmm and managed need nobody's help, so the shim takes them
 * on its own; auto takes vmm where the device supports the virtual memory management API
 * (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED), and else goes on as before. There the
 * shim offers, the daemon confirms: checkpoint is offered when this driver has the API
 * (cuGetProcAddress finds cuCheckpointProcessLock), and the daemon answers in `registered` with
 * the evictor it will carry out (client/evict.c takes the answer and chooses here). The choice
 * must be made before the first allocation, since an allocation can never change kind later:
 * that allocation waits for the answer, at most EVICT_ANSWER_SECONDS. Without an answer (no
 * daemon, or one that predates evictors) the process is paged as managed memory.
 *
 * Each evictor that moves memory itself has its case in kiwi_pager_move,
 * kiwi_pager_forget_context and kiwi_pager_after_fork, and its own way of allocating where
 * interpose/alloc.c asks kiwi_pager_allocator. Under vmm the managed memory the program asks
 * for itself (cuMemAllocManaged) stays managed, and the managed evictor moves it alongside.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "pager.h"

#define EVICT_ANSWER_SECONDS 2.0

static atomic_int chosen;       /* KIWI_EVICTOR_UNDECIDED until the daemon answers or the wait
                                   runs out */
static atomic_int has_api = -1; /* -1 not probed yet */
static atomic_int has_vmm = -1; /* likewise */

/* Does the process's device 0 support the virtual memory management API? Asked of the driver
 * once it answers (before cuInit it cannot say, and the question is asked again). */
static bool device_supports_vmm(void)
{
    int known = atomic_load(&has_vmm);
    if (known >= 0)
        return known;
    typedef CUresult (*attribute_fn)(int *, CUdevice_attribute, CUdevice);
    attribute_fn attribute = (attribute_fn)kiwi_driver_sym("cuDeviceGetAttribute");
    int value = 0;
    CUdevice_attribute vmm = CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED;
    CUresult result = attribute ? attribute(&value, vmm, 0) : CUDA_ERROR_NOT_FOUND;
    if (result == CUDA_ERROR_NOT_INITIALIZED)
        return false;
    bool supported = result == CUDA_SUCCESS && value != 0;
    atomic_store(&has_vmm, supported);
    return supported;
}

static bool driver_has_checkpoint_api(void)
{
    int known = atomic_load(&has_api);
    if (known >= 0)
        return known;
    typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t, int *);
    typedef CUresult (*version_fn)(int *);
    get_proc_fn get_proc = (get_proc_fn)kiwi_real(HOOK_cuGetProcAddress_v2);
    version_fn version = (version_fn)kiwi_driver_sym("cuDriverGetVersion");
    int driver_version = 0;
    void *lock = NULL;
    bool found = get_proc && version && version(&driver_version) == CUDA_SUCCESS &&
                 get_proc("cuCheckpointProcessLock", &lock, driver_version, 0, NULL) ==
                     CUDA_SUCCESS && lock;
    atomic_store(&has_api, found);
    return found;
}

const char *kiwi_evictor_name(enum kiwi_evictor evictor)
{
    switch (evictor) {
    case KIWI_EVICTOR_MANAGED:
        return "managed";
    case KIWI_EVICTOR_CHECKPOINT:
        return "checkpoint";
    case KIWI_EVICTOR_VMM:
        return "vmm";
    default:
        return "undecided";
    }
}

static const char *request_name(void)
{
    switch (kiwi_cfg.evict) {
    case KIWI_EVICT_MANAGED:
        return "managed";
    case KIWI_EVICT_CHECKPOINT:
        return "checkpoint";
    case KIWI_EVICT_VMM:
        return "vmm";
    default:
        return "auto";
    }
}

void kiwi_pager_choose(enum kiwi_evictor evictor, const char *why)
{
    int expected = KIWI_EVICTOR_UNDECIDED;
    if (!atomic_compare_exchange_strong(&chosen, &expected, (int)evictor))
        return;
    if (why)
        kiwi_warn("KIWI_EVICT=%s: paging this process as %s memory: %s", request_name(),
                  evictor == KIWI_EVICTOR_VMM ? "vmm" : "managed", why);
    else
        kiwi_log("evictor: %s", kiwi_evictor_name(evictor));
}

enum kiwi_evictor kiwi_pager_evictor(void)
{
    return (enum kiwi_evictor)atomic_load(&chosen);
}

bool kiwi_pager_checkpointing(void)
{
    return kiwi_pager_evictor() == KIWI_EVICTOR_CHECKPOINT;
}

enum kiwi_evictor kiwi_pager_offer(void)
{
    enum kiwi_evictor now = kiwi_pager_evictor();
    if (now != KIWI_EVICTOR_UNDECIDED)
        return now;
    switch (kiwi_cfg.evict) {
    case KIWI_EVICT_MANAGED:
        return KIWI_EVICTOR_MANAGED;
    case KIWI_EVICT_VMM:
        return device_supports_vmm() ? KIWI_EVICTOR_VMM : KIWI_EVICTOR_MANAGED;
    case KIWI_EVICT_AUTO:
        if (device_supports_vmm())
            return KIWI_EVICTOR_VMM;
        break;
    default:
        break;
    }
    return driver_has_checkpoint_api() ? KIWI_EVICTOR_CHECKPOINT : KIWI_EVICTOR_MANAGED;
}

/* Why an offer that needs nobody's answer is not what KIWI_EVICT asked for; NULL when it is. */
static const char *why_not_asked(enum kiwi_evictor offer)
{
    if (offer == KIWI_EVICTOR_VMM || kiwi_cfg.evict == KIWI_EVICT_MANAGED)
        return NULL;
    if (kiwi_cfg.evict == KIWI_EVICT_VMM)
        return "the device does not support CUDA's virtual memory management";
    return "the CUDA driver has no checkpoint API (it needs r570 or later)";
}

bool kiwi_pager_settle_offer(void)
{
    enum kiwi_evictor offer = kiwi_pager_offer();
    if (offer != KIWI_EVICTOR_MANAGED && offer != KIWI_EVICTOR_VMM)
        return false;
    kiwi_pager_choose(offer, why_not_asked(offer));
    return true;
}

bool kiwi_pager_self_paging(enum kiwi_evictor evictor)
{
    return evictor == KIWI_EVICTOR_MANAGED || evictor == KIWI_EVICTOR_VMM;
}

enum kiwi_evictor kiwi_pager_allocator(void)
{
    enum kiwi_evictor now = kiwi_pager_evictor();
    if (now != KIWI_EVICTOR_UNDECIDED)
        return now;
    if (kiwi_pager_settle_offer())
        return kiwi_pager_evictor();
    /* Checkpoint is possible on this side: wait for the daemon's word. */
    kiwi_news_need_client();
    double deadline = kiwi_now() + EVICT_ANSWER_SECONDS;
    pthread_mutex_lock(&kiwi_lock);
    while (kiwi_pager_evictor() == KIWI_EVICTOR_UNDECIDED && kiwi_now() < deadline) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 50 * 1000 * 1000;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&kiwi_changed, &kiwi_lock, &until);
    }
    pthread_mutex_unlock(&kiwi_lock);
    kiwi_pager_choose(KIWI_EVICTOR_MANAGED, "no answer from the scheduler");
    return kiwi_pager_evictor();
}

/* Under vmm: the managed memory the program asked for itself, moved alongside. */
static void move_managed_too(enum kiwi_page_direction direction, struct kiwi_transfer *moved)
{
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

/* The managed evictor's bytes moved to host memory by the last way out, until the way in. */
static _Atomic uint64_t managed_host;

void kiwi_pager_move(enum kiwi_page_direction direction, struct kiwi_transfer *moved)
{
    void (*progress)(const struct kiwi_residency *, void *) = moved->progress;
    void *progress_arg = moved->progress_arg;
    switch (kiwi_pager_evictor()) {
    case KIWI_EVICTOR_CHECKPOINT: /* the daemon moves the whole process, from outside */
        *moved = (struct kiwi_transfer){0};
        break;
    case KIWI_EVICTOR_VMM:
        kiwi_vmm_move(direction, moved);
        if (!moved->failed)
            move_managed_too(direction, moved);
        break;
    default: /* managed, and what managed memory there is before a choice */
        kiwi_managed_move(direction, moved);
        atomic_store(&managed_host, direction == KIWI_PAGE_OUT ? moved->bytes : 0);
        break;
    }
    moved->progress = progress;
    moved->progress_arg = progress_arg;
}

void kiwi_pager_residency(struct kiwi_residency *out)
{
    *out = (struct kiwi_residency){0};
    if (kiwi_pager_evictor() == KIWI_EVICTOR_VMM) {
        kiwi_vmm_residency(out);
        return;
    }
    /* Managed memory moved out keeps its chunks on the card by the driver's count, but the
     * driver hands them to whoever allocates next: to the scheduler it is in host memory. A
     * checkpointed process's memory is the daemon's to tell: what was allocated. */
    struct kiwi_working_set ws;
    kiwi_memory_working_set(&ws);
    uint64_t host = atomic_load(&managed_host);
    out->host = host < ws.bytes ? host : ws.bytes;
    out->resident = ws.bytes - out->host;
}

bool kiwi_pager_movable(void)
{
    struct kiwi_working_set ws;
    kiwi_memory_working_set(&ws);
    return ws.evictable || (kiwi_pager_evictor() == KIWI_EVICTOR_VMM && kiwi_vmm_movable());
}

bool kiwi_pager_away(void)
{
    return kiwi_pager_evictor() == KIWI_EVICTOR_VMM && kiwi_vmm_away();
}

void kiwi_pager_free_deferred(void)
{
    kiwi_memory_free_deferred();
    if (kiwi_pager_evictor() == KIWI_EVICTOR_VMM)
        kiwi_vmm_free_deferred();
}

void kiwi_pager_forget_context(CUcontext ctx)
{
    int count;
    kiwi_contexts_lock(&count);
    kiwi_contexts_remove(ctx);
    kiwi_managed_forget_context(ctx);
    kiwi_vmm_forget_context(ctx);
    kiwi_contexts_unlock();
}

void kiwi_pager_pin_budget(uint64_t bytes)
{
    kiwi_vmm_pin_budget(bytes);
}

void kiwi_pager_after_fork(void)
{
    kiwi_contexts_after_fork();
    kiwi_managed_after_fork();
    kiwi_vmm_after_fork();
    kiwi_vmm_ipc_after_fork();
    kiwi_free_ranges_after_fork();
}
