/* An allocation the card cannot back now waits for the daemon to make room.
 *
 * Every process sees the whole GPU; on a card that is really full, the room a new allocation
 * needs may be held by an idle process whose memory could move. So under the vmm evictor an
 * allocation that finds the card full (its own cache already given back, vmm_cache.c) gets its
 * addresses at once and waits here: the client, woken, reports the working set that now
 * includes it and asks for the GPU (holding it already, gives it back and asks again: the
 * daemon makes room only before a grant); the restore on the grant maps the allocation, and
 * the wait ends. It ends with CUDA_ERROR_OUT_OF_MEMORY, as the driver would have answered, and
 * one line saying why, when the room cannot be had: the daemon refused it (kiwi_room_fail, with
 * its words), or there is no daemon to make it. Frameworks then do what they do on the driver's
 * out of memory (PyTorch's caching allocator frees its cache and tries again).
 *
 * No wait where it could never end: not on the client's own thread, and not while a graph
 * capture is open (the GPU cannot be given back in the middle of one): the allocation fails at
 * once there, as before. Ctrl-C ends a wait as it ends one at the gate.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <time.h>

#include "../shim.h"

/* Under kiwi_lock: allocations waiting; waits the client ended (a wait that sees it move gives
 * up), and why. */
static int waiters;
static unsigned failures;
static char failure[256];

bool kiwi_room_may_wait(size_t size)
{
    bool client = kiwi_news_on_client_thread(), capture = kiwi_capture_open() > 0;
    if (client || capture)
        kiwi_warn("an allocation of %zu bytes fails: the card is full, and it cannot wait for "
                  "room %s", size, capture ? "during a graph capture (the GPU cannot change "
                                             "hands in the middle of one)"
                                           : "on the scheduler client's own thread");
    return !client && !capture;
}

int kiwi_room_waiters(void)
{
    /* Once mapped, a wait is over, even before its thread wakes to see it. */
    return kiwi_pager_away() ? waiters : 0;
}

void kiwi_room_fail(const char *why)
{
    if (!waiters)
        return;
    failures++;
    snprintf(failure, sizeof failure, "%s", why);
    pthread_cond_broadcast(&kiwi_changed);
}

static void deadline_after(struct timespec *ts, double seconds)
{
    clock_gettime(CLOCK_REALTIME, ts);
    double whole = (double)ts->tv_nsec * 1e-9 + seconds;
    ts->tv_sec += (time_t)whole;
    ts->tv_nsec = (long)((whole - (double)(time_t)whole) * 1e9);
}

CUresult kiwi_room_wait(size_t size)
{
    if (!kiwi_room_may_wait(size))
        return CUDA_ERROR_OUT_OF_MEMORY;
    kiwi_news_need_client();
    double started = kiwi_now();
    unsigned interrupts = kiwi_interrupts();
    char why[sizeof failure] = "";
    CUresult result = CUDA_SUCCESS;
    pthread_mutex_lock(&kiwi_lock);
    unsigned failed = failures;
    waiters++;
    kiwi_news_wake(); /* the client reports the working set and asks for the GPU */
    while (kiwi_pager_away()) {
        if (failures != failed) {
            snprintf(why, sizeof why, "%s", failure);
            result = CUDA_ERROR_OUT_OF_MEMORY;
            break;
        }
        if (kiwi_interrupts() != interrupts) {
            result = CUDA_ERROR_SYSTEM_NOT_READY;
            break;
        }
        struct timespec until; /* timed: a missed broadcast costs a moment, never a hang */
        deadline_after(&until, 0.5);
        pthread_cond_timedwait(&kiwi_changed, &kiwi_lock, &until);
    }
    waiters--;
    pthread_mutex_unlock(&kiwi_lock);
    if (result == CUDA_SUCCESS)
        kiwi_log("an allocation of %zu bytes waited %.3f s for room", size,
                 kiwi_now() - started);
    else if (result == CUDA_ERROR_OUT_OF_MEMORY)
        kiwi_warn("an allocation of %zu bytes fails after %.1f s: the card is full, and %s", size,
                  kiwi_now() - started, why);
    return result;
}

void kiwi_room_after_fork(void)
{
    waiters = 0;
    failures = 0;
}
