/* When the daemon cannot make room: a wait it refuses ends, and the process asks again later,
 * never in a loop.
 *
 * A daemon that serves the memory feature refuses a waiter whose working set does not fit
 * beside the memory others keep on the GPU when no eviction can make the room: an `error`
 * event with code `room`, whose message names who holds the memory (docs/protocol.md). The
 * hold goes back to IDLE (protocol.h's table); the connection stays. What waits for the GPU
 * (calls at the gate, an eager acquire) keeps waiting, and the comm thread asks again after a
 * backoff: ROOM_RETRY_FIRST, doubling up to ROOM_RETRY_MOST. The backoff outlives reconnects
 * (a refusal used to close the connection, and every reconnect asked again at once: a tight
 * loop of registrations) and only a grant resets it.
 *
 * The first refusal of a wait is said once on stderr (the kernel's output); the rest are
 * counted, and the stats show the last one with the seconds to the next ask (`room_refused`,
 * `room_retry_in`), which the kernel's waiting line shows, updated in place. A wait refused
 * for longer than KIWI_ROOM_TIMEOUT (default 300 s; 0: for as long as it takes) gives up: the
 * calls waiting at the gate return CUDA_ERROR_OUT_OF_MEMORY and an eager acquire returns 3,
 * with one line saying why.
 *
 * An allocation that waits for room (the vmm evictor, when the card is full:
 * mechanisms/room_wait.c) is a wish for the GPU like a call at the gate: the comm thread reports
 * the working set that includes it, then asks. Holding the GPU already, it gives it back and
 * asks again in one request (`release` with `requeue`): the daemon makes room only before a
 * grant. The wait fails, as the driver would have failed the allocation (a framework then frees
 * its cache and tries again), at the daemon's first refusal, with its words; where no daemon
 * makes room (one without the memory feature, mode off, the fail policy applied while the daemon
 * is away); when the GPU cannot change hands (a graph capture is open); and after three grants
 * in a row whose restore found no room (memory the daemon does not see takes it).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "client.h"

#define ROOM_RETRY_FIRST 1.0
#define ROOM_RETRY_MOST 16.0

void kiwi_room_on_refused(struct kiwi_client *c, const struct kiwi_message *refusal)
{
    char why[sizeof c->stats.room_last_refusal];
    bool said = refusal->has & KIWI_HAS_MESSAGE;
    snprintf(why, sizeof why, "%s", said ? refusal->error.message : "the scheduler gave no reason");
    pthread_mutex_lock(&kiwi_lock);
    enum kiwi_hold_state hold = c->stats.hold;
    /* In RELEASING it crossed our cancel, whose answer ends the wait as ever. */
    bool ended = (hold == KIWI_HOLD_ASKING || hold == KIWI_HOLD_WAITING) &&
                 kiwi_hold_move(c, KIWI_HOLD_IDLE);
    bool first = false;
    double backoff = 0;
    if (ended) {
        double now = kiwi_now();
        c->stats.queue_position = 0;
        first = c->room_refused_since == 0;
        if (first)
            c->room_refused_since = now;
        backoff = c->room_backoff > 0 ? c->room_backoff : ROOM_RETRY_FIRST;
        c->room_backoff = backoff * 2 < ROOM_RETRY_MOST ? backoff * 2 : ROOM_RETRY_MOST;
        if (c->retry_after < now + backoff)
            c->retry_after = now + backoff;
        c->stats.room_refusals++;
        kiwi_room_fail(why); /* allocations waiting for room fail now, with its words */
        snprintf(c->stats.room_last_refusal, sizeof why, "%s", why);
        pthread_cond_broadcast(&kiwi_changed);
    }
    pthread_mutex_unlock(&kiwi_lock);
    if (!ended) {
        kiwi_log("a refusal for room crossed a release of ours: %s", why);
        return;
    }
    c->seq.ask = 0; /* an answer to it still on its way changes nothing now */
    if (!first) {
        kiwi_log("refused again for want of room; asking again in %.0f s: %s", backoff, why);
        return;
    }
    char until[96] = "";
    if (kiwi_cfg.room_timeout > 0)
        snprintf(until, sizeof until, ", for %.0f s at most (KIWI_ROOM_TIMEOUT)",
                 kiwi_cfg.room_timeout);
    kiwi_warn("the scheduler cannot make room on the GPU for this process now: %s. GPU work "
              "waits and asks again in %.0f s, then at most every %.0f s%s", why, backoff,
              ROOM_RETRY_MOST, until);
}

void kiwi_room_granted(struct kiwi_client *c)
{
    c->room_restores_failed = 0;
    c->room_backoff = 0;
    c->room_refused_since = 0;
    c->stats.room_last_refusal[0] = '\0';
}

void kiwi_room_cell_end(struct kiwi_client *c)
{
    c->room_refused_since = 0;
}

/* Under kiwi_lock: calls wait for the GPU, and the last ask was refused for room. */
static bool refused_now(struct kiwi_client *c)
{
    enum kiwi_hold_state hold = c->stats.hold;
    return c->room_refused_since > 0 &&
           (hold == KIWI_HOLD_IDLE || hold == KIWI_HOLD_ASKING) &&
           (kiwi_gate_waiters() > 0 || c->acquire_wanted);
}

void kiwi_room_act(struct kiwi_client *c)
{
    pthread_mutex_lock(&kiwi_lock);
    double since = c->room_refused_since;
    /* Only between two asks: a wait the daemon has queued again may be about to be served. */
    bool give_up = kiwi_cfg.room_timeout > 0 && refused_now(c) &&
                   c->stats.hold == KIWI_HOLD_IDLE &&
                   kiwi_now() - since >= kiwi_cfg.room_timeout;
    char why[sizeof c->stats.room_last_refusal];
    if (give_up) {
        snprintf(why, sizeof why, "%s", c->stats.room_last_refusal);
        c->room_refused_since = 0;
        c->acquire_wanted = false;
        kiwi_gate_give_up();
    }
    pthread_mutex_unlock(&kiwi_lock);
    if (give_up)
        kiwi_warn("giving up on the GPU: the scheduler could not make room for this process in "
                  "%.0f s (KIWI_ROOM_TIMEOUT): %s. The GPU calls waiting fail with "
                  "CUDA_ERROR_OUT_OF_MEMORY", kiwi_cfg.room_timeout, why);
}

void kiwi_room_stats(struct kiwi_client *c, struct kiwi_stats *out)
{
    out->room_refused[0] = '\0';
    out->room_retry_in = 0;
    if (!refused_now(c))
        return;
    snprintf(out->room_refused, sizeof out->room_refused, "%s", out->room_last_refusal);
    double left = c->retry_after - kiwi_now();
    out->room_retry_in = left > 0 ? left : 0;
}

/* Under kiwi_lock: why no daemon makes the room an allocation waits for, or NULL. */
static const char *nobody_makes_room(struct kiwi_client *c)
{
    if (c->stats.failed_open || kiwi_gate_refusing())
        return "the scheduler is unreachable, and nobody else makes room (KIWI_FAIL_POLICY)";
    if (!kiwi_session_ready(c))
        return NULL; /* not yet known: connecting (a restarting daemon is waited for) */
    if (!kiwi_session_memory(c))
        return "the scheduler makes no room (it predates the memory feature)";
    if (strcmp(c->stats.mode, "off") == 0)
        return "the scheduler's mode is off: it grants at once and makes no room";
    return NULL;
}

bool kiwi_room_wanted(struct kiwi_client *c)
{
    pthread_mutex_lock(&kiwi_lock);
    bool waiting = kiwi_room_waiters() > 0;
    const char *why = waiting ? nobody_makes_room(c) : NULL;
    if (why)
        kiwi_room_fail(why);
    pthread_mutex_unlock(&kiwi_lock);
    return waiting && !why;
}

void kiwi_room_requeue(struct kiwi_client *c)
{
    pthread_mutex_lock(&kiwi_lock);
    bool holding = kiwi_room_waiters() > 0 && c->stats.hold == KIWI_HOLD_HOLDING;
    pthread_mutex_unlock(&kiwi_lock);
    const char *why = NULL;
    if (!holding || kiwi_release_for_room(c, &why)) {
        pthread_mutex_lock(&kiwi_lock);
        c->stats.room_requeues += holding;
        pthread_mutex_unlock(&kiwi_lock);
        return;
    }
    pthread_mutex_lock(&kiwi_lock);
    kiwi_room_fail(why);
    pthread_mutex_unlock(&kiwi_lock);
}

void kiwi_room_restore_failed(struct kiwi_client *c)
{
    pthread_mutex_lock(&kiwi_lock);
    if (kiwi_room_waiters() > 0 && ++c->room_restores_failed >= 3) {
        c->room_restores_failed = 0;
        kiwi_room_fail("three grants in a row found no room on the card for it: memory the "
                       "scheduler does not see takes the room");
    }
    pthread_mutex_unlock(&kiwi_lock);
}
