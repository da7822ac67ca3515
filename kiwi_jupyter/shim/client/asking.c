/* Asking for the GPU, and taking a request back: the moves of the hold before a grant
 *
 *   IDLE --acquire--> ASKING --waiting--> WAITING --grant (dispatch.c)--> HOLDING
 *   ASKING, WAITING --cancel: release--> RELEASING --its answer--> IDLE (and ask again if wanted)
 *
 * A cancel waits for its answer. The daemon may have sent a grant before it read the release;
 * read in RELEASING that grant is known to have crossed the cancel, and is ignored. Were the
 * hold idle at once, an acquire sent meanwhile (a gated call still waits) would take the stale
 * grant as its own answer, and the process would run on a GPU the daemon has already taken
 * back from it.
 *
 * Decisions only: the lines go out through session.c. The comm thread calls these as it acts on
 * the wishes (comm.c) and reads lines (dispatch.c); the conformance entry points call them too.
 */
#define _GNU_SOURCE
#include <string.h>

#include "client.h"

unsigned kiwi_ask_seq;    /* see client.h */
unsigned kiwi_cancel_seq;

bool kiwi_ask_wanted(void)
{
    return (kiwi_gate_waiters() > 0 || kiwi_room_waiters() > 0 || kiwi_comm.acquire_wanted) &&
           !kiwi_comm.ask_refused;
}

void kiwi_ask_if_wanted(void)
{
    pthread_mutex_lock(&kiwi_lock);
    bool backing_off = kiwi_now() < kiwi_comm.retry_after; /* a restore failed just now */
    bool ask = kiwi_ask_wanted() && !backing_off && kiwi_comm.stats.hold == KIWI_HOLD_IDLE &&
               kiwi_session_ready() && kiwi_hold_move(KIWI_HOLD_ASKING);
    pthread_mutex_unlock(&kiwi_lock);
    if (ask)
        kiwi_ask_seq = kiwi_session_request(KIWI_OP_ACQUIRE, "");
}

void kiwi_ask_cancel(void)
{
    pthread_mutex_lock(&kiwi_lock);
    enum kiwi_hold_state hold = kiwi_comm.stats.hold;
    bool asked = (hold == KIWI_HOLD_ASKING || hold == KIWI_HOLD_WAITING) &&
                 kiwi_hold_move(KIWI_HOLD_RELEASING);
    if (asked)
        kiwi_comm.stats.queue_position = 0;
    pthread_mutex_unlock(&kiwi_lock);
    if (!asked)
        return;
    kiwi_ask_seq = 0;
    /* Also the last plain release: its `released` may ask for the room (dispatch.c). */
    kiwi_cancel_seq = kiwi_release_seq = kiwi_session_request(KIWI_OP_RELEASE, "");
}

bool kiwi_ask_cancel_answered(int64_t seq)
{
    if (!kiwi_cancel_seq || seq != (int64_t)kiwi_cancel_seq)
        return false;
    kiwi_cancel_seq = 0;
    pthread_mutex_lock(&kiwi_lock);
    kiwi_hold_move(KIWI_HOLD_IDLE); /* released, or an error: either way nothing is asked */
    pthread_cond_broadcast(&kiwi_changed);
    pthread_mutex_unlock(&kiwi_lock);
    return true;
}

bool kiwi_ask_answered(enum kiwi_daemon_op op, int64_t seq)
{
    if (!kiwi_ask_seq || seq != (int64_t)kiwi_ask_seq)
        return false;
    kiwi_ask_seq = 0;
    bool released = op == KIWI_DAEMON_RELEASED, refused = op == KIWI_DAEMON_ERROR;
    if (!released && !refused)
        return true; /* grant or waiting: dispatch.c reads them */
    pthread_mutex_lock(&kiwi_lock);
    if (kiwi_comm.stats.hold == KIWI_HOLD_ASKING)
        kiwi_hold_move(KIWI_HOLD_IDLE);
    if (refused) {
        /* Not asked again for the same wish: the next cell, eager acquire or connection asks
         * again. The error itself is said by dispatch.c. */
        kiwi_comm.acquire_wanted = false;
        kiwi_comm.ask_refused = true;
    }
    pthread_cond_broadcast(&kiwi_changed);
    pthread_mutex_unlock(&kiwi_lock);
    if (released)
        kiwi_ask_if_wanted(); /* a daemon that predates requeue only released: ask plainly */
    return true;
}

void kiwi_ask_requeue(void)
{
    pthread_mutex_lock(&kiwi_lock);
    enum kiwi_hold_state hold = kiwi_comm.stats.hold;
    kiwi_comm.acquire_wanted = true;
    kiwi_comm.ask_refused = false;
    bool requeue = (hold == KIWI_HOLD_HOLDING || hold == KIWI_HOLD_DROPPING) &&
                   kiwi_session_ready() && kiwi_hold_move(KIWI_HOLD_ASKING);
    if (requeue) {
        kiwi_comm.stats.paused = false;
        kiwi_comm.stats.releases++;
        pthread_cond_broadcast(&kiwi_changed);
    }
    pthread_mutex_unlock(&kiwi_lock);
    if (requeue)
        kiwi_ask_seq = kiwi_session_request(KIWI_OP_RELEASE, "\"" KIWI_FIELD_REQUEUE "\":true");
    else
        kiwi_ask_if_wanted();
}

void kiwi_ask_after_lost(void)
{
    kiwi_ask_seq = kiwi_cancel_seq = 0;
}
