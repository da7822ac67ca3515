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
 * Each evictor is one table of operations (struct kiwi_evictor, shim.h): managed.c,
 * vmm_evictor.c and checkpoint.c hold the instances, this file chooses one, and every question
 * that depends on the evictor is one of its operations; nothing outside these files asks which
 * evictor runs. Under vmm the managed memory the program asks for itself (cuMemAllocManaged)
 * stays managed, and the managed evictor moves it alongside.
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pager.h"

#define EVICT_ANSWER_SECONDS 2.0

/* NULL until the daemon answers or the wait runs out */
static _Atomic(const struct kiwi_evictor *) chosen;
static atomic_int has_api = -1; /* -1 not probed yet */
static atomic_int has_vmm = -1; /* likewise */

/* Before a choice: what managed memory the program asked for itself moves as managed.c moves
 * it, and nothing else is the pager's. */
static const struct kiwi_evictor undecided = {
    .name = "undecided",
    .move = kiwi_managed_page,
    .residency = kiwi_managed_residency,
};

/* The evictors that get the operations every evictor hears, chosen or not. */
static const struct kiwi_evictor *const every[] = {
    &kiwi_managed_evictor,
    &kiwi_vmm_evictor,
    &kiwi_checkpoint_evictor,
};
#define EVERY (sizeof every / sizeof every[0])

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

/* The first choice stands (allocations are made for it); why, when the offer was not taken. */
static void choose(const struct kiwi_evictor *evictor, const char *why)
{
    const struct kiwi_evictor *expected = NULL;
    if (!atomic_compare_exchange_strong(&chosen, &expected, evictor))
        return;
    if (why)
        kiwi_warn("KIWI_EVICT=%s: paging this process as %s memory: %s", request_name(),
                  evictor->name, why);
    else
        kiwi_log("evictor: %s", evictor->name);
}

const struct kiwi_evictor *kiwi_pager_evictor(void)
{
    const struct kiwi_evictor *now = atomic_load(&chosen);
    return now ? now : &undecided;
}

const struct kiwi_evictor *kiwi_pager_offer(void)
{
    const struct kiwi_evictor *now = atomic_load(&chosen);
    if (now)
        return now;
    switch (kiwi_cfg.evict) {
    case KIWI_EVICT_MANAGED:
        return &kiwi_managed_evictor;
    case KIWI_EVICT_VMM:
        return device_supports_vmm() ? &kiwi_vmm_evictor : &kiwi_managed_evictor;
    case KIWI_EVICT_AUTO:
        if (device_supports_vmm())
            return &kiwi_vmm_evictor;
        break;
    default:
        break;
    }
    return driver_has_checkpoint_api() ? &kiwi_checkpoint_evictor : &kiwi_managed_evictor;
}

/* Why an offer that needs nobody's answer is not what KIWI_EVICT asked for; NULL when it is. */
static const char *why_not_asked(const struct kiwi_evictor *offer)
{
    if (offer == &kiwi_vmm_evictor || kiwi_cfg.evict == KIWI_EVICT_MANAGED)
        return NULL;
    if (kiwi_cfg.evict == KIWI_EVICT_VMM)
        return "the device does not support CUDA's virtual memory management";
    return "the CUDA driver has no checkpoint API (it needs r570 or later)";
}

/* An offer of managed or vmm memory needs nobody's answer: chooses it, and says so. False when
 * the offer is checkpoint, which the daemon must confirm. */
static bool settle_offer(void)
{
    const struct kiwi_evictor *offer = kiwi_pager_offer();
    if (offer == &kiwi_checkpoint_evictor)
        return false;
    choose(offer, why_not_asked(offer));
    return true;
}

void kiwi_pager_answered(const char *evictor)
{
    const struct kiwi_evictor *now = atomic_load(&chosen);
    if (now) {
        /* A new daemon after a restart: what was allocated stays what it is. */
        if (now == &kiwi_checkpoint_evictor && strcmp(evictor, now->name) != 0)
            kiwi_warn("the scheduler no longer checkpoints this process; its device memory "
                      "cannot be paged out until it is restarted");
        return;
    }
    if (strcmp(evictor, kiwi_checkpoint_evictor.name) == 0)
        choose(&kiwi_checkpoint_evictor, NULL);
    else if (strcmp(evictor, kiwi_vmm_evictor.name) == 0 && kiwi_pager_offer() == &kiwi_vmm_evictor)
        choose(&kiwi_vmm_evictor, NULL);
    else if (!settle_offer())
        choose(&kiwi_managed_evictor,
               evictor[0] ? "the scheduler cannot checkpoint it (its log says why)"
                          : "the scheduler does not know the checkpoint evictor");
}

const struct kiwi_evictor *kiwi_pager_allocator(void)
{
    const struct kiwi_evictor *now = atomic_load(&chosen);
    if (now)
        return now;
    if (settle_offer())
        return atomic_load(&chosen);
    /* Checkpoint is possible on this side: wait for the daemon's word. */
    kiwi_news_need_client();
    double deadline = kiwi_now() + EVICT_ANSWER_SECONDS;
    pthread_mutex_lock(&kiwi_lock);
    while (!atomic_load(&chosen) && kiwi_now() < deadline) {
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
    choose(&kiwi_managed_evictor, "no answer from the scheduler");
    return atomic_load(&chosen);
}

void kiwi_pager_move(enum kiwi_page_direction direction, struct kiwi_transfer *moved)
{
    void (*progress)(const struct kiwi_residency *, void *) = moved->progress;
    void *progress_arg = moved->progress_arg;
    const struct kiwi_evictor *evictor = kiwi_pager_evictor();
    if (evictor->move)
        evictor->move(direction, moved);
    else
        *moved = (struct kiwi_transfer){0};
    moved->progress = progress;
    moved->progress_arg = progress_arg;
}

void kiwi_pager_tier(enum kiwi_page_direction direction, uint64_t bytes,
                     struct kiwi_transfer *moved)
{
    void (*progress)(const struct kiwi_residency *, void *) = moved->progress;
    void *progress_arg = moved->progress_arg;
    const struct kiwi_evictor *evictor = kiwi_pager_evictor();
    if (evictor->tier) {
        evictor->tier(direction, bytes, moved);
    } else {
        *moved = (struct kiwi_transfer){0};
        moved->failed = "no disk tier: the evictor is not vmm";
    }
    moved->progress = progress;
    moved->progress_arg = progress_arg;
}

void kiwi_pager_residency(struct kiwi_residency *out)
{
    *out = (struct kiwi_residency){0};
    kiwi_pager_evictor()->residency(out);
}

bool kiwi_pager_movable(void)
{
    struct kiwi_working_set ws;
    kiwi_memory_working_set(&ws);
    const struct kiwi_evictor *evictor = kiwi_pager_evictor();
    return ws.evictable || (evictor->movable && evictor->movable());
}

bool kiwi_pager_away(void)
{
    const struct kiwi_evictor *evictor = kiwi_pager_evictor();
    return evictor->away && evictor->away();
}

void kiwi_pager_free_deferred(void)
{
    kiwi_memory_free_deferred();
    const struct kiwi_evictor *evictor = kiwi_pager_evictor();
    if (evictor->free_deferred)
        evictor->free_deferred();
}

void kiwi_pager_forget_context(CUcontext ctx)
{
    int count;
    kiwi_contexts_lock(&count);
    kiwi_contexts_remove(ctx);
    for (size_t i = 0; i < EVERY; i++)
        if (every[i]->forget_context)
            every[i]->forget_context(ctx);
    kiwi_contexts_unlock();
}

void kiwi_pager_pin_budget(uint64_t bytes)
{
    for (size_t i = 0; i < EVERY; i++)
        if (every[i]->pin_budget)
            every[i]->pin_budget(bytes);
}

void kiwi_pager_after_fork(void)
{
    kiwi_contexts_after_fork();
    for (size_t i = 0; i < EVERY; i++)
        if (every[i]->after_fork)
            every[i]->after_fork();
    kiwi_free_ranges_after_fork();
}
