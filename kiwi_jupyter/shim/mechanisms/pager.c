/* The pager's one entry: which evictor pages this process out, and each move handed to it.
 *
 *   managed     the shim converts allocations to managed memory (interpose/alloc.c) and moves
 *               them itself (managed.c);
 *   checkpoint  allocations stay device memory; the daemon suspends the whole process from
 *               outside with the driver's checkpoint API when the next holder needs the room,
 *               and the shim only gates work and talks to the daemon: it moves nothing.
 *
 * KIWI_EVICT asks (auto by default). The shim offers, the daemon confirms: checkpoint is offered
 * when this driver has the API (cuGetProcAddress finds cuCheckpointProcessLock), and the daemon
 * answers in `registered` with the evictor it will carry out (client/evict.c takes the answer
 * and chooses here). The choice must be made before the first allocation, since a device
 * allocation can never become managed later: that allocation waits for the answer, at most
 * EVICT_ANSWER_SECONDS. Without an answer (no daemon, or one that predates evictors) the process
 * is paged as managed memory, which needs nobody's help.
 *
 * An evictor that moves memory itself plugs in beside managed.c: its case in kiwi_pager_move,
 * kiwi_pager_forget_context and kiwi_pager_after_fork, and its own way of allocating where
 * interpose/alloc.c asks kiwi_pager_converts.
 */
#define _GNU_SOURCE
#include <time.h>

#include "pager.h"

#define EVICT_ANSWER_SECONDS 2.0

static atomic_int chosen;       /* KIWI_EVICTOR_UNDECIDED until the daemon answers or the wait
                                   runs out */
static atomic_int has_api = -1; /* -1 not probed yet */

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
    default:
        return "undecided";
    }
}

void kiwi_pager_choose(enum kiwi_evictor evictor, const char *why)
{
    int expected = KIWI_EVICTOR_UNDECIDED;
    if (!atomic_compare_exchange_strong(&chosen, &expected, (int)evictor))
        return;
    if (why)
        kiwi_warn("KIWI_EVICT=%s: paging this process as managed memory: %s",
                  kiwi_cfg.evict == KIWI_EVICT_AUTO ? "auto" : "checkpoint", why);
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
    if (kiwi_cfg.evict == KIWI_EVICT_MANAGED)
        return KIWI_EVICTOR_MANAGED;
    return driver_has_checkpoint_api() ? KIWI_EVICTOR_CHECKPOINT : KIWI_EVICTOR_MANAGED;
}

bool kiwi_pager_settle_offer(void)
{
    if (kiwi_pager_offer() != KIWI_EVICTOR_MANAGED)
        return false;
    const char *why = kiwi_cfg.evict == KIWI_EVICT_MANAGED
                          ? NULL
                          : "the CUDA driver has no checkpoint API (it needs r570 or later)";
    kiwi_pager_choose(KIWI_EVICTOR_MANAGED, why);
    return true;
}

bool kiwi_pager_converts(void)
{
    enum kiwi_evictor now = kiwi_pager_evictor();
    if (now != KIWI_EVICTOR_UNDECIDED)
        return now == KIWI_EVICTOR_MANAGED;
    if (kiwi_pager_settle_offer())
        return true;
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
    return kiwi_pager_evictor() == KIWI_EVICTOR_MANAGED;
}

void kiwi_pager_move(enum kiwi_page_direction direction, struct kiwi_transfer *moved)
{
    switch (kiwi_pager_evictor()) {
    case KIWI_EVICTOR_CHECKPOINT: /* the daemon moves the whole process, from outside */
        *moved = (struct kiwi_transfer){0};
        break;
    default: /* managed, and what managed memory there is before a choice */
        kiwi_managed_move(direction, moved);
        break;
    }
}

void kiwi_pager_forget_context(CUcontext ctx)
{
    int count;
    kiwi_contexts_lock(&count);
    kiwi_contexts_remove(ctx);
    kiwi_managed_forget_context(ctx);
    kiwi_contexts_unlock();
}

void kiwi_pager_after_fork(void)
{
    kiwi_contexts_after_fork();
    kiwi_managed_after_fork();
    kiwi_free_ranges_after_fork();
}
