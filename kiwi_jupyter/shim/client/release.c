/* The release sequence, whatever asked for it:
 *   1. close the gate (no new work), and wait for the calls already inside to return;
 *   2. synchronize every context the process used;
 *   3. when the daemon said the next holder needs the room, prefetch the working set to host
 *      memory on the pager's streams, and wait for that;
 *   4. send release.
 * A release the process chose itself (cell end, idle) does not know whether the next holder
 * needs the room, so steps 3 and 4 become a question: it sends `release` with `evict_first`.
 * The daemon either answers `released` (no room needed: the GPU has changed hands, nothing
 * moves) or keeps the hold and answers with a `drop` carrying the request's seq; then the
 * working set goes to host memory and a plain `release` follows, and only that one hands the
 * GPU over. The next holder's restore never races this process's eviction. (A daemon that
 * predates evict_first ignores it and answers `released` with `evict: true`: the eviction then
 * runs right after, as the only thing left to do.)
 *
 * The hold is DROPPING from the first step to the release (a drop read, or the sequence begun
 * of the process's own accord), back to HOLDING when it cannot go ahead now, and RELEASING
 * while a release with evict_first awaits its answer. What decides (the moves, the lines sent)
 * is kept apart from what carries it out (the gate, the pager): kiwi_release_finish and
 * kiwi_release_ask_evict_first are the decisions, which the conformance entry points call
 * alone; dispatch.c reads a drop, and kiwi_release_carry_out runs the sequence it asks for.
 *
 * Under the checkpoint evictor (mechanisms/pager.c) the sequence is the same with nothing to
 * move: the daemon locks and checkpoints the process from outside after the release, when the
 * room is needed, and restores it before the next grant. The comm thread then makes no CUDA call of
 * its own on the way out (step 2 included): the process may be locked at any moment from then
 * on (a revocation), and a call made after the lock would block until the next grant, which
 * this very thread must ask for. The lock itself waits for the work still queued.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "client.h"


void kiwi_release_evict_now(struct kiwi_client *c)
{
    if (kiwi_pager_evictor()->moved_from_outside)
        return; /* the daemon moves this process, from outside */
    if (kiwi_way_out_busy())
        return; /* the way out under way answers for this one too */
    /* With the memory feature the hold has ended already (an `evict` while idle, a release
     * with `evicting`): the way out runs on a thread of its own (way_out.c), and the daemon
     * hears it as it goes (residency.c). */
    bool movable = kiwi_pager_movable();
    if (movable && kiwi_session_memory(c) && kiwi_way_out_start(c))
        return;
    struct kiwi_transfer moved = {.progress = kiwi_session_memory(c) ? kiwi_residency_progress
                                                                     : NULL,
                                  .progress_arg = c};
    if (movable) {
        kiwi_pool_trim(); /* what the pools keep for reuse need not move: it goes back instead */
        kiwi_pager_move(KIWI_PAGE_OUT, &moved);
        pthread_mutex_lock(&kiwi_lock);
        c->stats.evicted = true;
        c->stats.evictions++;
        c->stats.bytes_evicted += moved.bytes;
        c->stats.bytes_skipped += moved.skipped;
        c->stats.bytes_discarded += moved.discarded;
        c->stats.seconds_evicting += moved.seconds;
        pthread_mutex_unlock(&kiwi_lock);
    }
    kiwi_residency_evicted(c, &moved, NULL);
}

static void keep_holding(struct kiwi_client *c)
{
    pthread_mutex_lock(&kiwi_lock);
    /* A holder paused for another's turn waits for its resume. */
    if (c->stats.hold == KIWI_HOLD_DROPPING && kiwi_hold_move(c, KIWI_HOLD_HOLDING) &&
        !c->stats.paused)
        kiwi_gate_open();
    pthread_cond_broadcast(&kiwi_changed);
    pthread_mutex_unlock(&kiwi_lock);
}

/* The hold ends: the GPU is, or is about to be, the daemon's to hand over. */
static void released(struct kiwi_client *c)
{
    pthread_mutex_lock(&kiwi_lock);
    if (kiwi_hold_move(c, KIWI_HOLD_IDLE)) {
        c->stats.paused = false;
        c->stats.releases++;
    }
    pthread_cond_broadcast(&kiwi_changed);
    pthread_mutex_unlock(&kiwi_lock);
}

enum quiesced { QUIESCED, CAPTURING, NOT_SYNCHRONIZED };

/* Steps 1 and 2 of the release sequence: no new work, none in flight, none queued. When it
 * cannot be done now the process still holds the GPU, gate open: a graph capture is open
 * (synchronizing would invalidate it; the caller defers), or synchronizing failed, so work may
 * still be running and the GPU is not released (the daemon revokes it after its grace). */
static enum quiesced quiesce(struct kiwi_client *c, const char *why, bool evict)
{
    if (kiwi_capture_open() > 0) {
        keep_holding(c); /* a drop read: held on, gate open, until the capture is over */
        return CAPTURING;
    }
    kiwi_log("releasing the GPU (%s%s)", why, evict ? ", evicting" : "");
    pthread_mutex_lock(&kiwi_lock);
    if (c->stats.hold == KIWI_HOLD_HOLDING)
        kiwi_hold_move(c, KIWI_HOLD_DROPPING);
    kiwi_gate_close();
    pthread_mutex_unlock(&kiwi_lock);
    kiwi_gate_drain();
    if (kiwi_pager_evictor()->moved_from_outside)
        return QUIESCED; /* no CUDA call of ours: the daemon's lock waits for queued work */
    if (!kiwi_capture_hold()) {
        keep_holding(c); /* a capture began while the gate closed */
        return CAPTURING;
    }
    bool synchronized = kiwi_pager_synchronize();
    kiwi_capture_unhold();
    if (!synchronized) {
        kiwi_warn("not releasing the GPU (%s): work may still be running on it", why);
        keep_holding(c);
        return NOT_SYNCHRONIZED;
    }
    kiwi_pager_free_deferred();
    return QUIESCED;
}

static void defer(const char *why)
{
    kiwi_log("release (%s) deferred: %d graph capture(s) open", why, kiwi_capture_open());
}

/* Steps 3 and 4, once it is known whether the room is needed. To a daemon with the memory
 * feature the release goes first, saying the memory is on its way out (`evicting`): the hold
 * ends now, compute being quiesced, and the next holder's way in may overlap this way out,
 * which the progress reports and `evicted` follow. */
bool kiwi_release_finish_evicting(struct kiwi_client *c)
{
    if (!kiwi_session_memory(c) || kiwi_pager_evictor()->moved_from_outside)
        return false;
    kiwi_residency_before_release(c);
    released(c);
    kiwi_session_request(c, KIWI_OP_RELEASE, "\"" KIWI_FIELD_EVICTING "\":true");
    c->seq.release = 0; /* its answer asks for nothing more: the way out follows here */
    return true;
}

static void finish_release(struct kiwi_client *c, bool evict)
{
    if (evict && kiwi_release_finish_evicting(c)) {
        kiwi_release_evict_now(c);
        return;
    }
    if (evict)
        kiwi_release_evict_now(c);
    kiwi_release_finish(c);
}

void kiwi_release_finish(struct kiwi_client *c)
{
    /* Idle before the release leaves: once the daemon has it, the next holder may be running,
     * and nothing here may still say this process holds the GPU. */
    kiwi_residency_before_release(c);
    released(c);
    c->seq.release = kiwi_session_request(c, KIWI_OP_RELEASE, "");
}

void kiwi_release_ask_evict_first(struct kiwi_client *c)
{
    /* RELEASING, not holding: if the daemon hands over at once, the next holder may be
     * running before the answer is read. Its answer (evict first or not) is decided from the
     * figures the daemon has. */
    kiwi_residency_before_release(c);
    pthread_mutex_lock(&kiwi_lock);
    kiwi_hold_move(c, KIWI_HOLD_RELEASING);
    pthread_mutex_unlock(&kiwi_lock);
    c->seq.yield = kiwi_session_request(c, KIWI_OP_RELEASE, "\"" KIWI_FIELD_EVICT_FIRST "\":true");
}

void kiwi_release_dropped(struct kiwi_client *c, bool evict, bool quiesced)
{
    c->dropped.evict = evict;
    c->dropped.quiesced = quiesced;
}

void kiwi_release_carry_out(struct kiwi_client *c)
{
    pthread_mutex_lock(&kiwi_lock);
    bool dropping = c->stats.hold == KIWI_HOLD_DROPPING;
    pthread_mutex_unlock(&kiwi_lock);
    if (!dropping)
        return;
    if (c->dropped.quiesced)
        finish_release(c, c->dropped.evict);
    else
        kiwi_release_sequence(c, c->dropped.evict, "drop");
}

/* The daemon asked for the GPU back and said whether the next holder needs the room. */
void kiwi_release_sequence(struct kiwi_client *c, bool evict, const char *why)
{
    enum quiesced quiesced = quiesce(c, why, evict);
    if (quiesced == QUIESCED) {
        finish_release(c, evict);
    } else if (quiesced == CAPTURING) {
        c->deferred.drop = true; /* act_deferred looks again, even if the capture is over now */
        c->deferred.evict = evict;
        defer(why);
    }
}

bool kiwi_release_for_room(struct kiwi_client *c, const char **why)
{
    enum quiesced quiesced = quiesce(c, "room for an allocation", false);
    if (quiesced == QUIESCED) {
        /* The allocations waiting are the wish: no eager one of its own, should the daemon
         * refuse the room. */
        pthread_mutex_lock(&kiwi_lock);
        bool eager = c->acquire_wanted;
        pthread_mutex_unlock(&kiwi_lock);
        kiwi_ask_requeue(c);
        pthread_mutex_lock(&kiwi_lock);
        c->acquire_wanted = eager;
        pthread_mutex_unlock(&kiwi_lock);
        return true;
    }
    *why = quiesced == CAPTURING
               ? "a graph capture is open: the GPU cannot change hands to make room"
               : "synchronizing the GPU failed: it cannot change hands to make room";
    return false;
}

/* The process gives the GPU back of its own accord (cell end, idle): ask the daemon whether
 * to evict first. The answer finishes the sequence (on_yield_answer). With nothing evictable
 * there is nothing to wait for, and a plain release saves the daemon's round trip. */
void kiwi_release_yield(struct kiwi_client *c, const char *why)
{
    enum quiesced quiesced = quiesce(c, why, false);
    if (quiesced == CAPTURING) {
        c->deferred.yield = true; /* act_deferred looks again, even if the capture is over now */
        defer(why);
    }
    if (quiesced != QUIESCED)
        return;
    if (!kiwi_pager_movable()) {
        finish_release(c, false);
        return;
    }
    kiwi_release_ask_evict_first(c);
}

/* The answer to a release sent with evict_first: `released` (handed over; nothing to move)
 * or a `drop` with our seq (the hold is kept, DROPPING, until the working set is out: carried
 * out by kiwi_release_carry_out). An error that leaves the connection open still must not
 * leave the hold half released: release plainly. */
void kiwi_release_on_yield_answer(struct kiwi_client *c, const struct kiwi_message *answer)
{
    c->seq.yield = 0;
    if (answer->op == KIWI_DAEMON_DROP) {
        pthread_mutex_lock(&kiwi_lock);
        kiwi_hold_move(c, KIWI_HOLD_DROPPING);
        pthread_mutex_unlock(&kiwi_lock);
        kiwi_release_dropped(c, answer->drop.evict, true);
        return;
    }
    if (answer->op != KIWI_DAEMON_RELEASED) {
        kiwi_warn("the scheduler refused a release: %s %s", answer->op_name,
                  answer->op == KIWI_DAEMON_ERROR ? answer->error.message : "");
        finish_release(c, false);
        return;
    }
    released(c);
    if (answer->released.evict)
        kiwi_release_evict_now(c); /* a daemon that does not know evict_first handed over already */
}

/* A release deferred for graph captures, once they are over; a drop wins over a release of
 * the process's own accord, as it carries the daemon's word on eviction. */
void kiwi_release_act_deferred(struct kiwi_client *c)
{
    if ((!c->deferred.drop && !c->deferred.yield) || kiwi_capture_open() > 0)
        return;
    pthread_mutex_lock(&kiwi_lock);
    bool holding = c->stats.hold == KIWI_HOLD_HOLDING;
    pthread_mutex_unlock(&kiwi_lock);
    bool drop = c->deferred.drop, evict = c->deferred.evict;
    c->deferred.drop = c->deferred.yield = false;
    if (!holding)
        return; /* revoked meanwhile: nothing left to release */
    if (drop)
        kiwi_release_sequence(c, evict, "drop, after graph capture");
    else
        kiwi_release_yield(c, "cell end, after graph capture");
}
