/* Which evictor pages this process out: the one place that decides whether allocations
 * become managed memory.
 *
 *   managed     the shim converts allocations and pages them itself (alloc.c, pager.c);
 *   checkpoint  allocations stay device memory; the daemon suspends the whole process from
 *               outside with the driver's checkpoint API when the next holder needs the room,
 *               and the shim only gates work and talks to the daemon.
 *
 * KIWI_EVICT asks (auto by default). The shim proposes, the daemon confirms: checkpoint is
 * proposed when this driver has the API (cuGetProcAddress finds cuCheckpointProcessLock),
 * and the daemon answers in `registered` with the evictor it will carry out (it says managed
 * when it cannot act on this pid). The decision must be made before the first allocation, since
 * a device allocation can never become managed later: that allocation waits for the answer, at
 * most EVICT_ANSWER_SECONDS. Without an answer (no daemon, or one that predates evictors) the
 * process is paged as managed memory, which needs nobody's help.
 */
#define _GNU_SOURCE
#include <string.h>
#include <time.h>

#include "shim.h"

#define EVICT_ANSWER_SECONDS 2.0

enum { UNDECIDED, MANAGED, CHECKPOINT };

static atomic_int decided;     /* UNDECIDED until the daemon answers or the wait runs out */
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

static void settle(int choice, const char *why)
{
    int expected = UNDECIDED;
    if (atomic_compare_exchange_strong(&decided, &expected, choice)) {
        if (why)
            kiwi_warn("KIWI_EVICT=%s: paging this process as managed memory: %s",
                      kiwi_cfg.evict == KIWI_EVICT_AUTO ? "auto" : "checkpoint", why);
        else
            kiwi_log("evictor: %s", choice == CHECKPOINT ? "checkpoint" : "managed");
    }
}

const char *kiwi_evict_proposal(void)
{
    int now = atomic_load(&decided);
    if (now != UNDECIDED)
        return now == CHECKPOINT ? "checkpoint" : "managed";
    if (kiwi_cfg.evict == KIWI_EVICT_MANAGED)
        return "managed";
    return driver_has_checkpoint_api() ? "checkpoint" : "managed";
}

void kiwi_evict_answered(const char *evictor)
{
    if (atomic_load(&decided) != UNDECIDED) {
        /* A new daemon after a restart: what was allocated stays what it is. */
        bool checkpointing = atomic_load(&decided) == CHECKPOINT;
        if (checkpointing && strcmp(evictor, "checkpoint") != 0)
            kiwi_warn("the scheduler no longer checkpoints this process; its device memory "
                      "cannot be paged out until it is restarted");
        return;
    }
    if (strcmp(evictor, "checkpoint") == 0)
        settle(CHECKPOINT, NULL);
    else if (strcmp(kiwi_evict_proposal(), "checkpoint") == 0)
        settle(MANAGED, evictor[0] ? "the scheduler cannot checkpoint it (its log says why)"
                                   : "the scheduler does not know the checkpoint evictor");
    else
        settle(MANAGED, kiwi_cfg.evict == KIWI_EVICT_MANAGED ? NULL
                        : "the CUDA driver has no checkpoint API (it needs r570 or later)");
}

bool kiwi_evict_converts(void)
{
    int now = atomic_load(&decided);
    if (now != UNDECIDED)
        return now == MANAGED;
    if (strcmp(kiwi_evict_proposal(), "managed") == 0) {
        kiwi_evict_answered("managed");
        return true;
    }
    /* Checkpoint is possible on this side: wait for the daemon's word. */
    kiwi_comm_start();
    double deadline = kiwi_now() + EVICT_ANSWER_SECONDS;
    pthread_mutex_lock(&kiwi_lock);
    while (atomic_load(&decided) == UNDECIDED && kiwi_now() < deadline) {
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
    settle(MANAGED, "no answer from the scheduler");
    return atomic_load(&decided) == MANAGED;
}

bool kiwi_evict_checkpointing(void)
{
    return atomic_load(&decided) == CHECKPOINT;
}

const char *kiwi_evict_name(void)
{
    int now = atomic_load(&decided);
    return now == UNDECIDED ? "undecided" : now == CHECKPOINT ? "checkpoint" : "managed";
}
