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

bool kiwi_ask_wanted(struct kiwi_client *c)
{
    return (kiwi_gate_waiters() > 0 || kiwi_room_waiters() > 0 || c->acquire_wanted) &&
           !c->ask_refused;
}

void kiwi_ask_if_wanted(struct kiwi_client *c)
{
    pthread_mutex_lock(&kiwi_lock);
    bool backing_off = kiwi_now() < c->retry_after; /* a restore failed just now */
    bool ask = kiwi_ask_wanted(c) && !backing_off && c->stats.hold == KIWI_HOLD_IDLE &&
               kiwi_session_ready(c) && kiwi_hold_move(c, KIWI_HOLD_ASKING);
    pthread_mutex_unlock(&kiwi_lock);
    if (ask)
        c->seq.ask = kiwi_session_request(c, KIWI_OP_ACQUIRE, "");
}

void kiwi_ask_cancel(struct kiwi_client *c)
{
    pthread_mutex_lock(&kiwi_lock);
    enum kiwi_hold_state hold = c->stats.hold;
    bool asked = (hold == KIWI_HOLD_ASKING || hold == KIWI_HOLD_WAITING) &&
                 kiwi_hold_move(c, KIWI_HOLD_RELEASING);
    if (asked)
        c->stats.queue_position = 0;
    pthread_mutex_unlock(&kiwi_lock);
    if (!asked)
        return;
    c->seq.ask = 0;
    /* Also the last plain release: its `released` may ask for the room (dispatch.c). */
    c->seq.cancel = c->seq.release = kiwi_session_request(c, KIWI_OP_RELEASE, "");
}

bool kiwi_ask_cancel_answered(struct kiwi_client *c, int64_t seq)
{
    if (!c->seq.cancel || seq != (int64_t)c->seq.cancel)
        return false;
    c->seq.cancel = 0;
    pthread_mutex_lock(&kiwi_lock);
    kiwi_hold_move(c, KIWI_HOLD_IDLE); /* released, or an error: either way nothing is asked */
    pthread_cond_broadcast(&kiwi_changed);
    pthread_mutex_unlock(&kiwi_lock);
    return true;
}

bool kiwi_ask_answered(struct kiwi_client *c, enum kiwi_daemon_op op, int64_t seq)
{
    if (!c->seq.ask || seq != (int64_t)c->seq.ask)
        return false;
    c->seq.ask = 0;
    bool released = op == KIWI_DAEMON_RELEASED, refused = op == KIWI_DAEMON_ERROR;
    if (!released && !refused)
        return true; /* grant or waiting: dispatch.c reads them */
    pthread_mutex_lock(&kiwi_lock);
    if (c->stats.hold == KIWI_HOLD_ASKING)
        kiwi_hold_move(c, KIWI_HOLD_IDLE);
    if (refused) {
        /* Not asked again for the same wish: the next cell, eager acquire or connection asks
         * again. The error itself is said by dispatch.c. */
        c->acquire_wanted = false;
        c->ask_refused = true;
    }
    pthread_cond_broadcast(&kiwi_changed);
    pthread_mutex_unlock(&kiwi_lock);
    if (released)
        kiwi_ask_if_wanted(c); /* a daemon that predates requeue only released: ask plainly */
    return true;
}

void kiwi_ask_requeue(struct kiwi_client *c)
{
    pthread_mutex_lock(&kiwi_lock);
    enum kiwi_hold_state hold = c->stats.hold;
    c->acquire_wanted = true;
    c->ask_refused = false;
    bool requeue = (hold == KIWI_HOLD_HOLDING || hold == KIWI_HOLD_DROPPING) &&
                   kiwi_session_ready(c) && kiwi_hold_move(c, KIWI_HOLD_ASKING);
    if (requeue) {
        c->stats.paused = false;
        c->stats.releases++;
        pthread_cond_broadcast(&kiwi_changed);
    }
    pthread_mutex_unlock(&kiwi_lock);
    if (requeue)
        c->seq.ask = kiwi_session_request(c, KIWI_OP_RELEASE, "\"" KIWI_FIELD_REQUEUE "\":true");
    else
        kiwi_ask_if_wanted(c);
}

void kiwi_ask_after_lost(struct kiwi_client *c)
{
    c->seq.ask = c->seq.cancel = 0;
}
